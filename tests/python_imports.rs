//! Memory allocated while a module is imported is charged to the module's line, under the
//! line that imported it, with Python's import machinery left out between them (as
//! Python's tracebacks leave it out).

mod common;
use common::python::*;
use common::*;

/// GIVEN a module that makes a 5,000,000-byte bytearray when imported.
const HEAVY: &str = "blob = bytearray(5_000_000)  # HEAVY\n";

const SCRIPT: &str = r#"import sys

sys.dont_write_bytecode = True
import heavy  # IMPORT

print(len(heavy.blob))
"#;

#[test]
fn an_import_is_charged_to_the_importing_line_without_the_machinery() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_imports");
    let heavy = scratch.write("heavy.py", HEAVY);
    let script = Script::new(&scratch, "importer.py", SCRIPT);
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the script under memwarden");
    assert_eq!(run.outcome.stdout_text(), "5000000\n");
    let process = run.report.main_process(&script);
    let about = process.describe(&script);

    // A bytearray holds its bytes and a terminating NUL.
    let stack = process
        .stacks
        .iter()
        .find(|s| s.at_peak_bytes == 5_000_001)
        .unwrap_or_else(|| panic!("no stack of the bytearray: {about}"));
    let python_frames: Vec<(String, Option<u32>)> = stack
        .frames
        .iter()
        .filter(|f| f.kind == "python")
        .map(|f| (f.file.clone().unwrap_or_default(), f.line))
        .collect();
    let heavy = heavy.to_str().unwrap().to_owned();
    assert_eq!(
        python_frames,
        [
            (heavy, Some(1)),
            (script.arg().to_owned(), Some(script.line_of("# IMPORT"))),
        ],
        "{about}"
    );
}
