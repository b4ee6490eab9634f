//! `--fill-alloc` and `--fill-free`: new blocks and freed blocks hold the chosen byte, so
//! reads of uninitialised or freed memory show a recognisable pattern; `calloc` still
//! gives zeros.

mod common;
use common::guards::run_guarded;
use common::*;

/// GIVEN a program that prints what a fresh malloc'd block, a fresh calloc'd block and a
/// freed block hold: the byte found in all 100 bytes, or "mixed".
const FILLS: &str = r#"
#include <stdio.h>
NOINLINE char *make_block(size_t n) { return malloc(n); }
NOINLINE void release(char *p) { free(p); }
NOINLINE void describe(const char *what, const volatile unsigned char *p, size_t n) {
    char line[64];
    int same = 1;
    for (size_t i = 1; i < n; i++) same &= p[i] == p[0];
    if (same) snprintf(line, sizeof line, "%s 0x%02x\n", what, p[0]);
    else snprintf(line, sizeof line, "%s mixed\n", what);
    say(line);
}
int main(void) {
    char *fresh = make_block(100);
    describe("malloc", (unsigned char *)fresh, 100);
    char *zeroed = calloc(100, 1);
    describe("calloc", (unsigned char *)zeroed, 100);
    memset(fresh, 1, 100);
    release(fresh);
    describe("freed", (unsigned char *)fresh, 100); /* a dangling read, on purpose */
    free(zeroed);
    return 0;
}
"#;

#[test]
fn new_blocks_hold_the_alloc_pattern_and_freed_ones_the_free_pattern() {
    let scratch = Scratch::new("guard_fill");
    let prog = scratch.compile("fills", FILLS);

    let run = run_guarded(
        &scratch,
        &[
            "--guard",
            "header",
            "--fill-alloc",
            "0xab",
            "--fill-free",
            "0xdd",
        ],
        &[prog.arg()],
    );

    assert_eq!(
        (run.status(), run.stdout()),
        (0, "malloc 0xab\ncalloc 0x00\nfreed 0xdd\n".to_owned()),
        "stderr:\n{}",
        run.stderr()
    );
    // Reading a freed block is not an error the header guard can see; nothing was written.
    run.assert_no_error("header");
}

#[test]
fn other_patterns_are_taken_in_decimal() {
    let scratch = Scratch::new("guard_fill_decimal");
    let prog = scratch.compile("fills", FILLS);

    let run = run_guarded(
        &scratch,
        &["--guard", "header", "--fill-alloc", "7", "--fill-free", "0"],
        &[prog.arg()],
    );

    assert_eq!(
        (run.status(), run.stdout()),
        (0, "malloc 0x07\ncalloc 0x00\nfreed 0x00\n".to_owned()),
        "stderr:\n{}",
        run.stderr()
    );
    run.assert_no_error("header");
}
