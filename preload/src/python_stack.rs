//! Interposed call → event (Python): puts the calling thread's Python frames into its native
//! stack. Each native `_PyEval_EvalFrameDefault` frame runs one or more Python frames (since
//! 3.11 a Python-to-Python call stays in the same native call); the thread's frame chain
//! says which, so each such native frame is replaced by its Python frames, innermost first:
//!
//! ```text
//! native:  malloc-caller  list_resize  _PyEval_EvalFrameDefault
//! merged:  malloc-caller  list_resize  work.py:12 (fill)  work.py:30 (main)  …  work.py:41 (<module>)
//! ```
//!
//! The native walk stops at the innermost evaluation loop (`unwind::runs_python`): what lies
//! above it is the interpreter calling itself, which the report would hide, and walking it
//! for every allocation is most of the cost of a stack. So the native frames kept are those
//! below the innermost Python frame — what allocated, in C — less the interpreter's calling
//! machinery right under the Python line when an extension's function (NumPy's, a ctypes
//! target) sits below it, or the middle of a long run of the interpreter's own frames
//! (its parser's and compiler's recursion) when nothing else does. A C function between two
//! Python frames (a callback's caller) is not shown.

use memwarden_abi::python::{self, python_frame};
use memwarden_abi::MAX_DEPTH_LIMIT;

use crate::own_stack::on_own_stack;
use crate::pushed::Pushed;
use crate::python_chain_key::chain_key;
use crate::python_code_cache::CodeCache;
use crate::python_code_deaths;
use crate::python_codes::read_u64;
use crate::python_frame_word::{frame_word, NO_ENTRY_FLAG};
use crate::python_layout::{CurrentFrame, OBJECT_TYPE, OWNED_BY_CSTACK};
use crate::python_native_cut::{KEEP_INNER, KEEP_OUTER};
use crate::python_runtime::{self, PythonRuntime};
use crate::python_stack_memo::MergeInputs;
use crate::recorder::Recorder;
use crate::thread_state::Guard;
use crate::thread_unwinder::{with_chain_memo, with_code_cache, with_merged_memo};

const MAX_DEPTH: usize = MAX_DEPTH_LIMIT as usize;
/// Frames followed at most along one chain (a bound should the chain ever be corrupt).
const MAX_CHAIN: usize = 4096;

/// The Python frames of the calling thread as frame words, innermost first, cut into the
/// groups each native evaluation call runs.
struct PythonFrames {
    words: Pushed<u64, MAX_DEPTH>,
    /// One past the last word of each group.
    group_ends: Pushed<u16, MAX_DEPTH>,
}

impl PythonFrames {
    fn new() -> Self {
        PythonFrames {
            words: Pushed::new(),
            group_ends: Pushed::new(),
        }
    }

    fn count(&self) -> usize {
        self.words.len()
    }

    fn groups(&self) -> usize {
        self.group_ends.len()
    }

    fn push(&mut self, word: u64) {
        self.words.push(word);
    }

    fn end_group(&mut self) {
        self.group_ends.push(self.words.len() as u16);
    }

    fn group(&self, g: usize) -> &[u64] {
        let ends = self.group_ends.as_slice();
        let start = if g == 0 { 0 } else { ends[g - 1] as usize };
        &self.words.as_slice()[start..ends[g] as usize]
    }
}

/// A stack being assembled.
type Merged = Pushed<u64, MAX_DEPTH>;

/// The stack to record for an allocation whose native stack is `native`: with the thread's
/// Python frames put in, and `marker` (if any) as frame 0. A chain met before at the same
/// deaths epoch with the same native stack and marker is found by its key
/// (`python_chain_key`) without being merged again.
#[inline]
pub fn with_python_frames(
    recorder: &Recorder,
    guard: &Guard,
    native: u32,
    marker: Option<u64>,
) -> u32 {
    let runtime = python_runtime::runtime();
    // Read before any frame: a code object dying after it cannot be one these frames hold.
    let deaths = python_code_deaths::tracked().then(python_code_deaths::epoch);
    // SAFETY: the calling thread reads its own thread state.
    let start = runtime.map_or(ChainStart::Empty, |runtime| unsafe { chain_start(runtime) });
    let key = match (runtime, start, deaths) {
        // SAFETY: `first` is this thread's current interpreter frame, read just now.
        (Some(runtime), ChainStart::Frames(first), Some(epoch)) => unsafe {
            chain_key(&runtime.chain, first, native, marker.unwrap_or(0), epoch)
        },
        _ => None,
    };
    if let Some(merged) = key.and_then(|key| with_chain_memo(guard, |memo| memo.get(&key))) {
        return merged;
    }
    let missed = ChainMiss {
        runtime,
        start,
        deaths,
        native,
        marker,
    };
    let merged = merge_on_own_stack(recorder, guard, missed);
    if let Some(key) = key.filter(|_| merged != memwarden_abi::UNKNOWN_STACK_ID) {
        with_chain_memo(guard, |memo| memo.put(&key, merged));
    }
    merged
}

