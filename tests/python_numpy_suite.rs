//! NumPy's own tests for its core (`numpy/_core/tests/`, shipped in the wheel) under plain
//! `memwarden run`, with memwarden's data-memory handler installed: the array tests
//! (`test_multiarray.py`, 14,000 of them), the handler's own (`test_mem_policy.py`, which
//! builds a C extension with meson and sets handlers in threads and contexts), ufuncs,
//! indexing and threads. No test fails that does not fail bare, and the only heap errors
//! are NumPy's own wrong size for an empty array read from a file or a string
//! (docs/python.md).

mod common;
use common::python::*;
use common::*;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// The test files run, from `numpy/_core/tests/`: about 90 s bare on the project's machine.
const TEST_FILES: [&str; 8] = [
    "test_numeric.py",
    "test_multiarray.py",
    "test_mem_policy.py",
    "test_ufunc.py",
    "test_indexing.py",
    "test_item_selection.py",
    "test_regression.py",
    "test_multithreading.py",
];

/// How long the suite may take under memwarden, on a machine busy with other tests.
const SUITE_WATCHDOG: Duration = Duration::from_secs(900);

/// Runs pytest on the files after it on the command line (`sys.argv[3:]`), after printing
/// the handler NumPy's arrays get; the ids of the tests that failed (or could not be set
/// up) are written to `sys.argv[1]`, of those that passed to `sys.argv[2]`.
const RUNNER: &str = r#"import sys
import numpy as np
import pytest


class Outcomes:
    def __init__(self):
        self.failed = []
        self.passed = []

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed.append(report.nodeid)
        elif report.passed and report.when == "call":
            self.passed.append(report.nodeid)


print("handler", np._core.multiarray.get_handler_name(np.ones(3)))
outcomes = Outcomes()
# An assertion that fails in a thread the test started fails the test, not only warns.
strict_threads = ["-W", "error::pytest.PytestUnhandledThreadExceptionWarning"]
status = pytest.main(["-q", "-p", "no:cacheprovider", *strict_threads, *sys.argv[3:]],
                     plugins=[outcomes])
for path, ids in ((sys.argv[1], outcomes.failed), (sys.argv[2], outcomes.passed)):
    with open(path, "w") as out:
        out.write("".join(id + "\n" for id in ids))
sys.exit(0 if status in (0, 1) else int(status))
"#;

/// The test ids listed in `path`, without the folder of their file.
fn ids(path: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|id| id.rsplit('/').next().unwrap_or(id).to_owned())
        .collect()
}

/// `PATH` with the venv's `bin` first: `test_mem_policy.py` builds its extension with the
/// venv's meson and ninja.
fn path_with_venv(python: &Path) -> String {
    let bin = python.parent().expect("the venv's bin folder");
    let rest = std::env::var("PATH").unwrap_or_default();
    format!("{}:{rest}", bin.display())
}

/// NumPy's readers of arrays from text or a file, which allocate an empty result one
/// element and free it naming 1 byte.
const EMPTY_READERS: [&str; 2] = ["PyArray_FromFile", "PyArray_FromString"];

/// Whether `frames` hold a native frame of one of `functions`.
fn has_function(frames: &Option<Vec<PyFrame>>, functions: &[&str]) -> bool {
    frames.iter().flatten().any(|f| {
        f.kind == "native"
            && f.function
                .as_deref()
                .is_some_and(|f| functions.contains(&f))
    })
}

#[test]
fn numpys_core_tests_fail_nothing_more_under_memwarden_than_bare() {
    let Some(python) = venv_python("numpy, pytest, hypothesis, mesonbuild, ninja") else {
        return;
    };
    let tests: Vec<String> = TEST_FILES
        .iter()
        .map(|file| common::python::numpy_test_file(&python, file))
        .collect();
    let scratch = Scratch::new("python_numpy_suite");
    let runner = Script::new(&scratch, "runner.py", RUNNER);
    let failed_path = scratch.path().join("failed-profiled");
    let passed_path = scratch.path().join("passed-profiled");
    let mut args = vec![
        failed_path.to_str().expect("utf-8 path"),
        passed_path.to_str().expect("utf-8 path"),
    ];
    args.extend(tests.iter().map(String::as_str));
    let path = path_with_venv(&python);
    let options = RunOptions {
        env: &[("PATH", path.as_str())],
        watchdog: Some(SUITE_WATCHDOG),
        ..RunOptions::default()
    };
    let run = run_script_with(&scratch, &python, &runner, &args, &options);
    assert_success(&run.outcome, "pytest under memwarden");
    let stdout = run.outcome.stdout_text();
    assert_eq!(stdout.lines().next(), Some("handler memwarden"), "{stdout}");
    assert!(stdout.contains(" passed"), "{stdout}");

    // The handler's own tests ran (their extension was built) and passed: setting,
    // resetting and propagating handlers, each thread and context starting with NumPy's
    // default one under its own name, ownership handed to an array.
    let passed = ids(&passed_path);
    for test in [
        "test_set_policy",
        "test_default_policy_singleton",
        "test_policy_propagation",
        "test_context_locality",
        "test_thread_locality",
        "test_owner_is_base",
    ] {
        let id = format!("test_mem_policy.py::{test}");
        assert!(passed.contains(&id), "{id} did not pass:\n{stdout}");
    }
    let arrays = passed
        .iter()
        .filter(|id| id.starts_with("test_multiarray.py::"))
        .count();
    assert!(arrays > 10_000, "{arrays} of test_multiarray.py passed");

    // The only heap errors: an empty array read from a file or a string is allocated one
    // element and freed naming 1 byte (NumPy's own wrong size, docs/python.md), in
    // `TestIO.test_empty_files_binary` twice and `TestRegression.test_fromstring_crash`.
    for process in &run.report.processes {
        for error in &process.errors {
            assert_eq!(
                (error.kind.as_str(), error.block_size, error.offset),
                ("size-mismatch", 8, 1),
                "{error:#?}"
            );
            assert!(
                has_function(&error.alloc_stack, &EMPTY_READERS),
                "{error:#?}"
            );
        }
    }

    let under_memwarden = ids(&failed_path);
    if under_memwarden.is_empty() {
        return;
    }
    // Only then is the bare run worth its time: which of these fail without memwarden too?
    let bare_failed = scratch.path().join("failed-bare");
    let bare_passed = scratch.path().join("passed-bare");
    let mut bare = std::process::Command::new(&python);
    bare.args([
        runner.arg(),
        bare_failed.to_str().expect("utf-8 path"),
        bare_passed.to_str().expect("utf-8 path"),
    ])
    .args(&tests)
    .env("PATH", &path)
    .current_dir(scratch.path());
    let bare = run_watched(bare, None, SUITE_WATCHDOG, &scratch);
    assert_success(&bare, "pytest bare");
    let bare = ids(&bare_failed);
    let new: Vec<&String> = under_memwarden.difference(&bare).collect();
    assert!(
        new.is_empty(),
        "tests failing under memwarden only: {new:#?}\n{stdout}"
    );
}
