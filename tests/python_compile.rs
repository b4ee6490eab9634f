//! The interpreter's own frames below a Python line are kept at both ends of a long run of
//! them and left out in the middle (only the inner end is kept where the run goes on past
//! the walk's depth limit or lies far below the line): source compiled by `compile()` makes
//! its parser and compiler recurse as deep as the source nests, and each depth would
//! otherwise be a stack of its own, as long as the recursion.

mod common;
use common::python::*;
use common::*;

/// The report's frame in place of the frames left out.
const LEFT_OUT: &str = "[interpreter frames left out]";
/// Return addresses the preload keeps at the inner end of such a run.
const KEPT_INNER: usize = 2;
/// Return addresses it keeps at the outer end, when the walk reached the Python line.
const KEPT_OUTER: usize = 2;

/// GIVEN source nested 60 parentheses deep (the parser recurses about 20 C calls per level,
/// far past the native walk's depth limit of 64) and source nested a few levels (within
/// it), each compiled on a line of its own.
const SCRIPT: &str = r#"DEEP = "x = " + "(" * 60 + "1" + ")" * 60 + "\n"
SHALLOW = "".join(f"def f{i}(a):\n    return [a + {i}, (a, {i})]\n" for i in range(300))


def compile_both():
    deep = compile(DEEP, "<deep>", "exec")  # DEEP
    shallow = compile(SHALLOW, "<shallow>", "exec")  # SHALLOW
    return deep, shallow


codes = compile_both()  # CALL
print(len(codes))
"#;

#[test]
fn the_middle_of_the_interpreters_recursion_is_left_out() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_compile");
    let script = Script::new(&scratch, "compiler.py", SCRIPT);
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the script under memwarden");
    assert_eq!(run.outcome.stdout_text(), "2\n");
    let process = run.report.main_process(&script);
    let about = process.describe(&script);
    let call = script.line_of("# CALL");

    // (line marker, what is kept at the outer end of a run that had its middle left out:
    // nothing where the walk was cut short by its depth limit inside the recursion or
    // stopped far below the line, the calls that the Python line made where the walk
    // reached it; the shallow source's recursion is both within a kilobyte of the line and
    // further)
    for (marker, outer_ends_expected) in [("# DEEP", &[0][..]), ("# SHALLOW", &[0, KEPT_OUTER])] {
        let line = script.line_of(marker);
        let stacks: Vec<&PyStack> = process.stacks_at(&script, line).collect();
        assert!(!stacks.is_empty(), "no stack at {marker}: {about}");
        let mut outer_ends = Vec::new();
        for stack in &stacks {
            let shape = shape(stack);
            let innermost_python = stack
                .frames
                .iter()
                .position(|f| f.kind == "python")
                .expect("a Python frame");
            // THEN the Python frames are the line's and its caller's, as without elision.
            let python_lines: Vec<Option<u32>> = stack.frames[innermost_python..]
                .iter()
                .map(|f| f.line)
                .collect();
            assert_eq!(python_lines, [Some(line), Some(call)], "{shape}");
            // AND below the Python line, at most the kept return addresses and one frame
            // for the rest, which is never the innermost.
            let below = &stack.frames[..innermost_python];
            let calls = |frames: &[PyFrame]| {
                frames
                    .iter()
                    .filter(|f| f.kind == "native" && !f.inlined)
                    .count()
            };
            let elided: Vec<usize> = (0..below.len())
                .filter(|&i| below[i].kind == "elided")
                .collect();
            match elided[..] {
                [] => assert!(calls(below) <= KEPT_INNER + KEPT_OUTER + 1, "{shape}"),
                [at] => {
                    let frame = &below[at];
                    assert_eq!(frame.function.as_deref(), Some(LEFT_OUT), "{shape}");
                    assert_eq!(
                        (&frame.file, frame.line, &frame.module),
                        (&None, None, &None)
                    );
                    assert_eq!(calls(&below[..at]), KEPT_INNER, "{shape}");
                    let outer = calls(&below[at + 1..]);
                    assert!([0, KEPT_OUTER].contains(&outer), "{shape}");
                    outer_ends.push(outer);
                }
                _ => panic!("more than one frame left out:\n{shape}"),
            }
        }
        // AND the recursion at this line was deep enough to be cut, the ways expected.
        for outer_end in outer_ends_expected {
            assert!(
                outer_ends.contains(outer_end),
                "at {marker}, no stack keeps {outer_end} calls outside what it left out \
                 ({outer_ends:?}): {about}"
            );
        }
    }

    // AND the profile itself holds no stack of the interpreter's return addresses alone as
    // deep as the walk's limit: the native stacks were stored cut, not only the merged
    // ones. (Start-up stacks, recorded before Python runs, are stored whole: they end at
    // the program's entry, short of the limit.)
    let loaded = memwarden::profile::load_dir(&run.dir).expect("the run's profiles");
    let profile = loaded
        .profiles
        .iter()
        .find(|p| p.pid == process.pid)
        .expect("the script's profile");
    let in_interpreter = |word: u64| {
        profile.module_at(word.wrapping_sub(1)).is_some_and(|m| {
            let name = m.path.rsplit('/').next().unwrap_or(&m.path);
            name.starts_with("libpython") || name.starts_with("python")
        })
    };
    let whole_recursions = profile
        .stacks
        .iter()
        .filter(|s| s.frames.len() >= MAX_DEPTH && s.frames.iter().all(|&w| in_interpreter(w)))
        .count();
    assert_eq!(
        whole_recursions, 0,
        "stacks stored whole: {whole_recursions}"
    );
}

/// The native walk's default depth limit.
const MAX_DEPTH: usize = 64;

/// A stack's frames, one per line, for failure messages.
fn shape(stack: &PyStack) -> String {
    stack
        .frames
        .iter()
        .map(|f| {
            format!(
                "  {} {}{} {:?}:{:?}",
                f.kind,
                if f.inlined { "(inlined) " } else { "" },
                f.function.as_deref().unwrap_or("?"),
                f.file,
                f.line
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
