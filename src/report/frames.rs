//! Report stage: the frames a stack shows — symbolized, inline levels expanded, Python
//! frames as `file:line (function)` — minus what every stack would repeat: the profiler's
//! own frames, the C start-up code above `main`, and in Python stacks the interpreter's
//! frames above the innermost Python frame, everything above the outermost one, and the
//! import machinery's frames between two Python frames (as Python's tracebacks do).

use memwarden_abi::python::{self, FrameWord};

use std::ops::Range;

use super::frame_pool::Lookup;
use super::frame_table::FrameTable;
use super::json::file_name;
use crate::python::Holder;
use crate::symbolize::{Frame, FrameKind};

/// Frames in a module whose file name starts so are the profiler's own (its wrapper
/// around `main`, say).
const PROFILER_MODULE_PREFIX: &str = "libmemwarden";
/// The files of the Python hook `memwarden run` installs: `DIR/.python/sitecustomize.py`
/// and the NumPy installer it loads (whose wrapped `exec_module` runs NumPy's core).
const PROFILER_PYTHON_HOOK: [&str; 2] =
    ["/.python/sitecustomize.py", "/.python/memwarden_numpy.py"];
/// The function after which (outwards) only C start-up code follows.
const ENTRY_FUNCTION: &str = "main";
/// The C start-up code that calls `main`.
const START_UP_FUNCTIONS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_main_alias_2",
    "__libc_start_call_main",
];

/// A frame of the profiler itself ([`is_profiler_frame`]).
const PROFILER: u8 = 1;
/// The program's own `main` ([`is_entry`]).
const ENTRY: u8 = 2;
/// The C library's start-up code ([`is_start_up`]).
const START_UP: u8 = 4;
/// A Python frame.
const PYTHON: u8 = 8;
/// A frame of Python's import machinery ([`is_import_machinery`]).
const IMPORT_MACHINERY: u8 = 16;

/// The files of Python's import machinery, frozen into the interpreter.
const IMPORT_MACHINERY_FILES: [&str; 2] = [
    "<frozen importlib._bootstrap>",
    "<frozen importlib._bootstrap_external>",
];

/// What [`trim`] needs to know of a frame, as bits.
pub(crate) fn frame_flags(frame: &Frame) -> u8 {
    let bit = |yes: bool, flag: u8| if yes { flag } else { 0 };
    bit(is_profiler_frame(frame), PROFILER)
        | bit(is_entry(frame), ENTRY)
        | bit(is_start_up(frame), START_UP)
        | bit(frame.kind == FrameKind::Python, PYTHON)
        | bit(is_import_machinery(frame), IMPORT_MACHINERY)
}

/// The frames of the frame words of one stack of the table's process, innermost first, as
/// indices into the table.
pub(crate) fn shown_frames(table: &mut FrameTable, words: &[u64]) -> Vec<u32> {
    let kept = shown_pool(table, words, false);
    table.show(&kept)
}

/// The frames of a crash stack: like [`shown_frames`], but `words[0]` is the faulting
/// instruction's address, not a return address.
pub(crate) fn shown_crash_frames(table: &mut FrameTable, words: &[u64]) -> Vec<u32> {
    let kept = shown_pool(table, words, true);
    table.show(&kept)
}

fn is_python(word: u64) -> bool {
    matches!(python::decode(word), FrameWord::Python { .. })
}

/// A process's frame pool, as a stack's frames are picked from it: by the report's frame
/// table, or by the look-ahead while the run goes on (`warm`), which must pick the same.
pub(crate) trait Pooled {
    /// What holds the code of native frame word `word`.
    fn holder(&mut self, word: u64) -> Holder;
    /// The pool indices of `word`'s frames, symbolizing it the first time.
    fn lookup(&mut self, word: u64, how: Lookup) -> Range<u32>;
    /// The [`frame_flags`] of pool frame `index`.
    fn flags(&self, index: u32) -> u8;
}

