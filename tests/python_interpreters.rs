//! Python frames from every CPython memwarden reads (3.9–3.13): the same script under each
//! interpreter installed on the machine (pyenv's), and a native thread that Python code
//! starts, whose allocations continue with the Python line that started it.

mod common;

use std::path::PathBuf;

use common::python::{line_in, run_script, venv_python, Script};
use common::Scratch;

/// A list of 500,000 pointers: `[0] * 500_000` asks malloc for exactly 4,000,000 bytes.
const LIST_SCRIPT: &str = "\
def make():
    return [0] * 500_000  # big

def outer():
    kept = make()  # call make
    return kept

keep = outer()  # call outer
";

/// The CPython 3.9–3.13 interpreters pyenv installed here.
fn interpreters() -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/root/.pyenv/versions") else {
        return Vec::new();
    };
    let mut found: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().into_string().ok()?;
            let minor: u32 = version
                .strip_prefix("3.")?
                .split('.')
                .next()?
                .parse()
                .ok()?;
            let python = entry.path().join("bin/python3");
            ((9..=13).contains(&minor) && python.exists()).then_some((version, python))
        })
        .collect();
    found.sort();
    found
}

#[test]
fn every_supported_interpreter_gives_file_line_and_function_in_every_frame() {
    let interpreters = interpreters();
    if interpreters.is_empty() {
        eprintln!("SKIPPED: no pyenv CPython 3.9–3.13 here");
        return;
    }
    for (version, python) in interpreters {
        let scratch = Scratch::new(&format!("python-{version}"));
        let script = Script::new(&scratch, "lists.py", LIST_SCRIPT);
        let run = run_script(&scratch, &python, &script, &[], &[]);
        let process = run.report.main_process(&script);
        let big = script.line_of("# big");
        assert_eq!(
            process.at_peak_at(&script, big),
            4_000_000,
            "CPython {version}: {}",
            process.describe(&script)
        );
        let stack = process
            .stacks_at(&script, big)
            .find(|s| s.at_peak_bytes == 4_000_000)
            .expect("the list's stack");
        let python_frames: Vec<(Option<&str>, Option<u32>)> = stack
            .frames
            .iter()
            .filter(|f| f.kind == "python")
            .map(|f| (f.function.as_deref(), f.line))
            .collect();
        assert_eq!(
            python_frames,
            vec![
                (Some("make"), Some(big)),
                (Some("outer"), Some(script.line_of("# call make"))),
                (Some("<module>"), Some(script.line_of("# call outer"))),
            ],
            "CPython {version}"
        );
        // Nothing of the interpreter's start-up above the script's module.
        assert_eq!(stack.frames.last().map(|f| f.kind.as_str()), Some("python"));
    }
}

const THREAD_LIBRARY: &str = r#"
#include <pthread.h>
#include <stdlib.h>
static void *kept;
static void *worker(void *unused) { kept = malloc(1234567); return unused; }
void spawn(void) {
    pthread_t thread;
    pthread_create(&thread, NULL, worker, NULL);
    pthread_join(thread, NULL);
}
"#;

#[test]
fn a_native_thread_started_from_python_continues_with_the_line_that_started_it() {
    let Some(python) = venv_python("ctypes") else {
        return;
    };
    let scratch = Scratch::new("python-native-thread");
    let library = scratch
        .compile_with(
            "spawn.so",
            THREAD_LIBRARY,
            &["-shared", "-fPIC", "-pthread"],
        )
        .path;
    let source = format!(
        "import ctypes\nlib = ctypes.CDLL({:?})\n\ndef start_native():\n    lib.spawn()  # start\n\nstart_native()  # call\n",
        library.display().to_string()
    );
    let script = Script::new(&scratch, "threads.py", &source);
    let run = run_script(&scratch, &python, &script, &[], &[]);
    let process = run.report.main_process(&script);
    let stack = process
        .stacks
        .iter()
        .find(|s| s.allocated_bytes == 1_234_567)
        .unwrap_or_else(|| panic!("the worker's block: {}", process.describe(&script)));
    assert_eq!(stack.frames[0].function.as_deref(), Some("worker"));
    assert_eq!(
        line_in(&stack.frames, &script),
        Some(script.line_of("# start"))
    );
    let functions: Vec<&str> = stack
        .frames
        .iter()
        .filter_map(|f| f.function.as_deref())
        .collect();
    assert!(functions.contains(&"spawn"), "{functions:?}");
    assert!(
        !functions.contains(&"start_thread") && !functions.contains(&"clone3"),
        "{functions:?}"
    );
    assert_eq!(
        stack.frames.last().and_then(|f| f.line),
        Some(script.line_of("# call"))
    );
}
