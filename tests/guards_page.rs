//! `memwarden run --guard page` and `--guard sampled`: a block flush against an
//! inaccessible page, so the faulting access itself is caught. The process cannot go on
//! after a page fault: it is stopped (SIGSEGV, exit 139), and report.json has the error
//! with the faulting stack.

mod common;
use common::guards::{run_guarded, At, Expected, GuardRun};
use common::*;

/// One program, one planted bug per mode of use (argv[1]): each access runs in a loop
/// that goes one byte too far, as off-by-one bugs do, so the faulting instruction is not
/// the first of its function. Blocks are 128 bytes, a multiple of every alignment, so the
/// byte after the last is on the guard page whatever the alignment.
const PAGE_BUGS: &str = r#"
NOINLINE char *make_block(size_t n) { return malloc(n); }
NOINLINE void release(char *p) { free(p); }
NOINLINE void write_past_end(char *p, size_t n) {
    for (size_t i = 0; i <= n; i++) p[i] = (char)i;
}
NOINLINE long read_past_end(const char *p, size_t n) {
    long sum = 0;
    for (size_t i = 0; i <= n; i++) sum += p[i];
    return sum;
}
NOINLINE void write_before_start(char *p, size_t n) {
    for (long i = (long)n - 1; i >= -1; i--) p[i] = (char)i;
}
NOINLINE long read_after_free(const char *p) {
    long sum = 0;
    for (int i = 10; i < 20; i++) sum += p[i];
    return sum;
}
volatile long mwt_result;
int main(int argc, char **argv) {
    if (argc != 2) return 2;
    char *p = make_block(128);
    if (!strcmp(argv[1], "write")) write_past_end(p, 128);
    else if (!strcmp(argv[1], "read")) mwt_result = read_past_end(p, 128);
    else if (!strcmp(argv[1], "underflow")) write_before_start(p, 128);
    else if (!strcmp(argv[1], "uaf")) { release(p); mwt_result = read_after_free(p); }
    else return 2;
    say("continued after the bug\n");
    return 0;
}
"#;

/// Runs the program with `bug` under `options`: it must be stopped by SIGSEGV at the bug.
fn run_bug(name: &str, options: &[&str], bug: &str) -> GuardRun {
    let scratch = Scratch::new(&format!("guard_page_{name}"));
    let prog = scratch.compile("page_bugs", PAGE_BUGS);
    let run = run_guarded(&scratch, options, &[prog.arg(), bug]);
    run.assert_stopped_by_sigsegv("a page fault stops the program");
    run
}

fn overflow_at(function: &'static str) -> Expected<'static> {
    Expected {
        kind: "heap-buffer-overflow",
        block_size: 128,
        offset: 128,
        stack: At::Function(function),
        alloc_stack: At::Function("make_block"),
        free_stack: At::Unknown,
    }
}

#[test]
fn a_write_one_byte_past_the_end_faults_at_once() {
    let run = run_bug("write", &["--guard", "page"], "write");
    run.assert_one_error("page", &overflow_at("write_past_end"));
    let stderr = run.stderr();
    assert!(
        stderr.contains(
            "SUMMARY: memwarden: heap-buffer-overflow at write_past_end (mwt_page_bugs.c:"
        ),
        "{stderr}"
    );
}

#[test]
fn a_read_one_byte_past_the_end_faults_at_once() {
    let run = run_bug("read", &["--guard", "page"], "read");
    run.assert_one_error("page", &overflow_at("read_past_end"));
}

#[test]
fn guard_below_catches_a_write_before_the_start() {
    let run = run_bug("below", &["--guard", "page", "--guard-below"], "underflow");
    run.assert_one_error(
        "page",
        &Expected {
            kind: "heap-buffer-underflow",
            block_size: 128,
            offset: -1,
            stack: At::Function("write_before_start"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unknown,
        },
    );
}

#[test]
fn a_read_of_a_freed_block_faults_as_a_use_after_free() {
    let run = run_bug("uaf", &["--guard", "page"], "uaf");
    run.assert_one_error(
        "page",
        &Expected {
            kind: "heap-use-after-free",
            block_size: 128,
            offset: 10,
            stack: At::Function("read_after_free"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Function("release"),
        },
    );
}

#[test]
fn sampled_mode_at_rate_one_catches_the_same_overflow() {
    let run = run_bug(
        "sampled",
        &["--guard", "sampled", "--sample-rate", "1"],
        "write",
    );
    run.assert_one_error("sampled", &overflow_at("write_past_end"));
}

#[test]
fn a_fault_that_is_not_a_guard_is_left_to_the_program() {
    // GIVEN a program that dereferences NULL under page mode: memwarden must not claim it.
    let scratch = Scratch::new("guard_page_null");
    let prog = scratch.compile(
        "null_deref",
        r#"
int *volatile mwt_null;
int main(void) {
    keep(malloc(64));
    return *mwt_null;
}
"#,
    );
    let run = run_guarded(&scratch, &["--guard", "page"], &[prog.arg()]);
    assert_eq!(run.status(), 128 + 11, "stderr:\n{}", run.stderr());
    run.assert_no_error("page");
}

#[test]
fn more_live_blocks_than_the_kernel_has_mappings_for_still_run() {
    // GIVEN 50,000 live blocks at once: two mappings each would pass the kernel's default
    // limit of 65,530 (vm.max_map_count). Page mode must degrade, not crash the program.
    let scratch = Scratch::new("guard_page_many");
    let prog = scratch.compile(
        "many_blocks",
        r#"
#define BLOCKS 50000
static char *blocks[BLOCKS];
int main(void) {
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = malloc(16 + i % 64);
        if (blocks[i] == NULL) return 1;
        blocks[i][0] = (char)i;
    }
    long sum = 0;
    for (int i = 0; i < BLOCKS; i++) sum += blocks[i][0];
    for (int i = 0; i < BLOCKS; i++) free(blocks[i]);
    say(sum != 0 ? "all blocks made and freed\n" : "no sum\n");
    return 0;
}
"#,
    );
    let run = run_guarded(&scratch, &["--guard", "page"], &[prog.arg()]);
    assert_eq!(
        (run.status(), run.stdout()),
        (0, "all blocks made and freed\n".to_owned()),
        "stderr:\n{}",
        run.stderr()
    );
    run.assert_no_error("page");
}

#[test]
fn a_fault_on_the_first_instruction_of_a_function_names_that_function() {
    // GIVEN a function whose first instruction is the bad write: the faulting address is
    // not a return address, and the byte before it belongs to the function before.
    let scratch = Scratch::new("guard_page_first");
    let prog = scratch.compile(
        "first_instruction",
        r#"
NOINLINE char *make_block(size_t n) { return malloc(n); }
NOINLINE void poke_end(char *p) { p[128] = 1; }
int main(void) {
    char *p = make_block(128);
    poke_end(p);
    say("continued after the bug\n");
    return 0;
}
"#,
    );
    let run = run_guarded(&scratch, &["--guard", "page"], &[prog.arg()]);
    assert_eq!(run.status(), 128 + 11, "stderr:\n{}", run.stderr());
    run.assert_one_error("page", &overflow_at("poke_end"));
}
