//! Interposed call → stack (Python): cuts, from a native stack about to be interned, the
//! interpreter's own return addresses that the merge with the thread's Python frames
//! (`python_stack`) would leave out anyway. Under `compile()` or an import from source,
//! CPython's parser and compiler recurse as deep as the source nests: kept whole, nearly
//! every allocation's native stack is a new one, 64 frames deep, and interning it (hashing
//! it, comparing it, writing it to the profile) costs more than the rest of the hook.
//!
//! The cut is exactly the merge's, so the merged stack the report shows does not change:
//!
//! - below the innermost evaluation loop, when only the interpreter's code lies between it
//!   and the allocation: the two innermost and two outermost addresses, with the
//!   `INTERPRETER_FRAMES_LEFT_OUT` marker in place of the rest;
//! - when an extension's function (or another library's) lies there: everything up to the
//!   outermost of those, then the evaluation loop's frame;
//! - when the walk stopped at its depth limit inside the interpreter, on a thread that runs
//!   Python: the two innermost, then the marker.
//!
//! Any other stack (no Python on the thread, a start-up stack) is interned whole.

use memwarden_abi::python::INTERPRETER_FRAMES_LEFT_OUT;

use crate::pushed::Pushed;
use crate::python_codes::read_u64;
use crate::python_layout::CurrentFrame;
use crate::python_runtime::PythonRuntime;
use crate::stack_prefix::MAX_LEVELS;

/// Return addresses kept at the inner end of a run of the interpreter's frames below the
/// innermost Python frame: the allocating function and its caller (`list_resize` under
/// `PyList_Append`, the compiler's `compiler_next_instr` under the `compiler_addop…` that
/// grew its code).
pub const KEEP_INNER: usize = 2;
/// Return addresses kept at the outer end of such a run: the C function the Python line
/// called (`builtin_compile`) and the one it called.
pub const KEEP_OUTER: usize = 2;

/// What is kept of a native stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// All of it.
    Whole,
    /// `frames[..KEEP_INNER]`, the marker, then `frames[outer_from..]`.
    Ends { outer_from: usize },
    /// `frames[..end]`, then `frames[eval..]`.
    Gap { end: usize, eval: usize },
}

/// What the merge would keep of `frames` (innermost first, as the walk found them, `depth`
/// being its limit). `is_eval` and `in_interpreter` classify a return address;
/// `runs_python` says whether the thread has Python frames (asked only for a walk that
/// stopped at its limit inside the interpreter).
fn cut_of(
    frames: &[u64],
    depth: usize,
    is_eval: impl Fn(u64) -> bool,
    in_interpreter: impl Fn(u64) -> bool,
    runs_python: impl FnOnce() -> bool,
) -> Cut {
    match frames.iter().position(|&frame| is_eval(frame)) {
        Some(eval) => {
            let below = &frames[..eval];
            match below.iter().rposition(|&frame| !in_interpreter(frame)) {
                Some(foreign) if foreign + 1 < eval => Cut::Gap {
                    end: foreign + 1,
                    eval,
                },
                Some(_) => Cut::Whole,
                None if eval > KEEP_INNER + KEEP_OUTER + 1 => Cut::Ends {
                    outer_from: eval - KEEP_OUTER,
                },
                None => Cut::Whole,
            }
        }
        None if frames.len() >= depth
            && frames.len() > KEEP_INNER + 1
            && frames.iter().all(|&frame| in_interpreter(frame))
            && runs_python() =>
        {
            Cut::Ends {
                outer_from: frames.len(),
            }
        }
        None => Cut::Whole,
    }
}

/// The id `intern` gives `frames` as the merge would keep them (see the module's notes).
pub fn interned_cut(
    runtime: &PythonRuntime,
    frames: &[u64],
    depth: usize,
    intern: impl Fn(&[u64]) -> u32,
) -> u32 {
    let cut = cut_of(
        frames,
        depth,
        |frame| runtime.is_eval(frame),
        |frame| runtime.in_interpreter(frame),
        || runs_python(runtime),
    );
    match cut {
        Cut::Whole => intern(frames),
        Cut::Ends { outer_from } => interned_joined(
            &frames[..KEEP_INNER],
            Some(INTERPRETER_FRAMES_LEFT_OUT),
            &frames[outer_from..],
            intern,
        ),
        Cut::Gap { end, eval } => interned_joined(&frames[..end], None, &frames[eval..], intern),
    }
}

