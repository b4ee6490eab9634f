//! `memwarden run --guard header`: C programs with one planted heap bug each. The header
//! guard finds the bug at the free, at exit or at a periodic check; report.json names its
//! kind, block size, offset and stacks; the program runs on to its end.

mod common;
use common::guards::{run_guarded, At, Expected};
use common::*;

/// The functions every program below shares: the block is made in make_block and freed in
/// release, so that the stacks of the allocation and the free are known by name.
const BLOCKS: &str = r#"
NOINLINE char *make_block(size_t n) { return malloc(n); }
NOINLINE void release(char *p) { free(p); }
NOINLINE void poke(char *p, long i) { p[i] = 'x'; }
"#;

/// The marker every program prints after its bug: it ran on.
const CONTINUED: &str = "continued after the bug\n";

/// Compiles `main_body` (with [`BLOCKS`]) and runs it under `--guard header` + `options`;
/// the program must have run on to its end and exited 0.
fn run_header(name: &str, main_body: &str, options: &[&str]) -> common::guards::GuardRun {
    let scratch = Scratch::new(&format!("guard_header_{name}"));
    let source = format!("{BLOCKS}\n{main_body}");
    let prog = scratch.compile(name, &source);
    let mut all = vec!["--guard", "header"];
    all.extend_from_slice(options);
    let run = run_guarded(&scratch, &all, &[prog.arg()]);
    assert_eq!(
        (run.status(), run.stdout()),
        (0, CONTINUED.to_owned()),
        "the program runs on after the bug; stderr:\n{}",
        run.stderr()
    );
    run
}