/// [`merge`] on the thread's own stack, since its frame lists take kilobytes of it. Out of
/// line, so that a key found in the memo leaves a small frame on the caller's stack.
#[cold]
#[inline(never)]
fn merge_on_own_stack(recorder: &Recorder, guard: &Guard, missed: ChainMiss<'_>) -> u32 {
    on_own_stack(guard, || merge(recorder, guard, missed))
}

/// What [`merge`] works from when a chain's key was not in the memo: the chain as
/// [`with_python_frames`] found it, and the native stack beneath.
#[derive(Clone, Copy)]
struct ChainMiss<'a> {
    runtime: Option<&'a PythonRuntime>,
    start: ChainStart,
    /// The code deaths' epoch read before the chain, when deaths are tracked.
    deaths: Option<u64>,
    native: u32,
    marker: Option<u64>,
}

/// [`with_python_frames`]'s work when the chain's key is not in the memo: the Python
/// frames from `start` read into words, and merged with the native frames. Never inlined:
/// its frame lists take 4.7 KiB of stack, whose probe and spills a key found in the memo
/// would otherwise pay on every allocation (3.7% fewer first-level data-cache misses in the
/// small-array loop, cachegrind).
#[inline(never)]
fn merge(recorder: &Recorder, guard: &Guard, missed: ChainMiss<'_>) -> u32 {
    let ChainMiss {
        runtime,
        start,
        deaths,
        native,
        marker,
    } = missed;
    let mut python = PythonFrames::new();
    if let Some(runtime) = runtime {
        with_code_cache(guard, |codes| {
            // SAFETY: the calling thread reads its own frames, from its chain's start.
            unsafe { read_frames(runtime, recorder, codes, start, deaths, &mut python) }
        });
    }
    if python.count() == 0 {
        if let Some(creator) = guard.thread_creator() {
            return started_by(recorder, native, marker, creator);
        }
        if marker.is_none() {
            return native;
        }
    }
    let inputs = MergeInputs::new(
        native,
        marker.unwrap_or(0),
        python.words.as_slice(),
        python.group_ends.as_slice(),
    );
    if let Some(merged) = with_merged_memo(guard, |memo| memo.get(&inputs)) {
        return merged;
    }
    let mut merged = Merged::new();
    if let Some(marker) = marker {
        merged.push(marker);
    }
    let native_frames = recorder.frames_of(native);
    let Some(runtime) = runtime.filter(|_| python.count() != 0) else {
        native_frames.iter().for_each(|&frame| merged.push(frame));
        return remembered(guard, &inputs, recorder.intern(merged.as_slice()));
    };
    let first_native = merged.len();
    let mut group = 0;
    let mut seen_python = false;
    let mut outermost_python = 0;
    // Below the innermost Python frame: one past the last frame outside the interpreter.
    let mut after_foreign = None;
    for &frame in native_frames {
        if runtime.is_eval(frame) && group < python.groups() {
            let words = python.group(group);
            if !words.is_empty() && !seen_python {
                // The interpreter's calling machinery between an extension's C function
                // (or the allocator) and the Python line that called it says nothing.
                match after_foreign {
                    Some(end) => merged.truncate(end),
                    None => leave_out_middle(&mut merged, first_native, KEEP_OUTER),
                }
            }
            words.iter().for_each(|&word| merged.push(word));
            if !words.is_empty() {
                seen_python = true;
                outermost_python = merged.len();
            }
            group += 1;
            continue;
        }
        // The marker stands for interpreter frames the native stack was interned without
        // (`python_native_cut`).
        let interpreter =
            frame == python::INTERPRETER_FRAMES_LEFT_OUT || runtime.in_interpreter(frame);
        if seen_python && interpreter {
            continue;
        }
        merged.push(frame);
        if !seen_python && !interpreter {
            after_foreign = Some(merged.len());
        }
    }
    // The native walk stops at the innermost evaluation loop (or its depth limit): the
    // Python frames of every outer evaluation call go on top. A walk that stopped short
    // of the loop inside the interpreter (its parser's recursion is deeper than the
    // limit) ends at no frame worth keeping.
    if !seen_python && after_foreign.is_none() {
        leave_out_middle(&mut merged, first_native, 0);
    }
    while group < python.groups() {
        let words = python.group(group);
        words.iter().for_each(|&word| merged.push(word));
        if !words.is_empty() {
            outermost_python = merged.len();
        }
        group += 1;
    }
    merged.truncate(outermost_python);
    remembered(guard, &inputs, recorder.intern(merged.as_slice()))
}