/// The id `intern` gives `inner`, then `marker` (if any), then `outer`. A walk holds at
/// most `MAX_LEVELS` frames, and a cut only takes frames out, so they always fit.
///
/// The list is not zeroed first: zeroing its 2 KiB on every interned cut was a measurable
/// part of each NumPy allocation's cost.
fn interned_joined(
    inner: &[u64],
    marker: Option<u64>,
    outer: &[u64],
    intern: impl Fn(&[u64]) -> u32,
) -> u32 {
    let mut kept = Pushed::<u64, { MAX_LEVELS + 1 }>::new();
    for &word in inner.iter().chain(marker.iter()).chain(outer) {
        kept.push(word);
    }
    intern(kept.as_slice())
}

/// Whether the calling thread is running Python code (has a current frame).
fn runs_python(runtime: &PythonRuntime) -> bool {
    let thread_state = runtime.this_thread_state() as u64;
    if thread_state == 0 {
        return false;
    }
    // SAFETY: fields of the calling thread's live thread state and of its current C frame
    // (the same reads as `python_stack::read_frames`).
    unsafe {
        match runtime.layout.current_frame {
            CurrentFrame::ThroughCFrame {
                cframe,
                current_frame,
            } => {
                let cframe = read_u64(thread_state + cframe as u64);
                cframe != 0 && read_u64(cframe + current_frame as u64) != 0
            }
            CurrentFrame::Direct { current_frame } => {
                read_u64(thread_state + current_frame as u64) != 0
            }
            CurrentFrame::FrameObjects { frame, .. } => read_u64(thread_state + frame as u64) != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Return addresses: 100s the interpreter's, 200s an extension's, 999 the eval loop.
    const EVAL: u64 = 999;
    fn cut(frames: &[u64], depth: usize, python: bool) -> Cut {
        cut_of(
            frames,
            depth,
            |f| f == EVAL,
            |f| (100..200).contains(&f) || f == EVAL,
            || python,
        )
    }

    #[test]
    fn a_long_interpreter_run_below_the_loop_keeps_both_ends() {
        let frames = [100, 101, 102, 103, 104, 105, 106, EVAL];
        assert_eq!(cut(&frames, 64, true), Cut::Ends { outer_from: 5 });
        // Five or fewer gain nothing from the marker.
        assert_eq!(cut(&[100, 101, 102, 103, 104, EVAL], 64, true), Cut::Whole);
    }

    #[test]
    fn an_extension_below_the_loop_keeps_everything_up_to_it() {
        let frames = [100, 200, 101, 201, 102, 103, EVAL];
        assert_eq!(cut(&frames, 64, true), Cut::Gap { end: 4, eval: 6 });
        // Nothing of the interpreter between the extension and the loop: nothing to cut.
        assert_eq!(cut(&[100, 200, EVAL], 64, true), Cut::Whole);
    }

    #[test]
    fn the_kept_parts_are_interned_joined_around_the_marker() {
        let joined = |inner: &[u64], marker, outer: &[u64]| {
            let seen = core::cell::RefCell::new(Vec::new());
            interned_joined(inner, marker, outer, |kept| {
                seen.borrow_mut().extend_from_slice(kept);
                7
            });
            seen.into_inner()
        };
        let left_out = INTERPRETER_FRAMES_LEFT_OUT;
        assert_eq!(
            joined(&[1, 2], Some(left_out), &[5, 6, EVAL]),
            [1, 2, left_out, 5, 6, EVAL]
        );
        assert_eq!(joined(&[1, 200], None, &[EVAL]), [1, 200, EVAL]);
        // Never more than a walk holds, whatever it is given.
        let many = [1u64; MAX_LEVELS + 10];
        assert_eq!(joined(&many, Some(left_out), &many).len(), MAX_LEVELS + 1);
    }

    #[test]
    fn a_walk_stopped_at_its_limit_keeps_the_inner_end_only_on_a_python_thread() {
        let frames: Vec<u64> = (100..164).collect();
        assert_eq!(cut(&frames, 64, true), Cut::Ends { outer_from: 64 });
        assert_eq!(cut(&frames, 64, false), Cut::Whole);
        // Shorter than the limit: the stack ended there; with an extension: kept.
        assert_eq!(cut(&frames[..63], 64, true), Cut::Whole);
        let mut with_extension = frames.clone();
        with_extension[30] = 200;
        assert_eq!(cut(&with_extension, 64, true), Cut::Whole);
    }
}