#[test]
fn an_overflow_of_three_bytes_is_found_at_free() {
    let run = run_header(
        "overflow3",
        r#"
NOINLINE void overflow(char *p) { for (int i = 0; i < 103; i++) p[i] = 'x'; }
int main(void) {
    char *p = make_block(100);
    overflow(p);
    release(p);
    say("continued after the bug\n");
    return 0;
}
"#,
        &[],
    );
    run.assert_one_error(
        "header",
        &Expected {
            kind: "heap-buffer-overflow",
            block_size: 100,
            offset: 100,
            stack: At::Function("release"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unchecked,
        },
    );
    // The summary tells it like a sanitizer, symbolized, and counts it last.
    let stderr = run.stderr();
    for expected in [
        "ERROR: memwarden: heap-buffer-overflow on address 0x",
        "\n  at  release (mwt_overflow3.c:",
        " is located 0 bytes after the 100-byte block allocated at\n      make_block (mwt_overflow3.c:",
        "\nSUMMARY: memwarden: heap-buffer-overflow at release (mwt_overflow3.c:",
    ] {
        assert!(stderr.contains(expected), "{expected:?} in:\n{stderr}");
    }
    assert!(
        stderr.ends_with("\nmemwarden: 1 heap error found\n"),
        "{stderr}"
    );
}

#[test]
fn an_overflow_into_the_alignment_slack_is_found() {
    // 13 bytes: glibc rounds the block up, so byte 13 is slack, not another block.
    let run = run_header(
        "overflow_slack",
        r#"
int main(void) {
    char *p = make_block(13);
    poke(p, 13);
    release(p);
    say("continued after the bug\n");
    return 0;
}
"#,
        &[],
    );
    run.assert_one_error(
        "header",
        &Expected {
            kind: "heap-buffer-overflow",
            block_size: 13,
            offset: 13,
            stack: At::Function("release"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unchecked,
        },
    );
}

#[test]
fn an_underflow_of_one_byte_is_found_at_free() {
    let run = run_header(
        "underflow",
        r#"
int main(void) {
    char *p = make_block(100);
    poke(p, -1);
    release(p);
    say("continued after the bug\n");
    return 0;
}
"#,
        &[],
    );
    run.assert_one_error(
        "header",
        &Expected {
            kind: "heap-buffer-underflow",
            block_size: 100,
            offset: -1,
            stack: At::Function("release"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unchecked,
        },
    );
}

#[test]
fn a_double_free_names_both_frees() {
    let run = run_header(
        "double_free",
        r#"
NOINLINE void release_again(char *p) { free(p); }
int main(void) {
    char *p = make_block(100);
    release(p);
    release_again(p);
    say("continued after the bug\n");
    return 0;
}
"#,
        &[],
    );
    run.assert_one_error(
        "header",
        &Expected::double_free(100, "make_block", "release", "release_again"),
    );
}

#[test]
fn freeing_a_stack_address_is_an_invalid_free() {
    let run = run_header(
        "free_stack_address",
        r#"
NOINLINE void *launder(void *p) { return p; }
NOINLINE void free_local(void) {
    char buf[64];
    memset(buf, 1, sizeof buf);
    keep(buf);
    free(launder(buf));
}
int main(void) {
    free_local();
    say("continued after the bug\n");
    return 0;
}
"#,
        &[],
    );
    run.assert_one_error(
        "header",
        &Expected {
            kind: "invalid-free",
            block_size: 0,
            offset: 0,
            stack: At::Function("free_local"),
            alloc_stack: At::Unknown,
            free_stack: At::Unknown,
        },
    );
}

#[test]
fn freeing_the_inside_of_a_block_is_an_invalid_free() {
    let run = run_header(
        "free_interior",
        r#"
NOINLINE void free_interior(char *p) { free(p + 8); }
int main(void) {
    char *p = make_block(100);
    free_interior(p);
    release(p);
    say("continued after the bug\n");
    return 0;
}
"#,
        &[],
    );
    run.assert_one_error(
        "header",
        &Expected {
            kind: "invalid-free",
            block_size: 100,
            offset: 8,
            stack: At::Function("free_interior"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unknown,
        },
    );
}

#[test]
fn a_write_into_a_quarantined_block_is_a_use_after_free() {
    let run = run_header(
        "uaf_write",
        r#"
NOINLINE void write_after_free(char *p) { p[10] = 1; }
int main(void) {
    char *p = make_block(100);
    release(p);
    write_after_free(p);
    say("continued after the bug\n");
    return 0;
}
"#,
        &["--fill-free", "0xdd"],
    );
    // Found when the block leaves quarantine (here: at exit), so the finding stack is open.
    run.assert_one_error(
        "header",
        &Expected {
            kind: "heap-use-after-free",
            block_size: 100,
            offset: 10,
            stack: At::Unchecked,
            alloc_stack: At::Function("make_block"),
            free_stack: At::Function("release"),
        },
    );
}

#[test]
fn an_overflow_of_a_block_never_freed_is_found_at_exit() {
    let run = run_header(
        "overflow_at_exit",
        r#"
int main(void) {
    char *p = make_block(100);
    poke(p, 100);
    keep(p);
    say("continued after the bug\n");
    return 0;
}
"#,
        &[],
    );
    run.assert_one_error(
        "header",
        &Expected {
            kind: "heap-buffer-overflow",
            block_size: 100,
            offset: 100,
            stack: At::Unchecked,
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unknown,
        },
    );
}

/// GIVEN a block overflowed, then another allocation, then the free.
const CHECKED_EARLY: &str = r#"
NOINLINE void *next_alloc(void) { return malloc(8); }
int main(void) {
    char *p = make_block(100);
    poke(p, 100);
    keep(next_alloc());
    release(p);
    say("continued after the bug\n");
    return 0;
}
"#;

#[test]
fn check_every_finds_an_overflow_before_the_block_is_freed() {
    let run = run_header("check_every", CHECKED_EARLY, &["--check-every", "1"]);
    // Found at the next allocation call, and reported once (not again at the free).
    run.assert_one_error(
        "header",
        &Expected {
            kind: "heap-buffer-overflow",
            block_size: 100,
            offset: 100,
            stack: At::Function("next_alloc"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unchecked,
        },
    );
}

#[test]
fn without_check_every_the_same_overflow_is_found_at_the_free() {
    let run = run_header("check_default", CHECKED_EARLY, &[]);
    run.assert_one_error(
        "header",
        &Expected {
            kind: "heap-buffer-overflow",
            block_size: 100,
            offset: 100,
            stack: At::Function("release"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unchecked,
        },
    );
}
