//! Event: memwarden's own header in front of every tracked block — the stack that allocated
//! it, its requested size, and where glibc's block starts — so that a free finds its stack
//! with no lookup. glibc's chunk layout is never read: a block memwarden did not track (made
//! before start-up, while re-entered, or after tracking stopped) has no header, which a
//! check word tells apart, and goes back to glibc untouched.
//!
//! ```text
//! glibc block: [ padding (offset − 16) | word0 | word1 | user data … ]
//!                                               ^ pointer given to the program
//! word0 = size (48 bits) | log2(offset) (6 bits)
//! word1 = stack id (24 bits) | check (40 bits) = mix(pointer, word0, stack) >> 24
//! ```

use core::ffi::c_void;

/// Bytes of header before the user pointer (keeps glibc's 16-byte alignment).
pub const HEADER_SIZE: usize = 16;
/// Largest size a header can hold; larger blocks go untracked.
pub const MAX_TRACKED_SIZE: u64 = (1 << 48) - 1;
/// Stack ids that fit a header.
pub const MAX_STACK_ID: u32 = (1 << 24) - 1;

const SIZE_MASK: u64 = MAX_TRACKED_SIZE;
const OFFSET_SHIFT: u32 = 48;
const STACK_BITS: u32 = 24;

/// A tracked block, as its header describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    pub stack: u32,
    pub size: u64,
    /// The pointer glibc returned (what must be given back to glibc).
    pub base: *mut c_void,
    /// Bytes from `base` to the user pointer: 16, or the alignment of an aligned block.
    pub offset: usize,
}

fn check_bits(user: u64, word0: u64, stack: u64) -> u64 {
    let mut mixed = user ^ word0.rotate_left(17) ^ stack.rotate_left(41) ^ 0x6d77_6172_6465_6e21;
    mixed = (mixed ^ (mixed >> 31)).wrapping_mul(0x7fb5_d329_728e_a185);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x81da_def4_bc2d_d44d);
    (mixed ^ (mixed >> 33)) >> STACK_BITS
}

/// Writes the header for a block of `size` requested bytes at `base` + `offset`, returning
/// the user pointer.
///
/// # Safety
/// `base` came from glibc with room for `offset + size` bytes; `offset` is a power of two
/// ≥ 16 (so the header fits before the user pointer); `size <= MAX_TRACKED_SIZE`;
/// `stack <= MAX_STACK_ID`.
pub unsafe fn write(base: *mut c_void, offset: usize, size: u64, stack: u32) -> *mut c_void {
    debug_assert!(offset >= HEADER_SIZE && offset.is_power_of_two());
    // SAFETY: offset is within the block (caller contract).
    let user = unsafe { base.cast::<u8>().add(offset) };
    let word0 = size | (u64::from(offset.trailing_zeros()) << OFFSET_SHIFT);
    let stack = u64::from(stack);
    let word1 = stack | (check_bits(user as u64, word0, stack) << STACK_BITS);
    // SAFETY: the 16 bytes before `user` lie inside the block (offset ≥ 16), 8-aligned.
    unsafe {
        let words = user.cast::<u64>().sub(2);
        words.write(word0);
        words.add(1).write(word1);
    }
    user.cast()
}

/// The header of `user`, if it is a block memwarden tracked.
///
/// # Safety
/// `user` is non-null and came from the malloc family (so the 16 bytes before it are
/// readable: either memwarden's header or glibc's own chunk header).
#[inline]
pub unsafe fn read(user: *mut c_void) -> Option<Tracked> {
    // SAFETY: the caller guarantees the 16 bytes before `user` are readable.
    let (word0, word1) = unsafe {
        let words = user.cast::<u64>().sub(2);
        (words.read_unaligned(), words.add(1).read_unaligned())
    };
    let stack = word1 & u64::from(MAX_STACK_ID);
    if word1 >> STACK_BITS != check_bits(user as u64, word0, stack) {
        return None;
    }
    let offset = 1usize.checked_shl(((word0 >> OFFSET_SHIFT) & 0x3f) as u32)?;
    Some(Tracked {
        stack: stack as u32,
        size: word0 & SIZE_MASK,
        base: (user as usize).checked_sub(offset)? as *mut c_void,
        offset,
    })
}

/// Erases the header of a block about to go back to glibc, so a stale copy can never pass
/// the check.
///
/// # Safety
/// `user` is a tracked block (its header was just read).
pub unsafe fn erase(user: *mut c_void) {
    // SAFETY: the header words lie inside the block (tracked, so offset ≥ 16).
    unsafe { user.cast::<u64>().sub(1).write(0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let mut block = [0u64; 16];
        let base = block.as_mut_ptr().cast::<c_void>();
        // SAFETY: the array has room for a 16-byte header and 64 bytes of data.
        let user = unsafe { write(base, 16, 12345, 77) };
        // SAFETY: user points 16 bytes into the array.
        let tracked = unsafe { read(user) }.unwrap();
        assert_eq!(
            tracked,
            Tracked {
                stack: 77,
                size: 12345,
                base,
                offset: 16
            }
        );
        // SAFETY: as above.
        unsafe { erase(user) };
        // SAFETY: as above.
        assert!(unsafe { read(user) }.is_none());
    }

    #[test]
    fn aligned_offsets_round_trip() {
        let mut block = [0u64; 64];
        let base = block.as_mut_ptr().cast::<c_void>();
        // SAFETY: the array has 512 bytes: room for offset 256 and the data.
        let user = unsafe { write(base, 256, 9, MAX_STACK_ID) };
        // SAFETY: user points inside the array.
        let tracked = unsafe { read(user) }.unwrap();
        assert_eq!(
            (tracked.base, tracked.offset, tracked.stack, tracked.size),
            (base, 256, MAX_STACK_ID, 9)
        );
    }

    #[test]
    fn foreign_headers_are_refused() {
        // glibc-like chunk headers: prev_size, size|flags.
        for words in [[0u64, 0x21], [0, 0x411], [u64::MAX, u64::MAX], [0, 0]] {
            let mut block = [words[0], words[1], 0, 0];
            let user = block.as_mut_ptr().wrapping_add(2).cast::<c_void>();
            // SAFETY: 16 readable bytes precede `user`.
            assert!(unsafe { read(user) }.is_none());
        }
    }
}
