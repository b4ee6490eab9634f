//! NumPy's own test suite for its core (`numpy/_core/tests/test_numeric.py`, shipped in the
//! wheel) under plain `memwarden run`, with memwarden's data-memory handler installed: no
//! test fails that does not fail bare.

mod common;
use common::python::*;
use common::*;

use std::collections::BTreeSet;

/// Runs pytest on `tests` after printing the handler NumPy's arrays get; the ids of the
/// failed tests are written to `failed`.
const RUNNER: &str = r#"import sys
import numpy as np
import pytest


class Failures:
    def __init__(self):
        self.ids = []

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.ids.append(report.nodeid)


print("handler", np._core.multiarray.get_handler_name(np.ones(3)))
failures = Failures()
status = pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[1]], plugins=[failures])
with open(sys.argv[2], "w") as out:
    out.write("".join(id + "\n" for id in failures.ids))
sys.exit(0 if status in (0, 1) else int(status))
"#;

fn failed(path: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn numpys_numeric_tests_fail_nothing_more_under_memwarden_than_bare() {
    let Some(python) = venv_python("numpy, pytest, hypothesis") else {
        return;
    };
    let tests = common::python::numpy_test_file(&python, "test_numeric.py");
    let tests = tests.as_str();
    let scratch = Scratch::new("python_numpy_suite");
    let runner = Script::new(&scratch, "runner.py", RUNNER);
    let profiled_failed = scratch.path().join("failed-profiled");
    let profiled = profiled_failed.to_str().expect("utf-8 path");
    let run = run_script(&scratch, &python, &runner, &[tests, profiled], &[]);
    assert_success(&run.outcome, "pytest under memwarden");
    let stdout = run.outcome.stdout_text();
    assert_eq!(stdout.lines().next(), Some("handler memwarden"), "{stdout}");
    assert!(stdout.contains(" passed"), "{stdout}");
    let under_memwarden = failed(&profiled_failed);
    if under_memwarden.is_empty() {
        return;
    }
    // Only then is the bare run worth its time: which of these fail without memwarden too?
    let bare_failed = scratch.path().join("failed-bare");
    let mut bare = std::process::Command::new(&python);
    bare.args([
        runner.arg(),
        tests,
        bare_failed.to_str().expect("utf-8 path"),
    ])
    .current_dir(scratch.path());
    let bare = run_watched(bare, None, WATCHDOG, &scratch);
    assert_success(&bare, "pytest bare");
    let bare = failed(&bare_failed);
    let new: Vec<&String> = under_memwarden.difference(&bare).collect();
    assert!(
        new.is_empty(),
        "tests failing under memwarden only: {new:#?}\n{stdout}"
    );
}
