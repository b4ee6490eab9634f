//! The `own_malloc` flag: set for a program that defines `malloc` (the loader binds every
//! call to it before the preload), and not for a program that only takes `malloc`'s
//! address, which a non-PIE build (CPython 3.11 on Debian) turns into a canonical PLT stub
//! that a lookup in the global scope returns but that defines nothing.

mod common;
use common::*;

/// GIVEN a program whose own `malloc` hands every call to glibc's, and a named function
/// holding 3 MiB through it at exit.
const OWN_MALLOC: &str = r#"
extern void *__libc_malloc(size_t);
void *malloc(size_t size) { return __libc_malloc(size); }
NOINLINE void hold(void) { keep(malloc(3 * MiB)); }
int main(void) { hold(); say("done\n"); return 0; }
"#;

/// GIVEN a program that calls `malloc` through a pointer to it, holding 3 MiB at exit from a
/// named function; built without PIE (code and link), so that taking the address makes a
/// canonical PLT stub.
const MALLOC_ADDRESS: &str = r#"
void *(*volatile allocate)(size_t);
NOINLINE void hold(void) { keep(allocate(3 * MiB)); }
int main(void) { allocate = malloc; hold(); say("done\n"); return 0; }
"#;

const SUMMARY_FLAG: &str = "own malloc: the program defines malloc";

#[test]
fn a_program_defining_malloc_is_flagged_and_its_calls_are_not_seen() {
    let scratch = Scratch::new("own_malloc");
    let prog = scratch.compile("own_malloc", OWN_MALLOC);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    assert!(p.own_malloc, "{}", p.describe());
    assert_eq!(p.live("hold"), 0, "{}", p.describe());
    assert!(run.outcome.stderr_text().contains(SUMMARY_FLAG));
}

#[test]
fn a_stub_for_mallocs_address_is_not_taken_for_the_programs_own_malloc() {
    let scratch = Scratch::new("malloc_address");
    let prog = scratch.compile_with("malloc_address", MALLOC_ADDRESS, &["-fno-pie", "-no-pie"]);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    assert!(!p.own_malloc, "{}", p.describe());
    assert_eq!(p.live("hold"), 3 * MIB, "{}", p.describe());
    assert!(!run.outcome.stderr_text().contains(SUMMARY_FLAG));
}

#[test]
fn python_is_not_flagged_for_its_plt_stub() {
    // The system's interpreter where there is one: Debian builds it without PIE, with a
    // stub for `malloc`.
    let system = std::path::PathBuf::from("/usr/bin/python3");
    let Some(python) = Some(system).filter(|p| p.is_file()).or_else(python3) else {
        return skip_or_fail("python3");
    };
    let scratch = Scratch::new("own_malloc_python");

    let run = profile(&scratch, &[python.to_str().unwrap(), "-c", "pass"]);

    assert_success(&run.outcome, "memwarden run");
    assert!(!run.report.only_process().own_malloc);
    assert!(!run.outcome.stderr_text().contains(SUMMARY_FLAG));
}
