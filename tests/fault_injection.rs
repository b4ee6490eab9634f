//! `memwarden run --fail`: allocations fail on purpose, the program sees what the
//! function's contract says (NULL + ENOMEM, `std::bad_alloc`, MAP_FAILED, Python's
//! MemoryError), and report.json lists each injected failure with its stack.

mod common;
use common::failures::{program_function, FaultReport};
use common::*;

/// `memwarden run -o <fresh> OPTIONS -- argv`, and the fault part of its report.
fn run_failing(scratch: &Scratch, options: &[&str], argv: &[&str]) -> (Profiled, FaultReport) {
    let run = profile_with(
        scratch,
        argv,
        &RunOptions {
            options,
            ..RunOptions::default()
        },
    );
    let faults = FaultReport::load(&run.dir);
    (run, faults)
}

/// GIVEN a program that checks every malloc and exits 42 on the first that fails.
const CHECKED: &str = r#"
#include <stdio.h>
#define CHECKED(n) ({ void *p_ = malloc(n); if (!p_) { say("out of memory\n"); exit(42); } p_; })
NOINLINE void *alloc_one(void) { return CHECKED(100); }
NOINLINE void *alloc_two(void) { return CHECKED(200); }
NOINLINE void *alloc_three(void) { return CHECKED(300); }
NOINLINE void *alloc_four(void) { return CHECKED(400); }
int main(void) {
    keep(alloc_one());
    keep(alloc_two());
    keep(alloc_three());
    keep(alloc_four());
    say("all allocations succeeded\n");
    return 0;
}
"#;