/// Puts the `INTERPRETER_FRAMES_LEFT_OUT` marker in place of the middle of the run of the
/// interpreter's return addresses from `start` to the end of `merged`, keeping
/// [`KEEP_INNER`] of them at its inner end and `keep_outer` at its outer end. The
/// interpreter's parser and compiler recurse as deep as the source they read: kept whole,
/// their frames make a distinct stack of nearly every allocation under `compile()` or an
/// import from source, each as long as the recursion, which the Python line says better.
/// A native stack interned since Python was found arrives cut already
/// (`python_native_cut`, the same rule), and this leaves it as it is; it cuts those
/// interned before, which the walk's memo can still hand out.
fn leave_out_middle(merged: &mut Merged, start: usize, keep_outer: usize) {
    let run = merged.len().saturating_sub(start);
    if run > KEEP_INNER + keep_outer + 1 {
        merged.replace_with(
            start + KEEP_INNER,
            merged.len() - keep_outer,
            python::INTERPRETER_FRAMES_LEFT_OUT,
        );
    }
}

/// `merged`, kept in the memo as what `inputs` make (unless the table had no room).
fn remembered(guard: &Guard, inputs: &MergeInputs, merged: u32) -> u32 {
    if merged != memwarden_abi::UNKNOWN_STACK_ID {
        with_merged_memo(guard, |memo| memo.put(inputs, merged));
    }
    merged
}

/// The stack of a thread without Python frames that Python code started: its own frames up
/// to memwarden's thread launcher, then the stack that started it.
fn started_by(recorder: &Recorder, native: u32, marker: Option<u64>, creator: u32) -> u32 {
    let mut merged = Merged::new();
    if let Some(marker) = marker {
        merged.push(marker);
    }
    let own = crate::snapshot::snapshot();
    for &frame in recorder.frames_of(native) {
        if own.is_some_and(|snapshot| snapshot.is_own(frame)) {
            break;
        }
        merged.push(frame);
    }
    for &frame in recorder.frames_of(creator) {
        merged.push(frame);
    }
    recorder.intern(merged.as_slice())
}

/// Where the calling thread's frame chain starts.
#[derive(Clone, Copy)]
enum ChainStart {
    /// No thread state, or no frame running.
    Empty,
    /// The current interpreter frame of a 3.11+ chain.
    Frames(u64),
    /// The current frame object of a 3.9 or 3.10 chain, and its `f_lasti` scale.
    FrameObjects { first: u64, lasti_scale: u64 },
}

/// Where the calling thread's frame chain starts.
///
/// # Safety
/// Called by the thread whose chain it is, inside a hook.
unsafe fn chain_start(runtime: &PythonRuntime) -> ChainStart {
    let thread_state = runtime.this_thread_state() as u64;
    if thread_state == 0 {
        return ChainStart::Empty;
    }
    // SAFETY: fields of this thread's live thread state and of its current C frame.
    let first = unsafe {
        match runtime.layout.current_frame {
            CurrentFrame::ThroughCFrame {
                cframe,
                current_frame,
            } => {
                let cframe = read_u64(thread_state + cframe as u64);
                if cframe == 0 {
                    return ChainStart::Empty;
                }
                read_u64(cframe + current_frame as u64)
            }
            CurrentFrame::Direct { current_frame } => read_u64(thread_state + current_frame as u64),
            CurrentFrame::FrameObjects { frame, lasti_scale } => {
                return ChainStart::FrameObjects {
                    first: read_u64(thread_state + frame as u64),
                    lasti_scale,
                };
            }
        }
    };
    match first {
        0 => ChainStart::Empty,
        first => ChainStart::Frames(first),
    }
}

