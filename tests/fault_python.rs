//! `--fail` rules whose `in=` and `not-in=` globs name Python code: a Python frame's
//! function is its code's qualified name or plain name, its file the script's path, so a
//! rule can make allocations fail under one Python function and no other.

mod common;
use common::python::*;
use common::*;

/// GIVEN a script that makes an 8 MB array in big(), in other() and in Loader.load(), and
/// says for each whether it got it or a MemoryError.
const SCRIPT: &str = r#"import numpy as np


def big():
    return np.ones(1_000_000)


def other():
    return np.ones(1_000_000)


class Loader:
    def load(self):
        return np.ones(1_000_000)


for name, make in [("big", big), ("other", other), ("method", Loader().load)]:
    try:
        make()
        print(name, "ok")
    except MemoryError:
        print(name, "MemoryError")
"#;

/// The script's output under `memwarden run --fail RULE`, and how many failures the report
/// lists.
fn failing_under(test: &str, rule: &str) -> (String, usize) {
    let python = venv_python("numpy").expect("NumPy's virtualenv");
    let scratch = Scratch::new(test);
    let script = Script::new(&scratch, "picky.py", SCRIPT);
    let argv = [python.to_str().unwrap(), script.arg()];
    let options = ["--fail", rule];
    let run = profile_with(
        &scratch,
        &argv,
        &RunOptions {
            options: &options,
            ..RunOptions::default()
        },
    );
    assert_success(&run.outcome, rule);
    let failures = common::failures::FaultReport::load(&run.dir)
        .processes
        .iter()
        .map(|p| p.injected_failures.len())
        .sum();
    (run.outcome.stdout_text(), failures)
}

#[test]
fn a_function_glob_matches_a_python_function() {
    if venv_python("numpy").is_none() {
        return;
    }
    let (out, failures) = failing_under("fail_py_function", "in=function:big,size>=1MB");
    assert_eq!(out, "big MemoryError\nother ok\nmethod ok\n");
    assert_eq!(failures, 1);
}

#[test]
fn a_method_matches_by_its_plain_name_and_its_qualified_name() {
    if venv_python("numpy").is_none() {
        return;
    }
    let (plain, _) = failing_under("fail_py_method", "in=function:load,size>=1MB");
    assert_eq!(plain, "big ok\nother ok\nmethod MemoryError\n");
    let (qualified, _) = failing_under("fail_py_qualname", "in=function:Loader.*,size>=1MB");
    assert_eq!(qualified, "big ok\nother ok\nmethod MemoryError\n");
}

#[test]
fn a_file_glob_and_a_not_in_glob_see_python_frames() {
    if venv_python("numpy").is_none() {
        return;
    }
    let rule = "in=file:*/picky.py,not-in=function:other,size>=1MB";
    let (out, failures) = failing_under("fail_py_file", rule);
    assert_eq!(out, "big MemoryError\nother ok\nmethod MemoryError\n");
    assert_eq!(failures, 2);
}
