//! Fault injection you can replay and learn from: the same seed gives the same failures,
//! exactly where `memwarden-faults` says, and a crash after an unchecked failure is
//! reported with the stack where it happened.

mod common;
use common::failures::{program_function, FaultReport};
use common::*;

use memwarden_faults::{parse_rule, Call};

/// GIVEN a single-threaded program making 200 allocations of known sizes from three
/// functions, carrying on when one fails.
const MANY: &str = r#"
NOINLINE void *small(size_t i) { return malloc(16 + i); }
NOINLINE void *medium(size_t i) { return malloc(1000 + i); }
NOINLINE void *large(size_t i) { return calloc(1, 100000 + i); }
int main(void) {
    int failed = 0;
    for (size_t i = 0; i < 200; i++) {
        void *p = i % 3 == 0 ? small(i) : i % 3 == 1 ? medium(i) : large(i);
        failed += p == NULL;
        free(p);
    }
    return failed > 100 ? 100 : failed;
}
"#;

/// The function and size of allocation `n` (1-based) of [`MANY`].
fn many_call(n: u64) -> (&'static str, &'static str, u64) {
    let i = n - 1;
    match i % 3 {
        0 => ("small", "malloc", 16 + i),
        1 => ("medium", "malloc", 1000 + i),
        _ => ("large", "calloc", 100_000 + i),
    }
}

#[test]
fn the_same_seed_fails_the_same_calls_as_the_rule_says() {
    let scratch = Scratch::new("fail_seeded");
    let prog = scratch.compile("many", MANY);
    let options = RunOptions {
        options: &["--fail", "p=0.3", "--seed", "7"],
        ..RunOptions::default()
    };

    let first = profile_with(&scratch, &[prog.arg()], &options);
    let second = profile_with(&scratch, &[prog.arg()], &options);

    let failures = |run: &Profiled| {
        FaultReport::load(&run.dir)
            .program_process()
            .failure_summary()
    };
    let (a, b) = (failures(&first), failures(&second));
    assert_eq!(a, b, "two runs with seed 7 differ");
    // Exactly the calls whose draw the rule crate says fires.
    let rule = parse_rule("p=0.3").expect("rule");
    let mut expected = Vec::new();
    for n in 1..=200u64 {
        let (function, libc_function, size) = many_call(n);
        let call = Call {
            kind: memwarden_faults::calls::MALLOC,
            size,
            live_bytes: 0,
            allocated_before: 0,
        };
        if rule.fires(n, expected.len() as u64, &call, 7, 0) {
            let seq = expected.len() as u64 + 1;
            expected.push((
                seq,
                n,
                libc_function.to_owned(),
                size,
                Some(function.to_owned()),
            ));
        }
    }
    assert!(
        expected.len() > 40 && expected.len() < 80,
        "{}",
        expected.len()
    );
    assert_eq!(a, expected);
    assert_eq!(first.outcome.code(), expected.len() as i32);
    let other_seed = profile_with(
        &scratch,
        &[prog.arg()],
        &RunOptions {
            options: &["--fail", "p=0.3", "--seed", "8"],
            ..RunOptions::default()
        },
    );
    assert_ne!(
        failures(&other_seed),
        a,
        "seed 8 failed the same calls as seed 7"
    );
}

/// GIVEN a program that writes through an unchecked malloc in fill().
const UNCHECKED: &str = r#"
NOINLINE void fill(char *p) { p[10] = 1; }
int main(void) {
    char *p = malloc(64);
    fill(p);
    say("survived\n");
    free(p);
    return 0;
}
"#;

#[test]
fn a_crash_after_an_unchecked_failure_is_reported_where_it_happened() {
    let scratch = Scratch::new("fail_crash");
    let prog = scratch.compile("unchecked", UNCHECKED);

    let run = profile_with(
        &scratch,
        &[prog.arg()],
        &RunOptions {
            options: &["--fail", "nth=1"],
            ..RunOptions::default()
        },
    );

    assert_eq!(
        run.outcome.code(),
        128 + 11,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    let faults = FaultReport::load(&run.dir);
    let p = faults.program_process();
    assert_eq!(
        p.failure_summary(),
        [(1, 1, "malloc".to_owned(), 64, Some("main".to_owned()))]
    );
    let crash = p.crash.as_ref().expect("a crash was recorded");
    assert_eq!(crash.signal, 11);
    let functions: Vec<Option<&str>> = crash.frames.iter().map(|f| f.function.as_deref()).collect();
    assert_eq!(functions, [Some("fill"), Some("main")], "{crash:#?}");
    assert_eq!(program_function(&crash.frames), Some("fill"));
    assert_eq!(crash.frames[0].line, Some(prog.line_of("p[10] = 1")));
    let stderr = run.outcome.stderr_text();
    assert!(
        stderr.contains("  crashed      SIGSEGV at fill ("),
        "{stderr}"
    );
}

/// GIVEN a program whose second allocation fails (every=2), that then forks a child making
/// two more allocations.
const FORKING: &str = r#"
#include <sys/wait.h>
NOINLINE void *grab(size_t n) { return malloc(n); }
int main(void) {
    keep(grab(10));
    keep(grab(20));
    pid_t child = fork();
    if (child == 0) {
        keep(grab(30));
        void *last = grab(40);
        _exit(last == NULL ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}
"#;

#[test]
fn a_forked_child_counts_on_but_reports_only_its_own_failures() {
    let scratch = Scratch::new("fail_fork");
    let prog = scratch.compile("forking", FORKING);

    let run = profile_with(
        &scratch,
        &[prog.arg()],
        &RunOptions {
            options: &["--fail", "every=2"],
            ..RunOptions::default()
        },
    );

    assert_eq!(
        run.outcome.code(),
        0,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    let faults = FaultReport::load(&run.dir);
    let by_pid: Vec<_> = faults
        .processes
        .iter()
        .map(|p| (p.injected_failure_count, p.failure_summary()))
        .collect();
    // The child inherits the rule's count (its allocations are calls 3 and 4), but the
    // parent's failure is the parent's: each process lists, and counts, only its own.
    assert_eq!(
        by_pid,
        [
            (
                1,
                vec![(1, 2, "malloc".to_owned(), 20, Some("grab".to_owned()))]
            ),
            (
                1,
                vec![(1, 4, "malloc".to_owned(), 40, Some("grab".to_owned()))]
            ),
        ],
        "{faults:#?}"
    );
}