/// Reads the calling thread's frame chain from `start` into `out`; `deaths` is the deaths
/// epoch read before `start` was, if deaths are seen.
///
/// # Safety
/// Called by the thread whose frames are read, inside a hook, with `start` read by it
/// there: its frames cannot change while it is here, and each frame keeps its code object
/// alive.
unsafe fn read_frames(
    runtime: &PythonRuntime,
    recorder: &Recorder,
    codes: &mut CodeCache,
    start: ChainStart,
    deaths: Option<u64>,
    out: &mut PythonFrames,
) {
    let mut frame = match start {
        ChainStart::Empty => return,
        ChainStart::Frames(first) => first,
        ChainStart::FrameObjects { first, lasti_scale } => {
            // SAFETY: the caller's contract.
            return unsafe {
                read_frame_objects(runtime, recorder, codes, deaths, first, lasti_scale, out)
            };
        }
    };
    let at = &runtime.chain;
    let mut followed = 0;
    while frame != 0 && followed < MAX_CHAIN {
        followed += 1;
        // SAFETY: `frame` is a live interpreter frame of this thread (the chain from its
        // current frame), so its fields are readable.
        let (owner, code, instruction, previous) = unsafe {
            (
                *((frame + at.owner) as *const u8),
                read_u64(frame + at.code),
                read_u64(frame + at.instruction),
                read_u64(frame + at.previous),
            )
        };
        if at.shim_frames && owner == OWNED_BY_CSTACK {
            out.end_group();
            frame = previous;
            continue;
        }
        if code != 0 {
            // SAFETY: `code` is the live frame's code pointer.
            let word = unsafe {
                frame_word(
                    runtime,
                    recorder,
                    codes,
                    at,
                    deaths,
                    code,
                    owner,
                    instruction,
                )
            };
            if let Some(word) = word {
                out.push(word);
            }
        }
        // SAFETY: a bool field of the live frame.
        if at.entry_flag != NO_ENTRY_FLAG && unsafe { *((frame + at.entry_flag) as *const u8) } != 0
        {
            out.end_group();
        }
        frame = previous;
    }
    let ended = out
        .group_ends
        .as_slice()
        .last()
        .map_or(0, |&end| end as usize);
    if ended < out.count() {
        out.end_group();
    }
}

/// 3.9 and 3.10: each `PyFrameObject` of the chain is run by its own native evaluation
/// call, so each is a group of one; its line is asked of CPython now (these versions' line
/// tables are not decoded by the reader).
///
/// # Safety
/// As [`read_frames`]; `frame` is the thread's current frame object (or null).
unsafe fn read_frame_objects(
    runtime: &PythonRuntime,
    recorder: &Recorder,
    codes: &mut CodeCache,
    deaths: Option<u64>,
    mut frame: u64,
    lasti_scale: u64,
    out: &mut PythonFrames,
) {
    let l = runtime.layout;
    let mut followed = 0;
    while frame != 0 && followed < MAX_CHAIN {
        followed += 1;
        // SAFETY: a live frame object of this thread's chain.
        let (code, lasti, back) = unsafe {
            (
                read_u64(frame + l.frame_code as u64),
                ((frame + l.frame_instruction as u64) as *const i32).read_unaligned(),
                read_u64(frame + l.frame_previous as u64),
            )
        };
        // SAFETY: a code object's type word, read only after the null check.
        if code != 0 && unsafe { read_u64(code + OBJECT_TYPE as u64) } == runtime.code_type {
            let byte_offset = lasti.saturating_mul(lasti_scale as i32);
            // SAFETY: `code` is live (the frame holds it) and of this layout.
            let line = unsafe { runtime.line_of(code, byte_offset) };
            // SAFETY: as above.
            let index =
                unsafe { codes.index_of(&runtime.codes, &recorder.file, l, code, deaths, 0) };
            if let (Some(line), Some(index)) = (line, index) {
                out.push(python_frame(index, line, true));
            }
        }
        out.end_group();
        frame = back;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(words: core::ops::Range<u64>) -> Merged {
        let mut merged = Merged::new();
        words.for_each(|word| merged.push(word));
        merged
    }

    #[test]
    fn a_long_run_keeps_both_ends_around_the_marker() {
        // A NumPy marker at 0, then ten of the interpreter's return addresses.
        let mut stack = merged(100..111);
        leave_out_middle(&mut stack, 1, KEEP_OUTER);
        let left_out = python::INTERPRETER_FRAMES_LEFT_OUT;
        assert_eq!(stack.as_slice(), [100, 101, 102, left_out, 109, 110]);
    }

    #[test]
    fn a_walk_cut_short_keeps_only_the_inner_end() {
        let mut stack = merged(0..70);
        leave_out_middle(&mut stack, 0, 0);
        let left_out = python::INTERPRETER_FRAMES_LEFT_OUT;
        assert_eq!(stack.as_slice(), [0, 1, left_out]);
    }

    #[test]
    fn a_run_no_longer_than_what_it_would_keep_stays_whole() {
        // Two kept inside, two outside, and the marker: five frames or fewer gain nothing.
        for len in 0..=5 {
            let mut stack = merged(0..len);
            leave_out_middle(&mut stack, 0, KEEP_OUTER);
            assert_eq!(stack.as_slice(), (0..len).collect::<Vec<_>>());
        }
        let mut stack = merged(0..6);
        leave_out_middle(&mut stack, 0, KEEP_OUTER);
        assert_eq!(stack.len(), 5);
    }
}
