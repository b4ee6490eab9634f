//! `memwarden sweep`: every allocation call site of a program failed once, and the program's
//! answer judged — the one unchecked malloc crashes, the checked ones are handled, a site
//! whose failure makes the program wait forever hangs — plus its one-line errors.

mod common;
use common::*;

use serde::Deserialize;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Three checked mallocs and one unchecked, each in a function of its own. A failed
/// checked malloc makes the program exit 3; the unchecked one writes through NULL.
const CHECKED_AND_UNCHECKED: &str = r#"
NOINLINE static int oom(void) {
    ssize_t r = write(2, "oom\n", 4);
    (void)r;
    return 3;
}
NOINLINE static int checked_first(void) {
    char *p = malloc(16);
    if (!p) { return oom(); }
    memset(p, 1, 16); keep(p);
    return 0;
}
NOINLINE static int checked_second(void) {
    char *p = malloc(100);
    if (!p) { return oom(); }
    memset(p, 2, 100); keep(p);
    return 0;
}
NOINLINE static void unchecked(void) {
    char *p = malloc(32);
    p[0] = 'x'; p[31] = 'y'; /* unchecked: NULL here is a SIGSEGV */
    keep(p);
}
NOINLINE static int checked_third(void) {
    char *p = malloc(1000);
    if (!p) { return oom(); }
    memset(p, 3, 1000); keep(p);
    return 0;
}
int main(void) {
    int r;
    if ((r = checked_first())) return r;
    if ((r = checked_second())) return r;
    unchecked();
    if ((r = checked_third())) return r;
    return 0;
}
"#;

/// Two `new` sites: one catches `std::bad_alloc` and exits 4, one lets it escape
/// (`std::terminate`, then SIGABRT).
const CPP_NEW: &str = r#"
#include <new>
NOINLINE static int caught(void) {
    try { keep(new char[64]); } catch (const std::bad_alloc &) { return 4; }
    return 0;
}
NOINLINE static void uncaught(void) { keep(new char[128]); }
int main(void) {
    int r = caught();
    if (r) return r;
    uncaught();
    return 0;
}
"#;

/// One malloc; when it fails the program waits forever.
const WAITS_ON_FAILURE: &str = r#"
int main(void) {
    char *p = malloc(64);
    if (!p) { for (;;) pause(); }
    keep(p);
    return 0;
}
"#;

/// `sweep.json`, the fields the tests check.
#[derive(Debug, Deserialize)]
struct Sweep {
    format_version: u32,
    command: Vec<String>,
    sites_total: usize,
    runs: usize,
    sites_not_run: usize,
    counts: Counts,
    results: Vec<SiteResult>,
}

#[derive(Debug, Deserialize)]
struct Counts {
    crashed: usize,
    hung: usize,
    handled: usize,
    #[serde(rename = "not reached")]
    not_reached: usize,
}

#[derive(Debug, Deserialize)]
struct SiteResult {
    site: String,
    outcome: String,
    exit: Option<Exit>,
    frames: Vec<Frame>,
    crash_frames: Option<Vec<Frame>>,
    run_dir: String,
}

/// The function of the innermost frame that is in the test program.
fn program_function(frames: &[Frame]) -> Option<&str> {
    frames
        .iter()
        .find(|f| f.in_test_program() && f.function.is_some())
        .and_then(|f| f.function.as_deref())
}

