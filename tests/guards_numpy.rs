//! NumPy's own test suite for its core (`numpy/_core/tests/test_numeric.py`, shipped in the
//! wheel) passes under every guard mode with no heap error: the guards must not disturb a
//! large, allocation-heavy, correct program.

mod common;
use common::guards::run_guarded;
use common::*;

#[test]
fn numpys_numeric_tests_pass_with_no_heap_error_in_every_guard_mode() {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let ready = std::process::Command::new(&python)
        .args(["-c", "import numpy, pytest, hypothesis"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        return skip_or_fail(".venv/bin/python with numpy, pytest and hypothesis");
    }
    let tests = common::python::numpy_test_file(&python, "test_numeric.py");
    let tests = tests.as_str();
    let scratch = Scratch::new("guard_numpy_suite");
    for mode in ["header", "sampled", "page"] {
        let mut options = vec!["--guard", mode];
        if mode == "sampled" {
            // Every tenth block on a guarded page: many of them, in a short run.
            options.extend(["--sample-rate", "10"]);
        }
        let run = run_guarded(
            &scratch,
            &options,
            &[
                python.to_str().expect("utf-8 path"),
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                tests,
            ],
        );
        assert_eq!(
            run.status(),
            0,
            "pytest under --guard {mode}; stdout:\n{}\nstderr:\n{}",
            run.stdout(),
            run.stderr()
        );
        assert!(run.stdout().contains(" passed"), "{}", run.stdout());
        run.assert_no_error(mode);
    }
}
