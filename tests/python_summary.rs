//! The summary's view of a Python program that allocates through library code: each stack
//! at the peak is shown from its innermost Python line, and when the lines shown are all
//! an installed package's, the program's own innermost line ends the chain, after a `…`
//! for the package's frames left out.

mod common;
use common::python::*;
use common::*;

/// An installed package (it lives in a `site-packages` folder) whose array is made four
/// calls deep. `np.empty` runs no Python code, so the innermost Python line is `level4`'s.
const PACKAGE: &str = r#"import numpy as np


def level1(n):
    return level2(n)


def level2(n):
    return level3(n)


def level3(n):
    return level4(n)


def level4(n):
    return np.empty(n)
"#;

const SCRIPT: &str = r#"import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "vendor", "site-packages"))
import deeplib

kept = []


def load():
    kept.append(deeplib.level1(1_000_000))  # LOAD


load()
print("done")
"#;

#[test]
fn a_package_stack_ends_with_the_programs_own_line() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_summary");
    let package = scratch.path().join("vendor/site-packages/deeplib");
    std::fs::create_dir_all(&package).expect("package folder");
    std::fs::write(package.join("__init__.py"), PACKAGE).expect("package source");
    let script = Script::new(&scratch, "summary.py", SCRIPT);

    let run = run_script(&scratch, &python, &script, &[], &[]);

    assert_success(&run.outcome, "the script under memwarden");
    assert_eq!(run.outcome.stdout_text(), "done\n");
    let line_of = |function: &str| {
        let at = PACKAGE
            .lines()
            .position(|l| l.starts_with(&format!("def {function}(")))
            .expect("function in the package");
        at + 2
    };
    let expected = format!(
        "  __init__.py:{} (level4) <- __init__.py:{} (level3) <- __init__.py:{} (level2) <- … <- summary.py:{} (load)",
        line_of("level4"),
        line_of("level3"),
        line_of("level2"),
        script.line_of("# LOAD"),
    );
    let stderr = run.outcome.stderr_text();
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(" 7.6 MiB ") && l.ends_with(&expected)),
        "a line ending {expected:?}:\n{stderr}"
    );
}
