//! pymalloc's arenas, where CPython keeps every object under 512 bytes: without
//! `--python-objects` each arena is charged, whole, to one stack of its own, so Python's
//! small objects are in the peak and in what was not freed. The figures are checked against
//! CPython's own arena counters (`sys._debugmallocstats`).

mod common;
use common::python::*;
use common::*;

/// 300,000 tuples of two ints, alive together at the peak, then dropped.
const SCRIPT: &str = r#"import sys
def build(n):
    return [(i, i + 1) for i in range(n)]  # BUILD
keep = build(300_000)
sys._debugmallocstats()
del keep
sys._debugmallocstats()
print("done")
"#;

/// pymalloc's arena size on 64-bit CPython 3.10+.
const ARENA: u64 = 1 << 20;
/// The chunks of a thread's frame stack (CPython 3.11+) come from the arena allocator too,
/// in multiples of 16 KiB.
const FRAME_STACK_CHUNK: u64 = 16 << 10;
/// What the objects take in pymalloc's size classes: each tuple 64 bytes, each of its
/// two ints 32 (all but a few cached small ones).
const OBJECT_BYTES: u64 = 300_000 * 64 + 600_000 * 32;
const LABEL: &str = "[pymalloc arenas: Python objects under 512 bytes, frame stacks]";

/// CPython's count on `name`'s line of each `_debugmallocstats` output, in order.
fn arena_counts(stderr: &str, name: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter(|line| line.starts_with(&format!("# arenas {name} ")))
        .map(|line| {
            let count = line.rsplit('=').next().unwrap_or_default();
            count.trim().replace(',', "").parse().expect("a count")
        })
        .collect()
}

/// The bytes of frame-stack chunks in `bytes`, given `arenas` whole arenas.
fn frame_stack_bytes(bytes: u64, arenas: u64, what: &str) -> u64 {
    let rest = bytes
        .checked_sub(arenas * ARENA)
        .unwrap_or_else(|| panic!("{what}: {bytes} bytes hold fewer than {arenas} arenas"));
    assert!(
        rest % FRAME_STACK_CHUNK == 0 && (FRAME_STACK_CHUNK..ARENA).contains(&rest),
        "{what}: {bytes} bytes are {arenas} arenas and {rest} more"
    );
    rest
}

#[test]
fn arenas_are_charged_whole_to_a_stack_of_their_own() {
    let Some(python) = venv_python("sys") else {
        return;
    };
    let scratch = Scratch::new("python_arenas");
    let script = Script::new(&scratch, "tuples.py", SCRIPT);
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the script");
    assert_eq!(run.outcome.stdout_text(), "done\n");
    let stderr = run.outcome.stderr_text();
    let current = arena_counts(&stderr, "allocated current");
    let highwater = arena_counts(&stderr, "highwater mark");
    let reclaimed = arena_counts(&stderr, "reclaimed");
    assert_eq!((current.len(), highwater.len()), (2, 2), "{stderr}");

    let process = run.report.main_process(&script);
    let about = process.describe(&script);
    let arenas: Vec<_> = process
        .stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| f.kind == "arena"))
        .collect();
    assert_eq!(arenas.len(), 1, "{about}");
    let stack = arenas[0];
    assert_eq!(stack.frames.len(), 1, "{about}");
    assert_eq!(stack.frames[0].function.as_deref(), Some(LABEL));
    assert_eq!(
        (
            &stack.frames[0].file,
            stack.frames[0].line,
            &stack.frames[0].module
        ),
        (&None, None, &None)
    );
    assert_eq!(stack.category.as_deref(), Some("python"));
    // No call site makes it: `--fail site=` and `memwarden sweep` have nothing to fail there.
    assert_eq!(stack.site, None);

    // At the peak the tuples were all alive, and every arena CPython had then.
    assert!(stack.at_peak_bytes >= OBJECT_BYTES, "{about}");
    frame_stack_bytes(stack.at_peak_bytes, current[0], "at the peak");
    frame_stack_bytes(stack.max_live_bytes, highwater[1], "at most");
    // Dropped, most arenas went back: at exit, at most those CPython still had after `del`
    // (it frees more as it shuts down) and a frame stack.
    assert!(stack.live_bytes < (current[1] + 1) * ARENA, "{about}");
    assert!(reclaimed[1] >= 30, "{stderr}");
    assert!(stack.frees >= reclaimed[1], "{about}");
    // The line that made the tuples holds the list's pointers, not the arenas.
    let line = script.line_of("# BUILD");
    assert!(
        process.at_peak_at(&script, line) < OBJECT_BYTES / 4,
        "{about}"
    );
    // The summary says how to see each object at its line.
    assert!(
        stderr.contains("--python-objects` charges each to its line"),
        "{stderr}"
    );
}

#[test]
fn with_python_objects_only_frame_stacks_are_left_in_the_arenas() {
    let Some(python) = venv_python("sys") else {
        return;
    };
    let scratch = Scratch::new("python_arenas_objects");
    let script = Script::new(&scratch, "tuples.py", SCRIPT);
    let options = RunOptions {
        options: &["--python-objects"],
        ..RunOptions::default()
    };
    let run = run_script_with(&scratch, &python, &script, &[], &options);
    assert_success(&run.outcome, "the script with --python-objects");
    let process = run.report.main_process(&script);
    let about = process.describe(&script);
    let in_arenas: u64 = process
        .stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| f.kind == "arena"))
        .map(|s| s.max_live_bytes)
        .sum();
    assert!(in_arenas < ARENA, "{in_arenas} bytes\n{about}");
    // The tuples are at their line instead.
    let line = script.line_of("# BUILD");
    assert!(process.at_peak_at(&script, line) >= OBJECT_BYTES, "{about}");
    assert!(!run
        .outcome
        .stderr_text()
        .contains("--python-objects` charges each to its line"));
}
