//! A code object freed and another made at its very address, for source whose lines differ,
//! with its name, file name, first line and line table object all at the same addresses as
//! the first one's: each allocation is still charged to the line of the code that ran. What
//! the objects a code owns could not tell apart (every one of them was reused), the death
//! of the first code object does: memwarden sees every code object die.

mod common;
use std::collections::BTreeMap;

use common::python::*;
use common::*;

/// GIVEN two functions alike but for one blank line (the allocation on line 4 of
/// `generated.py`, or on line 5), each made anew 50 times in turn and freed before the other
/// is made. A code object made by `replace` with a line table copied just before lands
/// where the one freed just before was, with its line table where that one's was. The
/// script says how often the code object's address was the one freed just before.
const SCRIPT: &str = r#"import types

FILE = "generated.py"
LINE_4 = "def f(n):\n\n\n    return bytearray(n)\n"
LINE_5 = "def f(n):\n\n\n\n    return bytearray(n)\n"


def function_code(source):
    module = compile(source, FILE, "exec")
    return next(c for c in module.co_consts if isinstance(c, types.CodeType))


line_4, line_5 = function_code(LINE_4), function_code(LINE_5)
names = {"bytearray": bytearray}
kept = []
reused = 0
for i in range(50):
    code = line_4.replace(co_linetable=bytes(memoryview(line_4.co_linetable)))
    address = id(code)
    kept.append(types.FunctionType(code, names)(40000 + 2 * i))  # LINE 4
    del code
    code = line_5.replace(co_linetable=bytes(memoryview(line_5.co_linetable)))
    reused += id(code) == address
    kept.append(types.FunctionType(code, names)(40001 + 2 * i))  # LINE 5
    del code
print(reused)
"#;

#[test]
fn a_code_object_made_where_another_died_keeps_its_own_lines() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_code_reuse");
    let script = Script::new(&scratch, "recompile.py", SCRIPT);
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the script under memwarden");
    // The case arose: code objects of the two shapes shared addresses.
    let reused: u32 = run.outcome.stdout_text().trim().parse().expect("a count");
    assert!(
        reused > 0,
        "no code object was made where the one before died: the test shows nothing"
    );

    // WHEN the bytes are summed by the line of `generated.py` that allocated them
    let process = run.report.main_process(&script);
    let mut by_line: BTreeMap<u32, (u64, u64, Option<u32>)> = BTreeMap::new();
    for stack in &process.stacks {
        let python: Vec<&PyFrame> = stack.frames.iter().filter(|f| f.kind == "python").collect();
        let Some(generated) = python
            .first()
            .filter(|f| f.file.as_deref() == Some("generated.py"))
        else {
            continue;
        };
        let line = generated.line.expect("a Python frame's line");
        let caller = python.get(1).and_then(|f| f.line);
        let entry = by_line.entry(line).or_insert((0, 0, caller));
        entry.0 += stack.at_peak_bytes;
        entry.1 += stack.allocations;
        assert_eq!(entry.2, caller, "line {line} called from two lines");
    }

    // THEN each function's 50 byte arrays (n bytes and a NUL each), all alive at the peak,
    // are on its own line, called from the script's line that called it.
    let bytes = |first: u64| (0..50).map(|i| first + 2 * i + 1).sum::<u64>();
    let expected = BTreeMap::from([
        (4, (bytes(40000), 50, Some(script.line_of("# LINE 4")))),
        (5, (bytes(40001), 50, Some(script.line_of("# LINE 5")))),
    ]);
    assert_eq!(by_line, expected, "{}", process.describe(&script));
}
