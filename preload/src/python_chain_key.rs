//! Interposed call → stack (Python): the key of a thread's 3.11+ frame chain as it stands —
//! each frame's code object, instruction pointer, owner and entry flag — read without
//! looking at any code object. `python_stack` keeps a memo by this key in front of the
//! merge, so that an allocation made again from the same lines and the same C path costs
//! four loads a frame and a hash, not each frame's word (its code's record found, its
//! instruction offset checked) nor the hash of the words.
//!
//! Why a code object's address may stand for it: where code deaths are seen
//! (`python_code_deaths`), no code object dies while the deaths epoch stays the same, so
//! at one epoch an address names one code object; the epoch is part of the key. A frame
//! owned by the C stack (3.12's shim frames) is keyed by its owner alone: what its code
//! pointer holds is never made into a word. Everything else the merge reads — the native
//! stack, the marker, the thread that started this one — is fixed for the key's native id
//! and marker on the thread whose memo holds it.

use crate::python_codes::read_u64;
use crate::python_frame_word::{ChainOffsets, NO_ENTRY_FLAG};
use crate::python_layout::OWNED_BY_CSTACK;
use crate::python_stack_memo::{KeyHash, MergeInputs};
use crate::word_hash::WordHash;

/// Chains longer than this are not keyed (the merge handles them the long way): a key is
/// meant for the loops that allocate most, not for a recursion hundreds of frames deep.
const MAX_KEYED_FRAMES: u32 = 256;

/// The key of the chain from interpreter frame `frame` (non-null) outwards, for native
/// stack `native` and `marker`, at deaths epoch `epoch` (read before any frame was);
/// `None` for a chain too long to key.
///
/// # Safety
/// Called by the thread whose chain it is, inside a hook, with `frame` its current
/// interpreter frame: the chain cannot change while it is read.
#[inline]
pub unsafe fn chain_key(
    at: &ChainOffsets,
    mut frame: u64,
    native: u32,
    marker: u64,
    epoch: u64,
) -> Option<MergeInputs> {
    // Two lanes, so that each chain of hash steps is half as long: the code words and the
    // marks in one, the instruction pointers in the other, joined at the end (a step is a
    // bijection of each, so a frame changed in either lane still changes the key).
    let mut hash = KeyHash::new(native, marker);
    let mut instructions = WordHash::new();
    hash.add(epoch);
    let mut frames = 0u32;
    while frame != 0 {
        if frames == MAX_KEYED_FRAMES {
            return None;
        }
        frames += 1;
        // SAFETY: `frame` is a live interpreter frame of this thread (the chain from its
        // current frame), so its fields are readable.
        let (owner, previous) = unsafe {
            (
                *((frame + at.owner) as *const u8),
                read_u64(frame + at.previous),
            )
        };
        // SAFETY: as above; a bool field of the live frame, where the layout has it.
        let entry = at.entry_flag != NO_ENTRY_FLAG
            && unsafe { *((frame + at.entry_flag) as *const u8) } != 0;
        let marks = u64::from(owner) | (u64::from(entry) << 8);
        if at.shim_frames && owner == OWNED_BY_CSTACK {
            hash.add(marks);
        } else {
            // SAFETY: as above.
            let (code, instruction) =
                unsafe { (read_u64(frame + at.code), read_u64(frame + at.instruction)) };
            hash.add(code ^ marks.rotate_right(16));
            instructions.add(instruction);
        }
        frame = previous;
    }
    hash.add(instructions.finish());
    Some(hash.finish(native))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up frame: owner, code, instruction, previous, entry flag, a word each.
    type Frame = [u64; 5];

    const AT: ChainOffsets = ChainOffsets {
        owner: 0,
        code: 8,
        instruction: 16,
        previous: 24,
        entry_flag: 32,
        shim_frames: false,
        code_units: 0,
    };

    /// Links `frames` innermost first and keys the chain.
    fn key_of(frames: &mut [Frame], at: &ChainOffsets, epoch: u64) -> Option<MergeInputs> {
        for i in (0..frames.len()).rev() {
            let outer = frames.get(i + 1).map_or(0, |frame| frame.as_ptr() as u64);
            frames[i][3] = outer;
        }
        // SAFETY: a chain of live frames of this test, linked just now.
        unsafe { chain_key(at, frames[0].as_ptr() as u64, 7, 0, epoch) }
    }

    fn chain() -> Vec<Frame> {
        vec![
            [0, 0x1000, 0x1040, 0, 0],
            [0, 0x2000, 0x2010, 0, 1],
            [0, 0x3000, 0x3008, 0, 0],
        ]
    }

    #[test]
    fn the_same_chain_at_the_same_epoch_has_the_same_key() {
        let key = key_of(&mut chain(), &AT, 4);
        assert!(key.is_some());
        assert_eq!(key, key_of(&mut chain(), &AT, 4));
    }

    #[test]
    fn any_frame_field_or_the_epoch_makes_another_key() {
        let key = key_of(&mut chain(), &AT, 4);
        assert_ne!(key, key_of(&mut chain(), &AT, 5), "another epoch");
        for (frame, field) in [(2, 2), (2, 1), (1, 4), (0, 0)] {
            let mut changed = chain();
            changed[frame][field] ^= 1;
            assert_ne!(
                key,
                key_of(&mut changed, &AT, 4),
                "frame {frame} field {field}"
            );
        }
        let mut shorter = chain();
        shorter.pop();
        assert_ne!(key, key_of(&mut shorter, &AT, 4), "one frame fewer");
    }

    #[test]
    fn a_shim_frame_is_keyed_by_its_owner_alone() {
        let shims = ChainOffsets {
            entry_flag: NO_ENTRY_FLAG,
            shim_frames: true,
            ..AT
        };
        let mut with_shim = chain();
        with_shim[1][0] = u64::from(OWNED_BY_CSTACK);
        let key = key_of(&mut with_shim, &shims, 4);
        with_shim[1][1] = 0x9999;
        with_shim[1][2] = 0x9998;
        assert_eq!(key, key_of(&mut with_shim, &shims, 4));
        with_shim[1][0] = 0;
        assert_ne!(key, key_of(&mut with_shim, &shims, 4));
    }

    #[test]
    fn a_chain_too_long_has_no_key() {
        let mut long = vec![[0, 0x1000, 0x1002, 0, 0]; MAX_KEYED_FRAMES as usize + 1];
        assert_eq!(key_of(&mut long, &AT, 1), None);
        long.pop();
        assert!(key_of(&mut long, &AT, 1).is_some());
    }
}