#[test]
fn the_nth_malloc_fails_and_the_program_takes_its_error_path() {
    let scratch = Scratch::new("fail_nth");
    let prog = scratch.compile("checked", CHECKED);

    let (run, faults) = run_failing(&scratch, &["--fail", "nth=3"], &[prog.arg()]);

    assert_eq!(
        run.outcome.code(),
        42,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    assert_eq!(run.outcome.stdout_text(), "out of memory\n");
    assert_eq!(faults.format_version, 8);
    let p = faults.program_process();
    assert_eq!(p.injected_failure_count, 1, "{p:#?}");
    assert_eq!(
        p.failure_summary(),
        [(
            1,
            3,
            "malloc".to_owned(),
            300,
            Some("alloc_three".to_owned())
        )],
        "{p:#?}"
    );
    let failure = &p.injected_failures[0];
    assert_eq!((failure.rule, failure.pid), (1, p.pid));
    assert!(
        failure.site.as_ref().is_some_and(|s| s.len() == 16),
        "{failure:?}"
    );
    let stderr = run.outcome.stderr_text();
    assert!(
        stderr.contains(
            "  injected     1 allocation failure (rule 1: 1)\n  first failed malloc of 300 bytes at alloc_three ("
        ),
        "{stderr}"
    );
    // The two allocations before it were made and are still live at exit.
    let process = run.report.only_process();
    assert_eq!(process.live("alloc_one") + process.live("alloc_two"), 300);
    assert_eq!(process.allocations("alloc_three"), 0);
}

#[test]
fn without_fail_nothing_fails() {
    let scratch = Scratch::new("fail_none");
    let prog = scratch.compile("checked", CHECKED);

    let (run, faults) = run_failing(&scratch, &[], &[prog.arg()]);

    assert_eq!(
        run.outcome.code(),
        0,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    let p = faults.program_process();
    assert_eq!(
        (p.injected_failure_count, p.injected_failures.len()),
        (0, 0)
    );
    assert!(p.crash.is_none());
    assert!(!run.outcome.stderr_text().contains("injected"));
}

/// GIVEN a C++ program whose first `new` is caught failing as std::bad_alloc.
const BAD_ALLOC: &str = r#"
#include <new>
struct Node { char payload[48]; };
NOINLINE Node *make_node() { return new Node(); }
int main() {
    try {
        Node *n = make_node();
        keep(n);
        say("new succeeded\n");
        return 1;
    } catch (const std::bad_alloc &) {
        say("caught std::bad_alloc\n");
        return 0;
    }
}
"#;

#[test]
fn a_failed_new_throws_bad_alloc() {
    let scratch = Scratch::new("fail_new");
    let prog = scratch.compile_cpp("bad_alloc", BAD_ALLOC);

    let (run, faults) = run_failing(&scratch, &["--fail", "calls=new,nth=1"], &[prog.arg()]);

    assert_eq!(
        run.outcome.code(),
        0,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    assert_eq!(run.outcome.stdout_text(), "caught std::bad_alloc\n");
    let p = faults.program_process();
    assert_eq!(
        p.failure_summary(),
        [(
            1,
            1,
            "operator new".to_owned(),
            48,
            Some("make_node()".to_owned())
        )],
        "{p:#?}"
    );
}

/// GIVEN a program that checks that each function fails as its contract says, with
/// sizes from 1000 up failing and smaller ones not; it exits with the number of the first
/// broken contract, 0 if none.
const CONTRACTS: &str = r#"
#include <sys/mman.h>
#define CHECK(n, cond) do { if (!(cond)) { say("contract " #n " broken\n"); return n; } } while (0)
int main(void) {
    char *small = malloc(8);
    CHECK(1, small != NULL);
    errno = 0;
    CHECK(2, malloc(1001) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(3, calloc(2, 1002) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(4, realloc(small, 1003) == NULL && errno == ENOMEM);
    small[7] = 1; /* still ours after a failed realloc */
    free(small);
    void *aligned = (void *)1;
    CHECK(5, posix_memalign(&aligned, 64, 1004) == ENOMEM && aligned == (void *)1);
    errno = 0;
    CHECK(6, aligned_alloc(64, 1088) == NULL && errno == ENOMEM);
    errno = 0;
    void *map = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(7, map == MAP_FAILED && errno == ENOMEM);
    say("every contract held\n");
    return 0;
}
"#;

#[test]
fn failed_calls_return_what_their_contract_says() {
    let scratch = Scratch::new("fail_contracts");
    let prog = scratch.compile("contracts", CONTRACTS);

    let (run, faults) = run_failing(&scratch, &["--fail", "calls=all,size>=1000"], &[prog.arg()]);

    assert_eq!(
        run.outcome.stdout_text(),
        "every contract held\n",
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    assert_eq!(run.outcome.code(), 0);
    let p = faults.program_process();
    let calls: Vec<(String, u64)> = p
        .injected_failures
        .iter()
        .map(|f| (f.function.clone(), f.size))
        .collect();
    let expected = [
        ("malloc", 1001),
        ("calloc", 2004),
        ("realloc", 1003),
        ("posix_memalign", 1004),
        ("aligned_alloc", 1088),
        ("mmap", 8192),
    ]
    .map(|(f, s)| (f.to_owned(), s));
    assert_eq!(calls, expected, "{p:#?}");
    assert!(p
        .injected_failures
        .iter()
        .all(|f| program_function(&f.frames) == Some("main")));
}

/// GIVEN two functions that allocate (make_a three times, make_b twice) and carry on
/// when an allocation fails.
const TWO_SITES: &str = r#"
NOINLINE void *make_a(size_t n) { return malloc(n); }
NOINLINE void *make_b(size_t n) { return malloc(n); }
int main(void) {
    int failed = 0;
    for (int i = 0; i < 3; i++) { void *p = make_a(64 + i); failed += p == NULL; keep(p); }
    for (int i = 0; i < 2; i++) { void *p = make_b(128 + i); failed += p == NULL; keep(p); }
    return failed;
}
"#;

#[test]
fn a_function_filter_fails_only_that_function() {
    let scratch = Scratch::new("fail_in_function");
    let prog = scratch.compile("two_sites", TWO_SITES);

    let (run, faults) = run_failing(&scratch, &["--fail", "in=function:make_b"], &[prog.arg()]);

    assert_eq!(
        run.outcome.code(),
        2,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    let p = faults.program_process();
    assert_eq!(
        p.failure_summary(),
        [
            (1, 1, "malloc".to_owned(), 128, Some("make_b".to_owned())),
            (2, 2, "malloc".to_owned(), 129, Some("make_b".to_owned())),
        ],
        "{p:#?}"
    );
    let process = run.report.only_process();
    assert_eq!(process.allocated("make_a"), 64 + 65 + 66);
    assert_eq!(process.allocated("make_b"), 0);
}

#[test]
fn a_site_key_from_the_report_fails_exactly_that_call_site() {
    let scratch = Scratch::new("fail_site");
    let prog = scratch.compile("two_sites", TWO_SITES);
    let (plain, plain_faults) = run_failing(&scratch, &[], &[prog.arg()]);
    assert_eq!(plain.outcome.code(), 0);
    let site = plain_faults.program_process().site_of("make_a");

    let rule = format!("site={site},times=2");
    let (run, faults) = run_failing(&scratch, &["--fail", &rule], &[prog.arg()]);

    assert_eq!(
        run.outcome.code(),
        2,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    let p = faults.program_process();
    assert_eq!(
        p.failure_summary(),
        [
            (1, 1, "malloc".to_owned(), 64, Some("make_a".to_owned())),
            (2, 2, "malloc".to_owned(), 65, Some("make_a".to_owned())),
        ],
        "{p:#?}"
    );
    assert!(p
        .injected_failures
        .iter()
        .all(|f| f.site.as_deref() == Some(&*site)));
}

#[test]
fn numpy_meets_memory_error_at_the_budget() {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if !python.is_file() {
        return skip_or_fail(".venv/bin/python (NumPy's virtualenv)");
    }
    let scratch = Scratch::new("fail_budget_numpy");
    let script = "import sys\nimport numpy as np\ntry:\n    a = np.ones(10**8)\nexcept MemoryError:\n    print('MemoryError')\n    sys.exit(3)\nprint('allocated', a.nbytes)\n";
    let script = scratch.write("ones.py", script);
    let argv = [
        python.to_str().expect("utf-8 path"),
        script.to_str().expect("utf-8"),
    ];

    let (run, faults) = run_failing(&scratch, &["--fail", "budget=100MB"], &argv);

    assert_eq!(
        run.outcome.code(),
        3,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    assert_eq!(run.outcome.stdout_text(), "MemoryError\n");
    let failures: Vec<_> = faults
        .processes
        .iter()
        .flat_map(|p| &p.injected_failures)
        .collect();
    assert!(
        failures.iter().any(|f| f.size >= 800_000_000),
        "no failure of the 800 MB array: {failures:#?}"
    );
    // The budget is a cap: what failed is what would have crossed 100 MB.
    let peak = run
        .report
        .processes
        .iter()
        .map(|p| p.peak_bytes)
        .max()
        .unwrap_or(0);
    assert!(peak <= 100_000_000, "peak {peak} above the budget");
}

#[test]
fn invalid_rules_are_refused_before_the_target_starts() {
    let scratch = Scratch::new("fail_invalid");
    let cases = [
        ("nth=3,sz>=1MB", "--fail 'nth=3,sz>=1MB': unknown key 'sz' at characters 7-8 (keys: "),
        ("size>=10XB", "--fail 'size>=10XB': bad unit 'XB' (units: "),
        ("p=2", "--fail 'p=2': probability '2' is out of range (0 < p <= 1, or 0% < p <= 100%) at character 3"),
    ];
    for (rule, message) in cases {
        let outcome = memwarden_cmd(
            &scratch,
            &["run", "--fail", rule, "--", "sh", "-c", "touch started"],
        );
        assert_one_line_error(&outcome, rule);
        assert_eq!(outcome.code(), 2, "{rule}");
        let line = outcome.stderr_text();
        assert!(
            line.starts_with(&format!("memwarden: error: {message}")),
            "{rule}: {line}"
        );
        assert!(
            !scratch.path().join("started").exists(),
            "{rule}: the target ran"
        );
    }
}