/// The pool frames a stack of words shows, innermost first: those of its words that may
/// be shown, symbolized, then [`trim`]med.
pub(crate) fn shown_pool(
    pool: &mut impl Pooled,
    words: &[u64],
    first_is_instruction: bool,
) -> Vec<u32> {
    let innermost_python = words.iter().position(|&w| is_python(w));
    // The outermost Python frame (the script's `<module>`, a thread's bootstrap) is the
    // root: outside it only the interpreter's start-up or a thread's start remain.
    let root = words.iter().rposition(|&w| is_python(w));
    let words = &words[..root.map_or(words.len(), |r| r + 1)];
    let mut frames = Vec::with_capacity(words.len());
    // No further than `main`: the start-up code above it is cut anyway, and symbolizing it
    // would load libc's debug information for nothing.
    for (index, &word) in words.iter().enumerate() {
        if let FrameWord::Native(_) = python::decode(word) {
            // The profiler's own frames are left out unsymbolized: its library may have
            // been rebuilt since the run, and there is nothing to show anyway.
            let above_python = innermost_python.is_some_and(|innermost| index > innermost);
            match pool.holder(word) {
                Holder::Profiler => continue,
                Holder::Interpreter if above_python => continue,
                _ => {}
            }
        }
        let how = if index == 0 && first_is_instruction {
            Lookup::Instruction
        } else {
            Lookup::Return
        };
        let symbolized = pool.lookup(word, how);
        let reached_entry = symbolized.clone().any(|i| pool.flags(i) & ENTRY != 0);
        frames.extend(symbolized);
        if reached_entry {
            break;
        }
    }
    trim(frames, |&i| pool.flags(i))
}

/// The program's own `main` (not an inlined copy, not a Python function): the outermost
/// frame worth showing.
pub(crate) fn is_entry(frame: &Frame) -> bool {
    frame.kind == FrameKind::Native
        && !frame.inlined
        && frame.function.as_deref() == Some(ENTRY_FUNCTION)
}

/// Drops the profiler's frames, and every frame outside the first (innermost) `main`;
/// without a `main` (a `main` that tail-calls, like CPython's `Py_BytesMain`), the C
/// start-up frames that end the stack. Drops the frames of Python's import machinery but
/// the innermost Python frame: between the line that imports and the module's own code
/// they only say "importing" (five frames per level of import, with lines of their own
/// that split one import's memory into many stacks), while as the innermost Python frame
/// they say what the machinery itself allocated (reading or compiling a module).
/// `flags` gives each frame's [`frame_flags`].
fn trim<T>(frames: Vec<T>, flags: impl Fn(&T) -> u8) -> Vec<T> {
    let innermost_python = frames.iter().position(|f| flags(f) & PYTHON != 0);
    let mut shown: Vec<T> = frames
        .into_iter()
        .enumerate()
        .filter(|(index, f)| {
            let machinery = flags(f) & IMPORT_MACHINERY != 0 && Some(*index) != innermost_python;
            flags(f) & PROFILER == 0 && !machinery
        })
        .map(|(_, f)| f)
        .collect();
    if let Some(entry) = shown.iter().position(|f| flags(f) & ENTRY != 0) {
        shown.truncate(entry + 1);
    }
    while shown.len() > 1 && shown.last().is_some_and(|f| flags(f) & START_UP != 0) {
        shown.pop();
    }
    shown
}

/// A frame of the profiler itself: in its library, or in the Python hook the CLI installs
/// (`DIR/.python/`, which watches for NumPy's import).
fn is_profiler_frame(frame: &Frame) -> bool {
    match frame.kind {
        FrameKind::Native => frame
            .module
            .as_deref()
            .is_some_and(|m| file_name(m).starts_with(PROFILER_MODULE_PREFIX)),
        FrameKind::Python => frame
            .file
            .as_deref()
            .is_some_and(|f| PROFILER_PYTHON_HOOK.iter().any(|hook| f.ends_with(hook))),
        FrameKind::Arena | FrameKind::Elided => false,
    }
}

/// A frame of Python's import machinery (`importlib._bootstrap`, frozen).
fn is_import_machinery(frame: &Frame) -> bool {
    frame.kind == FrameKind::Python
        && frame
            .file
            .as_deref()
            .is_some_and(|f| IMPORT_MACHINERY_FILES.contains(&f))
}

