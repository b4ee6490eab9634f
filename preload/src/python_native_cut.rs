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
//!   Python: the two innermost, then the marker;
//! - far below the innermost evaluation loop (more than [`FAR_BELOW_PYTHON`] bytes of stack
//!   away), when the four innermost addresses are the interpreter's: the two innermost, then
//!   the marker, whatever lies further out. The walk stops after those four
//!   ([`BelowPython::ends_walk`]): walking on through the parser's recursion to the loop,
//!   frame by frame, was most of the cost of profiling `compile()` and imports from source,
//!   for two addresses at the outer end. An extension's function that called into the
//!   interpreter that far up is not shown either; the Python line that called it is.
//!
//! Any other stack (no Python on the thread, a start-up stack) is interned whole.

use core::cell::OnceCell;

use memwarden_abi::python::INTERPRETER_FRAMES_LEFT_OUT;

use crate::pushed::Pushed;
use crate::python_codes::read_u64;
use crate::python_layout::CurrentFrame;
use crate::python_runtime::PythonRuntime;
use crate::stack_prefix::MAX_LEVELS;
use crate::thread_state::Guard;

/// Return addresses kept at the inner end of a run of the interpreter's frames below the
/// innermost Python frame: the allocating function and its caller (`list_resize` under
/// `PyList_Append`, the compiler's `compiler_next_instr` under the `compiler_addop…` that
/// grew its code).
pub const KEEP_INNER: usize = 2;
/// Return addresses kept at the outer end of such a run: the C function the Python line
/// called (`builtin_compile`) and the one it called.
pub const KEEP_OUTER: usize = 2;
/// Return addresses of the interpreter a walk finds before it knows a run of them is one to
/// cut: the two kept and two more. A shorter run reaches the evaluation loop within them.
pub const RUN_SEEN: usize = KEEP_INNER + 2;
/// Bytes of stack between a call and the innermost evaluation loop's C frame past which a
/// run of the interpreter's frames below the Python line keeps only its inner end. On the
/// imports benchmark, 98% of the allocations that begin with such a run lie more than
/// 1 KiB below the loop, 78% 1–3 KiB (the parser's and the compiler's recursion); an
/// extension's or the interpreter's C function calling the C API lies a few hundred bytes
/// below it, unless its own frames are large (a ctypes call through libffi lies 1–2 KiB
/// below, and loses its frames to the marker).
pub const FAR_BELOW_PYTHON: u64 = 1024;

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

/// Whether a call is far below the calling thread's Python frames: more than
/// [`FAR_BELOW_PYTHON`] bytes of stack below its innermost evaluation loop. Found once per
/// captured stack, and only if asked, for the walk and the cut to agree.
pub struct BelowPython<'a> {
    runtime: &'a PythonRuntime,
    guard: &'a Guard,
    /// The stack pointer of the call whose stack is captured.
    sp: u64,
    far: OnceCell<bool>,
}

impl<'a> BelowPython<'a> {
    pub fn new(runtime: &'a PythonRuntime, guard: &'a Guard, sp: u64) -> Self {
        BelowPython {
            runtime,
            guard,
            sp,
            far: OnceCell::new(),
        }
    }

    /// Whether a walk that has found `frames` so far goes no further: they are
    /// [`RUN_SEEN`] of the interpreter's return addresses, and the call is far below
    /// Python, so the cut keeps the first two and the marker whatever lies beyond.
    #[inline(always)]
    pub fn ends_walk(&self, frames: &[u64]) -> bool {
        frames.len() == RUN_SEEN
            && begins_with_run(
                frames,
                |frame| self.runtime.is_eval(frame),
                |frame| self.runtime.in_interpreter(frame),
            )
            && self.far()
    }

    fn far(&self) -> bool {
        *self.far.get_or_init(|| {
            let Some(loop_frame) = innermost_loop_frame(self.runtime) else {
                return false;
            };
            loop_frame > self.sp.saturating_add(FAR_BELOW_PYTHON)
                && loop_frame < self.guard.stack_top(self.sp)
        })
    }
}

/// An address inside the C frame of the calling thread's innermost evaluation loop, where
/// the interpreter says it: on 3.11 and 3.12, `tstate->cframe` points at a local of
/// `_PyEval_EvalFrameDefault` while it runs (and into the thread state when none does).
/// `None` on other versions, which say it in no single word.
fn innermost_loop_frame(runtime: &PythonRuntime) -> Option<u64> {
    let CurrentFrame::ThroughCFrame { cframe, .. } = runtime.layout.current_frame else {
        return None;
    };
    let thread_state = runtime.this_thread_state() as u64;
    if thread_state == 0 {
        return None;
    }
    // SAFETY: a field of the calling thread's live thread state.
    Some(unsafe { read_u64(thread_state + cframe as u64) })
}

