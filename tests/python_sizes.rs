//! The size check of memwarden's NumPy handler: NumPy's `free` names the size it believes
//! a buffer has, and a size other than the one allocated is a `size-mismatch` error in
//! report.json with both stacks. What NumPy 2.x really passes for arrays with a 0 in their
//! shape is asserted here (docs/python.md says it in words).

mod common;
use common::python::*;
use common::*;

const SCRIPT: &str = r#"import numpy as np


def zero_shapes():
    for shape in [(0,), (0, 5), (3, 0), (2, 0, 4)]:
        a = np.empty(shape)
        del a
    b = np.ones((0, 3), dtype=np.int16)
    b.resize((0,), refcheck=False)
    del b


def empty_text():
    a = np.fromstring("", sep=" ")  # EMPTY_TEXT_ALLOC
    del a  # EMPTY_TEXT_FREE


def wrong_size_by_hand():
    allocator = handler_allocator()
    block = allocator.malloc(allocator.ctx, 100)  # BY_HAND_ALLOC
    allocator.free(allocator.ctx, block, 99)  # BY_HAND_FREE


zero_shapes()
empty_text()
wrong_size_by_hand()
print(np._core.multiarray.get_handler_name(np.ones(3)))
"#;

#[test]
fn a_wrong_size_in_numpys_free_is_a_size_mismatch_and_zero_shapes_are_freed_with_their_size() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_sizes");
    let script = Script::new(&scratch, "sizes.py", &with_handler_types(SCRIPT));
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the script under memwarden");
    assert_eq!(run.outcome.stdout_text(), "memwarden\n");
    let process = run.report.main_process(&script);
    let errors = error_lines(process, &script);
    // Every array with a 0 in its shape is allocated as 1 byte and freed as 1 byte: no
    // error. An empty array read as text is allocated one element (8 bytes of float64)
    // and freed as 1 byte: NumPy's own wrong size. The block freed by hand with 99 for 100
    // shows that the check works.
    let (empty_free, by_hand_free) = (
        Some(script.line_of("# EMPTY_TEXT_FREE")),
        Some(script.line_of("# BY_HAND_FREE")),
    );
    assert_eq!(
        errors,
        [
            ErrorLines {
                kind: "size-mismatch",
                block_size: 8,
                offset: 1,
                alloc: Some(script.line_of("# EMPTY_TEXT_ALLOC")),
                freed: empty_free,
                found: empty_free,
            },
            ErrorLines {
                kind: "size-mismatch",
                block_size: 100,
                offset: 99,
                alloc: Some(script.line_of("# BY_HAND_ALLOC")),
                freed: by_hand_free,
                found: by_hand_free,
            },
        ],
        "{:#?}",
        process.errors
    );
    // The report printed at once on stderr names the Python frames by their code, and
    // leaves out the word that marks NumPy data (it is no frame).
    let stderr = run.outcome.stderr_text();
    let immediate = stderr
        .split("SUMMARY: memwarden: size-mismatch")
        .next()
        .unwrap_or_default();
    assert!(
        immediate.contains("-byte block allocated at:")
            && immediate.contains(" empty_text (")
            && immediate.contains(script.path.to_str().unwrap()),
        "{stderr}"
    );
    assert!(
        !immediate.contains("0xc0000000000000"),
        "a marker shown:\n{stderr}"
    );
    assert!(
        !immediate.contains(" 0x80000"),
        "a raw Python frame word:\n{stderr}"
    );
}
