//! `memwarden run --python-objects`: Python objects smaller than 512 bytes, which pymalloc
//! serves from arenas memwarden does not see inside, go through `malloc` one by one and are
//! charged to the line that made them, exactly; without the option that line holds next
//! to nothing.

mod common;
use common::python::*;
use common::*;

/// 200,000 `object()`s (16 bytes each, not tracked by the garbage collector) made on one
/// line and alive together at the peak; the list holding them made on another.
const SCRIPT: &str = r#"N = 200_000
objects = [None] * N  # LIST
for i in range(N):
    objects[i] = object()  # OBJECTS
print("made", len(objects))
del objects
"#;

const OBJECTS: u64 = 200_000;
/// `sys.getsizeof(object())`.
const OBJECT_SIZE: u64 = 16;
/// Besides the list's pointers, at its line: the list object itself, and the module's
/// dict growing for a new name, at most.
const LIST_OVERHEAD: u64 = 1024;

#[test]
fn small_objects_are_charged_to_their_line_one_by_one() {
    let Some(python) = venv_python("sys") else {
        return;
    };
    let scratch = Scratch::new("python_objects");
    let script = Script::new(&scratch, "objects.py", SCRIPT);
    let objects_line = script.line_of("# OBJECTS");
    let list_line = script.line_of("# LIST");

    let options = RunOptions {
        options: &["--python-objects"],
        ..RunOptions::default()
    };
    let run = run_script_with(&scratch, &python, &script, &[], &options);
    assert_success(&run.outcome, "the script with --python-objects");
    assert_eq!(run.outcome.stdout_text(), "made 200000\n");
    let process = run.report.main_process(&script);
    let about = process.describe(&script);
    assert_eq!(
        process.at_peak_at(&script, objects_line),
        OBJECTS * OBJECT_SIZE,
        "{about}"
    );
    assert_eq!(
        process.allocated_at(&script, objects_line),
        OBJECTS * OBJECT_SIZE,
        "{about}"
    );
    let categories: Vec<_> = process
        .stacks_at(&script, objects_line)
        .map(|s| s.category.as_deref())
        .collect();
    assert!(
        categories.iter().all(|&c| c == Some("python")),
        "{categories:?}"
    );
    let list = process.at_peak_at(&script, list_line);
    assert!(
        (OBJECTS * 8..=OBJECTS * 8 + LIST_OVERHEAD).contains(&list),
        "the list's pointers: {list}\n{about}"
    );

    // Without it, the objects stay in pymalloc's arenas: the line shows little more than
    // pymalloc's bookkeeping for them.
    let plain = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&plain.outcome, "the script without --python-objects");
    let process = plain.report.main_process(&script);
    let seen = process.at_peak_at(&script, objects_line);
    assert!(
        seen < OBJECTS * OBJECT_SIZE / 4,
        "{seen} bytes\n{}",
        process.describe(&script)
    );
}
