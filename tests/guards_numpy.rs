//! NumPy under the guards: its own test suite for its core (`numpy/_core/tests/
//! test_numeric.py`, shipped in the wheel) passes under every guard mode with no heap error
//! (the guards must not disturb a large, allocation-heavy, correct program), and a buffer
//! freed twice through memwarden's NumPy handler is reported under the header and page
//! guards.

mod common;
use common::guards::run_guarded;
use common::python::*;
use common::*;

const DOUBLE_FREE_SCRIPT: &str = r#"import numpy as np


def free_twice():
    allocator = handler_allocator()
    block = allocator.malloc(allocator.ctx, 100)  # ALLOC
    allocator.free(allocator.ctx, block, 100)  # FIRST_FREE
    allocator.free(allocator.ctx, block, 100)  # SECOND_FREE


free_twice()
print("continued after the bug")
"#;

#[test]
fn a_numpy_buffer_freed_twice_is_a_double_free_under_the_header_and_page_guards() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("guard_numpy_double_free");
    let script = Script::new(
        &scratch,
        "double_free.py",
        &with_handler_types(DOUBLE_FREE_SCRIPT),
    );
    // The page guard keeps the freed block's pages inaccessible, so the second free must
    // not read a malloc header before it; the header guard keeps it in quarantine. (Sampled
    // mode guards only the blocks it samples, up to a pool that NumPy's import fills: a
    // block it did not sample is freed twice as glibc would free it.)
    for mode in ["header", "page"] {
        let options = ["--guard", mode];
        let run = run_script_with(
            &scratch,
            &python,
            &script,
            &[],
            &RunOptions {
                options: &options,
                ..RunOptions::default()
            },
        );
        let stderr = run.outcome.stderr_text();
        assert_eq!(
            run.outcome.stdout_text(),
            "continued after the bug\n",
            "--guard {mode}; stderr:\n{stderr}"
        );
        let process = run.report.main_process(&script);
        assert_eq!(
            error_lines(process, &script),
            [ErrorLines {
                kind: "double-free",
                block_size: 100,
                offset: 0,
                alloc: Some(script.line_of("# ALLOC")),
                freed: Some(script.line_of("# FIRST_FREE")),
                found: Some(script.line_of("# SECOND_FREE")),
            }],
            "--guard {mode}: {:#?}\nstderr:\n{stderr}",
            process.errors
        );
    }
}

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
