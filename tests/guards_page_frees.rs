//! `memwarden run --guard page`: frees the page guard must judge without reading anything
//! before the block (a freed block's pages are inaccessible, and one out of quarantine has
//! none): a double free in quarantine, a double free long after (out of quarantine), a free
//! inside a block, a realloc and a `malloc_usable_size` of a freed block. Each is reported
//! with its stack and the program runs on; none may crash it.

mod common;
use common::guards::{run_guarded, At, Expected, GuardRun};
use common::*;

/// One program, one planted bug per argv[1]. The block is made in make_block and freed in
/// release, so the stacks of the allocation and the first free are known by name.
const FREE_BUGS: &str = r#"
#include <malloc.h>
NOINLINE char *make_block(size_t n) { return malloc(n); }
NOINLINE void release(char *p) { free(p); }
NOINLINE void release_again(char *p) { free(p); }
NOINLINE void *grow(char *p) { return realloc(p, 256); }
NOINLINE void churn(void) {
    /* More freed bytes than a 4096-byte quarantine holds: the first block leaves it. */
    for (int i = 0; i < 64; i++) free(malloc(5000));
}
int main(int argc, char **argv) {
    if (argc != 2) return 2;
    char *p = make_block(100);
    if (!strcmp(argv[1], "double")) { release(p); release_again(p); }
    else if (!strcmp(argv[1], "late")) { release(p); churn(); release_again(p); }
    else if (!strcmp(argv[1], "middle")) { release_again(p + 8); release(p); }
    else if (!strcmp(argv[1], "realloc")) {
        release(p);
        if (malloc_usable_size(p) != 0) say("usable size of a freed block\n");
        if (grow(p) != NULL) say("realloc of a freed block succeeded\n");
    }
    else return 2;
    say("continued after the bug\n");
    return 0;
}
"#;

/// Runs the program with `bug` under page mode and `options`: it must run on to its end.
fn run_bug(bug: &str, options: &[&str]) -> GuardRun {
    let scratch = Scratch::new(&format!("guard_page_free_{bug}"));
    let prog = scratch.compile("free_bugs", FREE_BUGS);
    let mut all = vec!["--guard", "page"];
    all.extend_from_slice(options);
    let run = run_guarded(&scratch, &all, &[prog.arg(), bug]);
    assert_eq!(
        (run.status(), run.stdout()),
        (0, "continued after the bug\n".to_owned()),
        "the program runs on after the bug; stderr:\n{}",
        run.stderr()
    );
    run
}

#[test]
fn a_double_free_in_quarantine_names_both_frees() {
    run_bug("double", &[]).assert_one_error(
        "page",
        &Expected::double_free(100, "make_block", "release", "release_again"),
    );
}

#[test]
fn a_double_free_after_the_block_left_quarantine_is_an_invalid_free_not_a_crash() {
    // The block's pages are given back when it leaves the quarantine, but its addresses
    // stay the guard's: the second free is known as no live block, without a read.
    let run = run_bug("late", &["--quarantine", "4096"]);
    run.assert_one_error("page", &Expected::invalid_free("release_again"));
    assert!(
        run.stderr().contains(
            "is in no block memwarden holds (an address it never returned, or a block freed \
             and out of quarantine)"
        ),
        "{}",
        run.stderr()
    );
}

#[test]
fn the_late_double_free_is_found_with_the_guard_page_below_too() {
    let run = run_bug("late", &["--quarantine", "4096", "--guard-below"]);
    let process = run.report.program_process();
    let kinds: Vec<&str> = process.errors.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["invalid-free"], "{}", run.stderr());
}

#[test]
fn a_free_inside_a_block_is_an_invalid_free_with_the_block() {
    // Said as AddressSanitizer says it: where in which block, and where that was made.
    let run = run_bug("middle", &[]);
    run.assert_one_error(
        "page",
        &Expected {
            kind: "invalid-free",
            block_size: 100,
            offset: 8,
            stack: At::Function("release_again"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unknown,
        },
    );
    assert!(
        run.stderr()
            .contains("is located 8 bytes inside the 100-byte block allocated at"),
        "{}",
        run.stderr()
    );
}

#[test]
fn a_realloc_of_a_freed_block_is_a_double_free_and_fails() {
    // malloc_usable_size says 0 and realloc returns NULL (the program says otherwise on
    // its standard output, which the run then fails to match).
    run_bug("realloc", &[]).assert_one_error(
        "page",
        &Expected::double_free(100, "make_block", "release", "grow"),
    );
}
