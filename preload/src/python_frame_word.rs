//! Interposed call → event (Python): the frame word of one frame of a 3.11+ frame chain —
//! its code object's record and its instruction offset — for `python_stack`'s walk. A code
//! object this thread met since the last code object died is known from its per-thread
//! cache (`python_code_cache`) without reading the object; any other is read and looked up
//! in the shared table (`python_codes`).

use crate::python_code_cache::{CodeCache, Known};
use crate::python_codes::read_u64;
use crate::python_layout::{EntryMark, PyLayout, OBJECT_TYPE, OWNED_BY_GENERATOR};
use crate::python_runtime::PythonRuntime;
use crate::recorder::Recorder;

/// `ChainOffsets::entry_flag` of a layout without the flag.
pub const NO_ENTRY_FLAG: u64 = u64::MAX;

/// What the walk of a 3.11+ frame chain reads, as plain numbers: the compiler keeps them in
/// registers for the whole chain rather than going back to the layout for each frame.
pub struct ChainOffsets {
    pub owner: u64,
    pub code: u64,
    pub instruction: u64,
    pub previous: u64,
    /// Where a frame's `is_entry` flag is (3.11), or [`NO_ENTRY_FLAG`].
    pub entry_flag: u64,
    /// Each native evaluation call pushes a frame owned by the C stack first (3.12+).
    pub shim_frames: bool,
    /// Where a code object's instructions start.
    pub code_units: u64,
}

impl ChainOffsets {
    pub fn of(l: &PyLayout) -> ChainOffsets {
        ChainOffsets {
            owner: l.frame_owner as u64,
            code: l.frame_code as u64,
            instruction: l.frame_instruction as u64,
            previous: l.frame_previous as u64,
            entry_flag: match l.entry {
                EntryMark::IsEntryFlag(offset) => offset as u64,
                _ => NO_ENTRY_FLAG,
            },
            shim_frames: l.entry == EntryMark::CStackOwner,
            code_units: l.code_units as u64,
        }
    }
}

/// The frame word of a frame running `code`, or `None` for a frame that has not started
/// (CPython's "incomplete" frames: arguments still being set up) or whose code pointer is
/// not a code object's.
///
/// # Safety
/// `code` is the non-null code pointer of a live frame of the calling thread.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn frame_word(
    runtime: &PythonRuntime,
    recorder: &Recorder,
    codes: &mut CodeCache,
    at: &ChainOffsets,
    deaths: Option<u64>,
    code: u64,
    owner: u8,
    instruction: u64,
) -> Option<u64> {
    // A code object this thread met at this deaths epoch is still there, the same one.
    let known = match deaths.and_then(|epoch| codes.known(code, epoch)) {
        Some(known) => known,
        // SAFETY: the caller's contract.
        None => unsafe { code_unknown(runtime, recorder, codes, deaths, code) }?,
    };
    let units = code + at.code_units;
    if instruction < units {
        return None;
    }
    let offset_bytes = instruction - units;
    if owner != OWNED_BY_GENERATOR && offset_bytes < known.first_traceable_bytes {
        return None;
    }
    Some(known.word_at((offset_bytes / 2).min(u64::from(u32::MAX)) as u32))
}

/// What [`CodeCache::known`] would say of a code object this thread has not met at this
/// deaths epoch (or of any, where deaths are not seen): from the shared table, which gets
/// its record first if it is new. `None` when `code` is not a code object or the table is
/// full.
///
/// # Safety
/// As [`frame_word`].
#[cold]
#[inline(never)]
unsafe fn code_unknown(
    runtime: &PythonRuntime,
    recorder: &Recorder,
    codes: &mut CodeCache,
    deaths: Option<u64>,
    code: u64,
) -> Option<Known> {
    let l = runtime.layout;
    // SAFETY: the object header of what the live frame points to.
    if unsafe { read_u64(code + OBJECT_TYPE as u64) } != runtime.code_type {
        return None;
    }
    // SAFETY: an int field of the live code object (its type was just checked).
    let first_traceable =
        unsafe { ((code + l.code_first_traceable as u64) as *const i32).read_unaligned() };
    // SAFETY: `code` is a live code object of this layout (its type was checked).
    let index = unsafe {
        codes.index_of(
            &runtime.codes,
            &recorder.file,
            l,
            code,
            deaths,
            first_traceable,
        )
    }?;
    Some(Known::new(index, first_traceable))
}
