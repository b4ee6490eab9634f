//! The leak gate of `memwarden run --leak-check`: `--error-exitcode` when a counted leak is
//! found in any process, `--leak-kinds`, `--max-leaked-bytes`, `--suppressions` (one
//! pattern removes exactly one leak), `--baseline` with `memwarden leaks --write-baseline`
//! (a run with the known leaks passes, one with a new leak fails), `exit` from a thread
//! other than main, `_exit` (no check), and the one-line refusals of bad options.

mod common;
use common::leaks::{run_leak_check, LeakRun};
use common::*;

/// Leaks 77 bytes from `leak_a`, and with the argument `more` 300 bytes from `leak_b`.
const TWO_LEAKS: &str = r#"
NOINLINE void leak_a(void) { malloc(77); }
NOINLINE void leak_b(void) { malloc(300); }
int main(int argc, char **argv) {
    leak_a();
    if (argc > 1 && strcmp(argv[1], "more") == 0) leak_b();
    return 0;
}
"#;

fn two_leaks(test: &str) -> (Scratch, Program) {
    let scratch = Scratch::new(test);
    let prog = scratch.compile("two_leaks", TWO_LEAKS);
    (scratch, prog)
}

fn counted(run: &LeakRun, name: &str) -> Vec<(String, u64)> {
    let mut leaks: Vec<(String, u64)> = run
        .process(name)
        .leaks
        .iter()
        .filter(|l| !l.suppressed && (l.kind == "definite" || l.kind == "indirect"))
        .map(|l| {
            let function = ["leak_a", "leak_b"]
                .into_iter()
                .find(|f| l.has_function(f))
                .unwrap_or("?");
            (function.to_owned(), l.bytes)
        })
        .collect();
    leaks.sort();
    leaks
}

#[test]
fn a_definite_leak_fails_the_gate_only_with_error_exitcode() {
    let (scratch, prog) = two_leaks("leaks_gate_exit");
    let gated = run_leak_check(&scratch, &["--error-exitcode", "42"], &[prog.arg()]);
    assert_eq!(gated.outcome().code(), 42);
    let plain = run_leak_check(&scratch, &[], &[prog.arg()]);
    assert_eq!(
        plain.outcome().code(),
        0,
        "without --error-exitcode the target's status"
    );
    assert!(plain
        .outcome()
        .stderr_text()
        .contains("SUMMARY: memwarden: 77 byte(s) leaked in 1 allocation(s)."));
}

#[test]
fn kinds_the_gate_does_not_count_pass_it() {
    let (scratch, prog) = two_leaks("leaks_gate_kinds");
    let run = run_leak_check(
        &scratch,
        &[
            "--leak-kinds",
            "possible,reachable",
            "--error-exitcode",
            "42",
        ],
        &[prog.arg()],
    );
    assert_eq!(run.outcome().code(), 0, "{}", run.outcome().stderr_text());
    assert!(!run.outcome().stderr_text().contains("Direct leak"));
}

#[test]
fn max_leaked_bytes_is_a_budget() {
    let (scratch, prog) = two_leaks("leaks_gate_budget");
    let within = run_leak_check(
        &scratch,
        &["--max-leaked-bytes", "77", "--error-exitcode", "42"],
        &[prog.arg()],
    );
    assert_eq!(within.outcome().code(), 0);
    let over = run_leak_check(
        &scratch,
        &["--max-leaked-bytes", "76", "--error-exitcode", "42"],
        &[prog.arg()],
    );
    assert_eq!(over.outcome().code(), 42);
}

#[test]
fn a_suppression_removes_exactly_one_leak() {
    let (scratch, prog) = two_leaks("leaks_gate_suppress");
    let without = run_leak_check(&scratch, &[], &[prog.arg(), "more"]);
    assert_eq!(
        counted(&without, prog.name()),
        [("leak_a".to_owned(), 77), ("leak_b".to_owned(), 300)]
    );
    let file = scratch.write("lsan.supp", "# known\nleak:leak_b\n");
    let file = file.to_str().unwrap();
    let with = run_leak_check(
        &scratch,
        &["--suppressions", file, "--error-exitcode", "42"],
        &[prog.arg(), "more"],
    );
    assert_eq!(counted(&with, prog.name()), [("leak_a".to_owned(), 77)]);
    assert_eq!(with.outcome().code(), 42, "leak_a still fails the gate");
    let text = with.outcome().stderr_text();
    assert!(
        text.contains("SUMMARY: memwarden: 77 byte(s) leaked in 1 allocation(s)."),
        "{text}"
    );
    let all = scratch.write("all.supp", "leak:leak_*\n");
    let all = run_leak_check(
        &scratch,
        &[
            "--suppressions",
            all.to_str().unwrap(),
            "--error-exitcode",
            "42",
        ],
        &[prog.arg(), "more"],
    );
    assert_eq!(all.outcome().code(), 0, "every leak suppressed");
    let text = all.outcome().stderr_text();
    assert!(
        text.contains(
            "leak check: no definite or indirect leaks (2 leaks suppressed or in the baseline)"
        ),
        "{text}"
    );
}

