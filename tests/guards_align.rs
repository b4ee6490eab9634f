//! `memwarden run --align N`, and alignment arguments glibc refuses: every pointer the
//! program gets is N-aligned (NumPy's arrays too), and a refused alignment keeps glibc's
//! return value and is reported as an `invalid-alignment` error with its stack.

mod common;
use common::guards::{run_guarded, At, Expected};
use common::*;

/// GIVEN a program that asks for blocks in every way and checks each pointer's alignment
/// against argv[1]; it exits 1 if any is misaligned.
const ALIGNED: &str = r#"
#include <stdint.h>
#include <stdio.h>
static int misaligned;
static uintptr_t want;
NOINLINE static void check(void *p) {
    if (p == NULL || (uintptr_t)p % want != 0) misaligned++;
    keep(p);
}
int main(int argc, char **argv) {
    if (argc != 2) return 2;
    want = strtoul(argv[1], NULL, 10);
    for (size_t n = 1; n <= 300; n += 7) {
        void *m = malloc(n); check(m);
        void *c = calloc(n, 3); check(c);
        void *r = realloc(malloc(n), n * 5); check(r);
        void *a = aligned_alloc(16, n * 16); check(a);
        void *pm = NULL;
        if (posix_memalign(&pm, 32, n) != 0) misaligned++;
        check(pm);
        free(m); free(c); free(r); free(a); free(pm);
    }
    void *big = malloc(1 << 20); check(big);
    void *grown = realloc(malloc(10), 300000); check(grown);
    free(big); free(grown);
    char line[64];
    snprintf(line, sizeof line, "%d misaligned\n", misaligned);
    say(line);
    return misaligned != 0;
}
"#;

#[test]
fn align_64_makes_every_block_64_aligned_with_or_without_a_guard() {
    let scratch = Scratch::new("guard_align_c");
    let prog = scratch.compile("aligned", ALIGNED);
    // The check itself can fail: without --align, some blocks are only 16-aligned.
    let bare = run_bare(&scratch, &[prog.arg(), "64"], None);
    assert_ne!(
        bare.status.code(),
        Some(0),
        "glibc alone gives 16-aligned blocks"
    );

    for (options, mode) in [
        (&["--align", "64"][..], "none"),
        (&["--align", "64", "--guard", "header"][..], "header"),
    ] {
        let run = run_guarded(&scratch, options, &[prog.arg(), "64"]);
        assert_eq!(
            (run.status(), run.stdout()),
            (0, "0 misaligned\n".to_owned()),
            "{options:?}; stderr:\n{}",
            run.stderr()
        );
        run.assert_no_error(mode);
    }
}

#[test]
fn align_64_makes_numpy_arrays_64_aligned() {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if !python.is_file() {
        return skip_or_fail(".venv/bin/python (NumPy's virtualenv)");
    }
    let scratch = Scratch::new("guard_align_numpy");
    let script = "import numpy as np\n\
                  arrays = [np.ones(n) for n in (1, 3, 10, 100, 1000, 100000, 1000000)]\n\
                  arrays += [np.zeros((7, 9), dtype=np.int8), np.arange(1001), np.empty(33, dtype=np.float32)]\n\
                  arrays += [a.copy() for a in arrays]\n\
                  bad = [a.ctypes.data % 64 for a in arrays if a.ctypes.data % 64]\n\
                  print(len(arrays), 'arrays', len(bad), 'misaligned')\n";
    let run = run_guarded(
        &scratch,
        &["--align", "64"],
        &[python.to_str().expect("utf-8 path"), "-c", script],
    );
    assert_eq!(
        (run.status(), run.stdout()),
        (0, "20 arrays 0 misaligned\n".to_owned()),
        "stderr:\n{}",
        run.stderr()
    );
}

#[test]
fn a_refused_alignment_keeps_einval_and_is_reported() {
    let scratch = Scratch::new("guard_align_invalid");
    let prog = scratch.compile(
        "bad_alignment",
        r#"
NOINLINE int ask_badly(void **p) { return posix_memalign(p, 3, 10); }
int main(void) {
    void *p = (void *)1;
    int r = ask_badly(&p);
    if (r != EINVAL || p != (void *)1) {
        say("posix_memalign changed its answer\n");
        return 1;
    }
    say("continued after the bug\n");
    return 0;
}
"#,
    );
    let run = run_guarded(&scratch, &["--guard", "header"], &[prog.arg()]);
    assert_eq!(
        (run.status(), run.stdout()),
        (0, "continued after the bug\n".to_owned()),
        "stderr:\n{}",
        run.stderr()
    );
    run.assert_one_error(
        "header",
        &Expected {
            kind: "invalid-alignment",
            block_size: 0,
            offset: 3,
            stack: At::Function("ask_badly"),
            alloc_stack: At::Unknown,
            free_stack: At::Unknown,
        },
    );
}

/// GIVEN glibc's rules for posix_memalign: EINVAL unless the alignment is a power of two
/// multiple of sizeof(void *). The program exits 1 if any answer differs.
const MEMALIGN_RULES: &str = r#"
#include <stdint.h>
static const size_t refused[] = {0, 1, 2, 3, 31, 33, 4095, 4097, (size_t)-1};
static const size_t accepted[] = {8, 32, 4096, 4 << 20, 16 << 20};
NOINLINE int ask(size_t alignment) {
    void *p = NULL;
    int r = posix_memalign(&p, alignment, 100);
    if (r == 0) {
        if ((uintptr_t)p % alignment != 0) r = -1;
        free(p);
    }
    return r;
}
int main(void) {
    int wrong = 0;
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) wrong += ask(refused[i]) != EINVAL;
    for (size_t i = 0; i < sizeof accepted / sizeof *accepted; i++) wrong += ask(accepted[i]) != 0;
    say(wrong ? "glibc's rules broken\n" : "glibc's rules kept\n");
    return wrong != 0;
}
"#;

#[test]
fn posix_memalign_keeps_glibcs_rules_and_reports_each_refusal() {
    let scratch = Scratch::new("guard_align_rules");
    let prog = scratch.compile("memalign_rules", MEMALIGN_RULES);
    let bare = run_bare(&scratch, &[prog.arg()], None);
    assert_eq!(
        bare.stdout_text(),
        "glibc's rules kept\n",
        "the rules are glibc's"
    );

    for (options, mode) in [(&[][..], "none"), (&["--guard", "header"][..], "header")] {
        let run = run_guarded(&scratch, options, &[prog.arg()]);
        assert_eq!(
            (run.status(), run.stdout()),
            (0, "glibc's rules kept\n".to_owned()),
            "{options:?}; stderr:\n{}",
            run.stderr()
        );
        let p = run.report.program_process();
        assert_eq!(p.guard_mode, mode);
        if mode == "none" {
            assert_eq!(p.error_count, 0, "{:#?}", p.errors);
            continue;
        }
        let mut found: Vec<(String, i64)> = p
            .errors
            .iter()
            .map(|e| (e.kind.clone(), e.offset))
            .collect();
        found.sort();
        let mut expected: Vec<(String, i64)> = [0, 1, 2, 3, 31, 33, 4095, 4097, -1]
            .into_iter()
            .map(|a| ("invalid-alignment".to_owned(), a))
            .collect();
        expected.sort();
        assert_eq!(found, expected, "stderr:\n{}", run.stderr());
        assert_eq!(p.error_count, 9);
        assert!(p.errors.iter().all(|e| e.functions()[0] == Some("ask")));
    }
}