fn load(dir: &Path) -> Sweep {
    let path = dir.join("sweep.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// `memwarden sweep -o DIR OPTIONS -- PROGRAM`, its outcome and its sweep.json.
fn sweep(scratch: &Scratch, program: &Program, options: &[&str]) -> (Outcome, Sweep) {
    let dir = scratch.out_dir();
    let dir_arg = dir.to_str().expect("utf-8");
    let mut args = vec!["sweep", "-o", dir_arg];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", program.arg()]);
    let outcome = memwarden_cmd(scratch, &args);
    let result = load(&dir);
    for site in &result.results {
        assert!(dir.join(&site.run_dir).join("report.json").is_file() || site.outcome == "hung");
    }
    (outcome, result)
}

#[test]
fn the_unchecked_malloc_crashes_and_the_checked_ones_are_handled() {
    let scratch = Scratch::new("sweep_checked");
    let program = scratch.compile("sweep_checked", CHECKED_AND_UNCHECKED);
    let (outcome, result) = sweep(&scratch, &program, &[]);
    assert_eq!(outcome.code(), 1, "stderr:\n{}", outcome.stderr_text());

    assert_eq!(result.format_version, 1);
    assert_eq!(result.command, [program.arg()]);
    assert_eq!(result.sites_total, result.results.len());
    assert_eq!((result.runs, result.sites_not_run), (result.sites_total, 0));
    let count = |outcome: &str| {
        result
            .results
            .iter()
            .filter(|r| r.outcome == outcome)
            .count()
    };
    assert_eq!(
        [
            result.counts.crashed,
            result.counts.hung,
            result.counts.handled,
            result.counts.not_reached
        ],
        [
            count("crashed"),
            count("hung"),
            count("handled"),
            count("not reached")
        ]
    );

    let mine: Vec<(&str, &SiteResult)> = result
        .results
        .iter()
        .filter_map(|r| program_function(&r.frames).map(|f| (f, r)))
        .collect();
    let functions: Vec<&str> = mine.iter().map(|(f, _)| *f).collect();
    assert_eq!(
        functions,
        [
            "unchecked",
            "checked_first",
            "checked_second",
            "checked_third"
        ],
        "one site per malloc, the crash first, then in discovery order: {result:#?}"
    );
    let (_, crashed) = mine[0];
    assert_eq!(crashed.outcome, "crashed");
    assert_eq!(crashed.exit, Some(Exit::signal(11)));
    assert_eq!(
        crashed.crash_frames.as_deref().and_then(program_function),
        Some("unchecked"),
        "the crash happened in `unchecked`: {crashed:#?}"
    );
    assert_eq!(result.results[0].site, crashed.site, "crashes come first");
    for (function, handled) in &mine[1..] {
        assert_eq!(handled.outcome, "handled", "{function}");
        assert_eq!(handled.exit, Some(Exit::code(3)), "{function}");
        assert!(handled.crash_frames.is_none(), "{function}");
    }
    let mut keys: Vec<&str> = result.results.iter().map(|r| r.site.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), result.results.len(), "each site once");

    let stderr = outcome.stderr_text();
    assert!(
        stderr.starts_with("memwarden sweep: ") && !stderr.contains('\r'),
        "a summary and no progress line when stderr is not a terminal:\n{stderr}"
    );
    assert!(
        stderr.contains("malloc failed in unchecked (mwt_sweep_checked.c:")
            && stderr.contains("killed by signal 11 (SIGSEGV) at "),
        "the summary names the crashing site:\n{stderr}"
    );
}

#[test]
fn cpp_new_sites_fail_too_and_an_escaping_bad_alloc_is_a_crash() {
    let scratch = Scratch::new("sweep_cpp");
    let program = scratch.compile_cpp("sweep_cpp", CPP_NEW);
    let (outcome, result) = sweep(&scratch, &program, &[]);
    assert_eq!(outcome.code(), 1, "stderr:\n{}", outcome.stderr_text());
    let mine: Vec<(&str, &SiteResult)> = result
        .results
        .iter()
        .filter_map(|r| program_function(&r.frames).map(|f| (f, r)))
        .collect();
    let summary: Vec<(&str, &str, Option<&Exit>)> = mine
        .iter()
        .map(|(f, r)| (*f, r.outcome.as_str(), r.exit.as_ref()))
        .collect();
    assert_eq!(
        summary,
        [
            ("uncaught", "crashed", Some(&Exit::signal(6))),
            ("caught", "handled", Some(&Exit::code(4))),
        ],
        "{result:#?}"
    );
    assert_eq!(
        mine[0].1.crash_frames.as_deref().and_then(program_function),
        Some("uncaught"),
        "{result:#?}"
    );
}

#[test]
fn a_site_whose_failure_never_ends_is_a_hang() {
    let scratch = Scratch::new("sweep_hang");
    let program = scratch.compile("sweep_hang", WAITS_ON_FAILURE);
    let started = std::time::Instant::now();
    let (outcome, result) = sweep(&scratch, &program, &["--timeout", "1", "--jobs", "2"]);
    assert_eq!(outcome.code(), 1, "stderr:\n{}", outcome.stderr_text());
    assert!(started.elapsed().as_secs() < 15, "the hung run was killed");
    let mine: Vec<&SiteResult> = result
        .results
        .iter()
        .filter(|r| program_function(&r.frames) == Some("main"))
        .collect();
    assert_eq!(mine.len(), 1, "{result:#?}");
    assert_eq!((mine[0].outcome.as_str(), &mine[0].exit), ("hung", &None));
    assert_eq!(result.counts.hung, 1);
    assert!(outcome.stderr_text().contains("still running after 1 s"));
}

#[test]
fn max_runs_bounds_the_runs_and_zero_only_lists_the_sites() {
    let scratch = Scratch::new("sweep_max_runs");
    let program = scratch.compile("sweep_max_runs", CHECKED_AND_UNCHECKED);
    let (outcome, result) = sweep(&scratch, &program, &["--max-runs", "0"]);
    assert_eq!(outcome.code(), 0, "stderr:\n{}", outcome.stderr_text());
    assert!(result.sites_total >= 4, "{result:#?}");
    assert_eq!((result.runs, result.results.len()), (0, 0));
    assert_eq!(result.sites_not_run, result.sites_total);

    let (outcome, result) = sweep(&scratch, &program, &["--max-runs=2", "-j", "1"]);
    assert_eq!(result.runs, 2);
    assert_eq!(result.sites_not_run, result.sites_total - 2);
    let expected = if result.counts.crashed > 0 { 1 } else { 0 };
    assert_eq!(
        outcome.code(),
        expected,
        "stderr:\n{}",
        outcome.stderr_text()
    );
}

#[test]
fn bad_input_gets_one_line_errors() {
    let scratch = Scratch::new("sweep_errors");
    let program = scratch.compile("sweep_errors", "int main(void) { return 0; }\n");
    let file = scratch.write("a-file", "x");
    let under_file = format!("{}/out", file.display());
    let cases: &[(&[&str], i32)] = &[
        (&["sweep"], 2),
        (&["sweep", "--"], 2),
        (&["sweep", "--max-runs", "many", "--", program.arg()], 2),
        (&["sweep", "--timeout", "0", "--", program.arg()], 2),
        (&["sweep", "--jobs", "0", "--", program.arg()], 2),
        (&["sweep", "--fail", "nth=1", "--", program.arg()], 2),
        (&["sweep", "--", "/nonexistent/program"], 2),
        (&["sweep", "-o", &under_file, "--", program.arg()], 2),
    ];
    for (args, status) in cases {
        let outcome = memwarden_cmd(&scratch, args);
        assert_one_line_error(&outcome, &format!("memwarden {args:?}"));
        assert_eq!(outcome.code(), *status, "memwarden {args:?}");
    }
}

#[test]
fn a_discovery_run_without_a_report_is_a_one_line_error() {
    let scratch = Scratch::new("sweep_no_report");
    // The target deletes the folder the profiles go to: no report can be made.
    let script = scratch.write(
        "erases-its-profile.sh",
        "#!/bin/sh\nrm -rf \"$MEMWARDEN_OUTPUT_DIR\"\n",
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = scratch.out_dir();
    let outcome = memwarden_cmd(
        &scratch,
        &[
            "sweep",
            "-o",
            out.to_str().expect("utf-8"),
            "--",
            script.to_str().expect("utf-8"),
        ],
    );
    assert_one_line_error(&outcome, "sweep of a target that erases its profiles");
    assert_eq!(outcome.code(), 1);
    assert!(
        outcome
            .stderr_text()
            .contains("the discovery run wrote no report"),
        "{}",
        outcome.stderr_text()
    );
    assert!(!out.join("sweep.json").exists());
}