/// The C library's start-up code, outer to `main`.
fn is_start_up(frame: &Frame) -> bool {
    frame.kind == FrameKind::Native
        && frame
            .function
            .as_deref()
            .is_some_and(|f| START_UP_FUNCTIONS.contains(&f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, module: &str) -> Frame {
        Frame {
            function: Some(function.to_owned()),
            file: None,
            line: None,
            module: Some(module.to_owned()),
            address: 0x1000,
            inlined: false,
            kind: FrameKind::Native,
        }
    }

    /// [`trim`] on frames themselves.
    fn trimmed(frames: Vec<Frame>) -> Vec<Frame> {
        let kept = trim((0..frames.len()).collect(), |&i| frame_flags(&frames[i]));
        kept.into_iter().map(|i| frames[i].clone()).collect()
    }

    fn functions(frames: &[Frame]) -> Vec<&str> {
        frames
            .iter()
            .filter_map(|f| f.function.as_deref())
            .collect()
    }

    #[test]
    fn start_up_code_above_main_and_profiler_frames_are_left_out() {
        let frames = vec![
            frame("leaf", "/t/prog"),
            frame("main", "/t/prog"),
            frame(
                "memwarden::exits::main_recording_exit",
                "/opt/libmemwarden.so",
            ),
            frame("__libc_start_call_main", "/lib/libc.so.6"),
            frame("_start", "/t/prog"),
        ];
        assert_eq!(functions(&trimmed(frames)), ["leaf", "main"]);
    }

    #[test]
    fn without_main_the_start_up_code_that_ends_the_stack_is_left_out() {
        let frames = vec![
            frame("PyList_New", "/lib/libpython3.11.so.1.0"),
            frame("Py_BytesMain", "/lib/libpython3.11.so.1.0"),
            frame("__libc_start_call_main", "/lib/libc.so.6"),
            frame("__libc_start_main_impl", "/lib/libc.so.6"),
            frame("_start", "/usr/bin/python3.11"),
        ];
        assert_eq!(functions(&trimmed(frames)), ["PyList_New", "Py_BytesMain"]);
        let only = vec![frame("_start", "/t/prog")];
        assert_eq!(functions(&trimmed(only)), ["_start"]);
    }

    #[test]
    fn the_python_hook_of_memwarden_is_left_out() {
        let python = |function: &str, file: &str| Frame {
            function: Some(function.to_owned()),
            file: Some(file.to_owned()),
            line: Some(1),
            module: None,
            address: 0,
            inlined: false,
            kind: FrameKind::Python,
        };
        let frames = vec![
            python("_call_with_frames_removed", "<frozen importlib._bootstrap>"),
            python("exec_module", "/out/.python/memwarden_numpy.py"),
            python("find_spec", "/out/.python/sitecustomize.py"),
            python("<module>", "/work/sitecustomize.py"),
        ];
        assert_eq!(
            functions(&trimmed(frames)),
            ["_call_with_frames_removed", "<module>"]
        );
    }

    #[test]
    fn stacks_without_main_are_kept_whole_and_an_inlined_main_does_not_cut() {
        let frames = vec![
            frame("worker", "/t/prog"),
            frame("start_thread", "/lib/libc.so.6"),
        ];
        assert_eq!(functions(&trimmed(frames)), ["worker", "start_thread"]);
        let mut inlined = frame("main", "/t/prog");
        inlined.inlined = true;
        let frames = vec![
            inlined,
            frame("outer", "/t/prog"),
            frame("main", "/t/prog"),
            frame("_start", "/t/prog"),
        ];
        assert_eq!(functions(&trimmed(frames)), ["main", "outer", "main"]);
    }

    mod python_stacks {
        use memwarden_abi::python::{python_frame, NUMPY_DATA};
        use memwarden_abi::MODULE_MAIN;

        use super::super::*;
        use crate::profile::synthetic::{
            stack_record, ProfileBuilder, SyntheticCode, SyntheticModule,
        };
        use crate::profile::Profile;
        use crate::report::json::FrameReport;
        use crate::symbolize::Symbolizer;

        const PYTHON: u64 = 0x1000_0000;
        const LIBPYTHON: u64 = 0x2000_0000;
        const LIBC: u64 = 0x3000_0000;
        const NUMPY: u64 = 0x5000_0000;

        fn code(qualname: &str) -> SyntheticCode {
            SyntheticCode {
                filename: "/work/script.py".into(),
                name: qualname.into(),
                qualname: qualname.into(),
                first_line: 1,
                line_table: vec![],
            }
        }

        /// The labels of the frames shown for `words` in a `python3` process.
        fn labels(words: &[u64]) -> Vec<String> {
            labels_with(&[code("make"), code("main"), code("<module>")], words)
        }

        /// [`labels`], the process's code records being `codes`.
        fn labels_with(codes: &[SyntheticCode], words: &[u64]) -> Vec<String> {
            let mut builder = ProfileBuilder::new(1)
                .module(SyntheticModule::at(
                    "/usr/bin/python3.11",
                    PYTHON,
                    MODULE_MAIN,
                ))
                .module(SyntheticModule::at(
                    "/usr/lib/libpython3.11.so.1.0",
                    LIBPYTHON,
                    0,
                ))
                .module(SyntheticModule::at("/lib/libc.so.6", LIBC, 0))
                .module(SyntheticModule::at("/np/_multiarray_umath.so", NUMPY, 0));
            for code in codes {
                builder = builder.python_code(code.clone());
            }
            let profile = builder.stack(words, stack_record()).build_profile();
            shown_report_frames(&profile, words)
                .iter()
                .map(FrameReport::label)
                .collect()
        }

        /// The frames shown for `words` of `profile`, resolved from a fresh table.
        fn shown_report_frames(profile: &Profile, words: &[u64]) -> Vec<FrameReport> {
            let symbolizer = std::sync::Mutex::new(Symbolizer::new());
            let mut table = FrameTable::new(profile, &symbolizer);
            let indices = shown_frames(&mut table, words);
            let frames = table.into_frames();
            indices
                .iter()
                .map(|&i| frames[i as usize].clone())
                .collect()
        }

        #[test]
        fn the_interpreter_is_hidden_above_the_innermost_python_frame_only() {
            let words = [
                NUMPY_DATA,
                LIBPYTHON + 0x10, // the allocator, below the Python frames: kept
                python_frame(0, 5, true),
                LIBPYTHON + 0x20, // _PyEval_EvalFrameDefault: hidden
                NUMPY + 0x30,     // NumPy's C code between Python frames: kept
                PYTHON + 0x40,    // the interpreter as the main executable: hidden
                python_frame(1, 9, true),
                python_frame(2, 12, true),
                PYTHON + 0x50, // Py_RunMain, main: above the root
                LIBC + 0x60,   // __libc_start_main: above the root
            ];
            assert_eq!(
                labels(&words),
                [
                    "0x20000010 [libpython3.11.so.1.0]",
                    "script.py:5 (make)",
                    "0x50000030 [_multiarray_umath.so]",
                    "script.py:9 (main)",
                    "script.py:12 (<module>)",
                ]
            );
        }

        #[test]
        fn the_import_machinery_is_hidden_unless_it_allocated_itself() {
            let in_file = |file: &str, qualname: &str| SyntheticCode {
                filename: file.into(),
                ..code(qualname)
            };
            const EXTERNAL: &str = "<frozen importlib._bootstrap_external>";
            let codes = [
                in_file(EXTERNAL, "_compile_bytecode"),
                in_file(EXTERNAL, "_LoaderBasics.exec_module"),
                in_file("<frozen importlib._bootstrap>", "_call_with_frames_removed"),
                in_file("/work/heavy.py", "<module>"),
                in_file("/work/script.py", "<module>"),
            ];
            // `import heavy` at script.py:3, and heavy.py's first line allocating.
            let importing = [
                python_frame(1, 940, true),
                python_frame(2, 241, true),
                python_frame(4, 3, true),
            ];
            let by_module: Vec<u64> = [LIBPYTHON + 0x10, python_frame(3, 1, true)]
                .into_iter()
                .chain(importing)
                .collect();
            assert_eq!(
                labels_with(&codes, &by_module),
                [
                    "0x20000010 [libpython3.11.so.1.0]",
                    "heavy.py:1 (<module>)",
                    "script.py:3 (<module>)",
                ]
            );
            // The machinery compiling heavy.py: its own frame stays, as the innermost.
            let by_machinery: Vec<u64> = [LIBPYTHON + 0x10, python_frame(0, 729, true)]
                .into_iter()
                .chain(importing)
                .collect();
            assert_eq!(
                labels_with(&codes, &by_machinery),
                [
                    "0x20000010 [libpython3.11.so.1.0]",
                    "<frozen importlib._bootstrap_external>:729 (_compile_bytecode)",
                    "script.py:3 (<module>)",
                ]
            );
        }

        #[test]
        fn without_python_frames_the_interpreter_is_shown() {
            let words = [LIBPYTHON + 0x10, PYTHON + 0x40, LIBC + 0x60];
            assert_eq!(
                labels(&words),
                [
                    "0x20000010 [libpython3.11.so.1.0]",
                    "0x10000040 [python3.11]",
                    "0x30000060 [libc.so.6]",
                ]
            );
        }

        #[test]
        fn python_frames_have_no_address_and_their_own_kind() {
            let profile = ProfileBuilder::new(1)
                .python_code(code("make"))
                .stack(&[python_frame(0, 5, true)], stack_record())
                .build_profile();
            let frames = shown_report_frames(&profile, &[python_frame(0, 5, true)]);
            assert_eq!(
                frames,
                [FrameReport {
                    function: Some("make".into()),
                    file: Some("/work/script.py".into()),
                    line: Some(5),
                    module: None,
                    address: None,
                    inlined: false,
                    kind: FrameKind::Python,
                }]
            );
        }
    }
}
