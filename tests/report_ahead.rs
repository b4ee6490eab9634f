//! The report `memwarden run` writes takes up what its look-ahead made of the stacks
//! while the program ran (their words symbolized, the frames each shows picked): it must
//! be the report made from the finished profiles alone, as `memwarden report` makes it.

mod common;
use common::python::*;
use common::*;

/// GIVEN a script that imports and compiles for a while, then waits, so that the
/// look-ahead works through its stacks while it runs.
const BUSY: &str = r#"import sys, time

sys.dont_write_bytecode = True
import argparse, decimal, email.parser, fractions, http.client, json, statistics
import xml.dom.minidom

for round in range(3):
    compile(open(json.__file__).read(), json.__file__, "exec")
    kept = [decimal.Decimal(i) / 7 for i in range(2000)]
time.sleep(0.3)
print("done")
"#;

#[test]
fn the_report_after_a_run_is_the_report_made_again_from_its_folder() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_report_again");
    let script = Script::new(&scratch, "busy.py", BUSY);
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the script under memwarden");
    let report_path = run.dir.join("report.json");
    let after_run = std::fs::read_to_string(&report_path).expect("report.json");

    // WHEN the report is made again from the folder, with no look-ahead.
    let again = memwarden_cmd(&scratch, &["report", run.dir.to_str().expect("utf-8")]);
    assert_success(&again, "memwarden report");

    // THEN it is the same, byte for byte.
    let made_again = std::fs::read_to_string(&report_path).expect("report.json");
    assert!(
        after_run == made_again,
        "report.json differs once made again ({} and {} bytes)",
        after_run.len(),
        made_again.len()
    );
    assert!(run.report.main_process(&script).stacks.len() > 1000);
}