#[test]
fn a_baseline_passes_known_leaks_and_fails_a_new_one() {
    let (scratch, prog) = two_leaks("leaks_gate_baseline");
    let first = run_leak_check(&scratch, &[], &[prog.arg()]);
    let baseline = scratch.path().join("baseline.json");
    let written = memwarden_cmd(
        &scratch,
        &[
            "leaks",
            "--write-baseline",
            first.profiled.dir.to_str().unwrap(),
            "-o",
            baseline.to_str().unwrap(),
        ],
    );
    assert_success(&written, "memwarden leaks --write-baseline");
    let options = [
        "--baseline",
        baseline.to_str().unwrap(),
        "--error-exitcode",
        "42",
    ];
    let same = run_leak_check(&scratch, &options, &[prog.arg()]);
    assert_eq!(same.outcome().code(), 0, "{}", same.outcome().stderr_text());
    let new = run_leak_check(&scratch, &options, &[prog.arg(), "more"]);
    assert_eq!(new.outcome().code(), 42);
    assert_eq!(counted(&new, prog.name()), [("leak_b".to_owned(), 300)]);
}

#[test]
fn exit_from_another_thread_runs_the_check_with_main_stopped() {
    let scratch = Scratch::new("leaks_gate_thread_exit");
    let prog = scratch.compile(
        "thread_exit",
        r#"
#include <pthread.h>
NOINLINE void *held_block(void) { return malloc(500); }
NOINLINE void *lost_block(void) { return malloc(600); }
NOINLINE void *ender(void *unused) { lost_block(); exit(0); }
int main(void) {
    void *volatile held = held_block();
    pthread_t thread;
    pthread_create(&thread, NULL, ender, NULL);
    pthread_join(thread, NULL);
    return held != NULL;
}
"#,
    );
    let run = run_leak_check(&scratch, &[], &[prog.arg()]);
    assert_success(run.outcome(), "thread_exit");
    let p = run.process(prog.name());
    assert_eq!(p.leak_check.as_ref().unwrap().threads_stopped, 1);
    let kind_of = |function: &str| {
        p.leaks
            .iter()
            .find(|l| l.has_function(function))
            .map(|l| (l.kind.clone(), l.bytes))
    };
    assert_eq!(kind_of("held_block"), Some(("reachable".into(), 500)));
    assert_eq!(kind_of("lost_block"), Some(("definite".into(), 600)));
}

#[test]
fn underscore_exit_runs_no_check_and_says_so() {
    let scratch = Scratch::new("leaks_gate_underscore_exit");
    let prog = scratch.compile(
        "underscore_exit",
        "int main(void) { malloc(10); _exit(0); }\n",
    );
    let run = run_leak_check(&scratch, &["--error-exitcode", "42"], &[prog.arg()]);
    assert_eq!(run.outcome().code(), 0, "no check, nothing counted");
    let p = run.process(prog.name());
    assert_eq!(p.leak_check.as_ref().unwrap().status, "not_run");
    assert!(run.outcome().stderr_text().contains("no leak check"));
}

#[test]
fn bad_leak_options_are_refused_in_one_line() {
    let scratch = Scratch::new("leaks_gate_cli");
    let missing = scratch.path().join("missing.supp");
    let bad_line = scratch.write("bad.supp", "race:foo\n");
    let bad_baseline = scratch.write("bad.json", "{}");
    let cases: Vec<Vec<String>> = vec![
        vec!["--leak-check".into(), "--leak-kinds".into(), "lost".into()],
        vec!["--leak-check".into(), "--leak-view".into(), "asan".into()],
        vec!["--leak-kinds".into(), "definite".into()],
        vec!["--leak-check".into(), "--guard".into(), "header".into()],
        vec![
            "--leak-check".into(),
            "--max-leaked-bytes".into(),
            "-1".into(),
        ],
        vec![
            "--leak-check".into(),
            "--suppressions".into(),
            missing.display().to_string(),
        ],
        vec![
            "--leak-check".into(),
            "--suppressions".into(),
            bad_line.display().to_string(),
        ],
        vec![
            "--leak-check".into(),
            "--baseline".into(),
            bad_baseline.display().to_string(),
        ],
    ];
    for case in cases {
        let mut args = vec!["run".to_owned()];
        args.extend(case.clone());
        args.extend(["--".into(), "true".into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let outcome = memwarden_cmd(&scratch, &args);
        assert_one_line_error(&outcome, &format!("{case:?}"));
        assert_eq!(outcome.code(), 2, "{case:?}");
    }
    let no_report = memwarden_cmd(&scratch, &["leaks", "--write-baseline", "nowhere"]);
    assert_one_line_error(&no_report, "a missing report");
}