/// Whether `frames` begin with [`RUN_SEEN`] return addresses of the interpreter's own code,
/// none of them its evaluation loop.
fn begins_with_run(
    frames: &[u64],
    is_eval: impl Fn(u64) -> bool,
    in_interpreter: impl Fn(u64) -> bool,
) -> bool {
    frames.len() >= RUN_SEEN
        && frames[..RUN_SEEN]
            .iter()
            .all(|&frame| in_interpreter(frame) && !is_eval(frame))
}

/// What the merge would keep of `frames` (innermost first, as the walk found them, `depth`
/// being its limit). `is_eval` and `in_interpreter` classify a return address;
/// `runs_python` says whether the thread has Python frames (asked only for a walk that
/// stopped at its limit inside the interpreter); `far_below_python` whether the call is far
/// below its innermost evaluation loop (asked only when the frames begin with a run of the
/// interpreter's).
fn cut_of(
    frames: &[u64],
    depth: usize,
    is_eval: impl Fn(u64) -> bool,
    in_interpreter: impl Fn(u64) -> bool,
    runs_python: impl FnOnce() -> bool,
    far_below_python: impl FnOnce() -> bool,
) -> Cut {
    if begins_with_run(frames, &is_eval, &in_interpreter) && far_below_python() {
        // What a walk that stopped after `RUN_SEEN` frames keeps (`BelowPython::ends_walk`),
        // whether this one did or went on (it resumed from an earlier walk, or was memoized).
        return Cut::Ends {
            outer_from: frames.len(),
        };
    }
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
    below: &BelowPython,
    frames: &[u64],
    depth: usize,
    intern: impl Fn(&[u64]) -> u32,
) -> u32 {
    let runtime = below.runtime;
    let cut = cut_of(
        frames,
        depth,
        |frame| runtime.is_eval(frame),
        |frame| runtime.in_interpreter(frame),
        || runs_python(runtime),
        || below.far(),
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
        cut_far(frames, depth, python, false)
    }

    fn cut_far(frames: &[u64], depth: usize, python: bool, far: bool) -> Cut {
        cut_of(
            frames,
            depth,
            |f| f == EVAL,
            |f| (100..200).contains(&f) || f == EVAL,
            || python,
            || far,
        )
    }

    #[test]
    fn far_below_python_a_run_of_four_keeps_its_inner_end_whatever_lies_beyond() {
        let inner_end = |frames: &[u64]| Cut::Ends {
            outer_from: frames.len(),
        };
        // A walk that stopped after four, one that went on to the loop, one that met an
        // extension further out: all keep the two innermost and the marker.
        for frames in [
            &[100, 101, 102, 103][..],
            &[100, 101, 102, 103, 104, 105, 106, EVAL],
            &[100, 101, 102, 103, 200, 104, EVAL],
        ] {
            assert_eq!(
                cut_far(frames, 64, true, true),
                inner_end(frames),
                "{frames:?}"
            );
        }
        // Near the loop, the same frames are cut as before.
        assert_eq!(
            cut_far(&[100, 101, 102, 103, 104, 105, 106, EVAL], 64, true, false),
            Cut::Ends { outer_from: 5 }
        );
        assert_eq!(
            cut_far(&[100, 101, 102, 103, 200, 104, EVAL], 64, true, false),
            Cut::Gap { end: 5, eval: 6 }
        );
        // Far, but an extension or the loop among the first four: the other rules.
        assert_eq!(
            cut_far(&[100, 200, 101, 102, 103, 104, EVAL], 64, true, true),
            Cut::Gap { end: 2, eval: 6 }
        );
        assert_eq!(cut_far(&[100, 101, 102, EVAL], 64, true, true), Cut::Whole);
    }

    #[test]
    fn a_run_begins_with_four_of_the_interpreters_frames_none_its_loop() {
        let run = |frames: &[u64]| {
            begins_with_run(
                frames,
                |f| f == EVAL,
                |f| (100..200).contains(&f) || f == EVAL,
            )
        };
        assert!(run(&[100, 101, 102, 103]));
        assert!(run(&[100, 101, 102, 103, 200]));
        assert!(!run(&[100, 101, 102]));
        assert!(!run(&[100, 101, 102, EVAL]));
        assert!(!run(&[100, 200, 102, 103]));
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
