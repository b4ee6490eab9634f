//! `memwarden run --guard …`: a program that dies of a fatal signal no guard names (a wild
//! read in the page guard's range, a null pointer under the header guard) has its signal
//! and the stack it died at in report.json's `crash` and in the summary; one a guard does
//! name (an overflow, a read of a block long out of quarantine) has both the heap error and
//! the crash, at the same place. With `--fail` and a guard together, the fault stops the
//! program rather than repeating.

mod common;
use common::failures::{program_function, FaultReport};
use common::guards::{run_guarded, At, Expected, GuardRun};
use common::*;

/// One program, one planted fault per argv[1]. `late` frees the block, then frees more
/// than a 4096-byte quarantine holds, so the block's pages are given back before the read.
const CRASHES: &str = r#"
NOINLINE char *make_block(size_t n) { return malloc(n); }
NOINLINE void release(char *p) { free(p); }
NOINLINE void churn(void) { for (int i = 0; i < 64; i++) free(malloc(5000)); }
NOINLINE long read_late(const char *p) {
    long sum = 0;
    for (int i = 10; i < 20; i++) sum += p[i]; /* read_late access */
    return sum;
}
NOINLINE void write_null(char *p) { p[3] = 1; /* write_null access */ }
NOINLINE long read_below(const char *p) {
    return p[-5000]; /* read_below access */
}
NOINLINE long read_wild(const char *p) {
    return p[(size_t)1 << 38]; /* read_wild access */
}
NOINLINE void write_past_end(char *p, size_t n) {
    for (size_t i = 0; i <= n; i++) p[i] = (char)i; /* overflow access */
}
volatile long mwt_result;
char *volatile mwt_null;
int main(int argc, char **argv) {
    if (argc != 2) return 2;
    char *p = make_block(128);
    if (!strcmp(argv[1], "late")) { release(p); churn(); mwt_result = read_late(p); }
    else if (!strcmp(argv[1], "null")) write_null(mwt_null);
    else if (!strcmp(argv[1], "wild")) mwt_result = read_wild(p);
    else if (!strcmp(argv[1], "below")) mwt_result = read_below(p);
    else if (!strcmp(argv[1], "overflow")) write_past_end(p, 128);
    else return 2;
    say("continued after the fault\n");
    return 0;
}
"#;

/// Runs the program with `fault` under `options`: it must be stopped by SIGSEGV, its crash
/// recorded in `function`, at the line marked `marker`, and named so in the summary.
fn run_fault(name: &str, options: &[&str], fault: &str, function: &str, marker: &str) -> GuardRun {
    let scratch = Scratch::new(&format!("guard_crash_{name}"));
    let prog = scratch.compile("crashes", CRASHES);
    let run = run_guarded(&scratch, options, &[prog.arg(), fault]);
    run.assert_stopped_by_sigsegv("the fault stops the program");
    let faults = FaultReport::load(&run.run.dir);
    let crash = faults
        .program_process()
        .crash
        .as_ref()
        .unwrap_or_else(|| panic!("a crash was recorded; stderr:\n{}", run.stderr()));
    assert_eq!(crash.signal, 11, "{crash:#?}");
    assert_eq!(
        program_function(&crash.frames),
        Some(function),
        "{crash:#?}"
    );
    assert_eq!(
        crash.frames[0].function.as_deref(),
        Some(function),
        "{crash:#?}"
    );
    assert_eq!(
        crash.frames[0].line,
        Some(prog.line_of(marker)),
        "{crash:#?}"
    );
    let stderr = run.stderr();
    assert!(
        stderr.contains(&format!("  crashed      SIGSEGV at {function} (")),
        "{stderr}"
    );
    run
}

#[test]
fn a_read_of_a_block_out_of_quarantine_is_a_use_after_free_and_a_crash() {
    // Its size and stacks left with it; its addresses, never handed out again, still say
    // that a block freed before was there.
    let run = run_fault(
        "late",
        &["--guard", "page", "--quarantine", "4096"],
        "late",
        "read_late",
        "read_late access",
    );
    run.assert_one_error(
        "page",
        &Expected {
            kind: "heap-use-after-free",
            block_size: 0,
            offset: 0,
            stack: At::Function("read_late"),
            alloc_stack: At::Unknown,
            free_stack: At::Unknown,
        },
    );
    let stderr = run.stderr();
    assert!(
        stderr.contains("lies in a block freed before and out of quarantine"),
        "{stderr}"
    );
}

#[test]
fn an_underflow_past_the_first_page_is_the_live_blocks_underflow() {
    // Past the block's slack (a page less its 128 bytes) lies the page the range leaves
    // between neighbours: still this block's, not one gone from quarantine.
    let run = run_fault(
        "below",
        &["--guard", "page"],
        "below",
        "read_below",
        "read_below access",
    );
    run.assert_one_error(
        "page",
        &Expected {
            kind: "heap-buffer-underflow",
            block_size: 128,
            offset: -5000,
            stack: At::Function("read_below"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unknown,
        },
    );
}

#[test]
fn a_wild_read_in_the_guard_range_is_a_crash_only() {
    // Far past every block handed out: no block was ever there.
    let run = run_fault(
        "wild",
        &["--guard", "page"],
        "wild",
        "read_wild",
        "read_wild access",
    );
    let p = run.report.program_process();
    assert_eq!((p.error_count, p.errors.len()), (0, 0), "{}", run.stderr());
}

#[test]
fn a_null_write_under_the_header_guard_is_a_crash_where_it_happened() {
    let run = run_fault(
        "null",
        &["--guard", "header"],
        "null",
        "write_null",
        "write_null access",
    );
    let p = run.report.program_process();
    assert_eq!((p.guard_mode.as_str(), p.error_count), ("header", 0));
}

#[test]
fn a_fault_a_guard_names_is_both_the_heap_error_and_the_crash() {
    let run = run_fault(
        "overflow",
        &["--guard", "page"],
        "overflow",
        "write_past_end",
        "overflow access",
    );
    run.assert_one_error(
        "page",
        &Expected {
            kind: "heap-buffer-overflow",
            block_size: 128,
            offset: 128,
            stack: At::Function("write_past_end"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unknown,
        },
    );
}

#[test]
fn fail_and_a_guard_together_stop_at_the_fault() {
    // Both install the fatal-signal handler; installed twice, it kept itself as the
    // disposition to restore, and the fault repeated for ever.
    run_fault(
        "fail_and_guard",
        &[
            "--guard",
            "page",
            "--quarantine",
            "4096",
            "--fail",
            "nth=1000000000",
        ],
        "late",
        "read_late",
        "read_late access",
    );
}
