//! Event (header guard): the layout of a guarded block and its header — memwarden's own
//! metadata in front of the user data, never glibc's — with the check word that tells a
//! genuine header (live or freed) from anything else.

use core::ffi::c_void;

/// Bytes left free at the start of glibc's block, where glibc keeps its free-list links.
pub const GLIBC_LINKS: usize = 16;
pub const HEADER: usize = 16;
pub const FRONT_REDZONE: usize = 16;
pub const MIN_BACK_REDZONE: usize = 16;
pub const FRONT_PATTERN: u8 = 0xfa;
pub const BACK_PATTERN: u8 = 0xfb;
pub const SIZE_MASK: u64 = (1 << 48) - 1;

/// Which allocation family made a block; deallocating with another family's function is an
/// error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Malloc = 0,
    New = 1,
    NewArray = 2,
}

impl Family {
    fn from_bits(bits: u64) -> Family {
        match bits & 3 {
            1 => Family::New,
            2 => Family::NewArray,
            _ => Family::Malloc,
        }
    }
}

/// A guarded block's header, decoded.
#[derive(Clone, Copy)]
pub struct Guarded {
    pub base: *mut c_void,
    pub size: u64,
    pub family: Family,
    pub freed: bool,
    pub stack: u32,
}

fn check_bits(user: u64, word0: u64, stack: u64) -> u64 {
    let mut mixed = user ^ word0.rotate_left(21) ^ stack.rotate_left(43) ^ 0x6775_6172_6465_6421;
    mixed = (mixed ^ (mixed >> 31)).wrapping_mul(0x7fb5_d329_728e_a185);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x81da_def4_bc2d_d44d);
    (mixed ^ (mixed >> 33)) >> 24
}

fn header_words(user: u64) -> *mut u64 {
    (user as usize - FRONT_REDZONE - HEADER) as *mut u64
}

/// The offset from glibc's block to the user data, in 6 bits: multiples of 16 below 512
/// exactly (`offset / 16`, below 32), larger powers of two by their logarithm (32 + log2).
fn encode_offset(offset: usize) -> u64 {
    if offset < 512 && offset.is_multiple_of(16) {
        (offset / 16) as u64
    } else {
        32 + u64::from(offset.trailing_zeros())
    }
}

fn decode_offset(code: u32) -> Option<usize> {
    if code < 32 {
        Some(code as usize * 16)
    } else {
        1usize.checked_shl(code - 32)
    }
}

/// Bit of word 0 that marks a freed block; the check word leaves it out, so one atomic
/// write turns a live header into a freed one that is still genuine.
const FREED_BIT: u64 = 1 << 56;

fn pack_word0(size: u64, offset: usize, family: Family) -> u64 {
    (size & SIZE_MASK) | (encode_offset(offset) << 48) | ((family as u64) << 54)
}

/// Writes the header of the block at `user`.
///
/// # Safety
/// The 32 bytes before `user` belong to the block.
pub unsafe fn write_header(
    user: u64,
    size: u64,
    offset: usize,
    family: Family,
    freed: bool,
    stack: u32,
) {
    let word0 = pack_word0(size, offset, family);
    let stack = u64::from(stack);
    let word1 = stack | (check_bits(user, word0, stack) << 24);
    // SAFETY: the caller guarantees the header lies inside the block.
    unsafe {
        let words = header_words(user);
        words.write(word0 | if freed { FREED_BIT } else { 0 });
        words.add(1).write(word1);
    }
}

/// Marks the live block `live` (its header as read at `user`) freed; false if another
/// call did so first (two frees of one block racing).
///
/// # Safety
/// `user` is a guarded block's address, so its header is readable and writable.
pub unsafe fn mark_freed(user: u64, live: &Guarded) -> bool {
    let word0 = pack_word0(live.size, user as usize - live.base as usize, live.family);
    // SAFETY: the header's first word is 8-aligned (blocks are 16-aligned) and lies inside
    // the block; other threads only touch it atomically or by reading.
    let word = unsafe { core::sync::atomic::AtomicU64::from_ptr(header_words(user)) };
    word.compare_exchange(
        word0,
        word0 | FREED_BIT,
        core::sync::atomic::Ordering::AcqRel,
        core::sync::atomic::Ordering::Acquire,
    )
    .is_ok()
}

/// Reads the header of a block memwarden knows (live or in quarantine).
///
/// # Safety
/// The 32 bytes before `user` are readable (a block memwarden marked as its own, or a
/// pointer given to free, whose bytes glibc's own free would read).
pub unsafe fn read_header(user: u64) -> Option<Guarded> {
    // SAFETY: the caller guarantees the header is readable.
    let (word0, word1) = unsafe {
        let words = header_words(user);
        (words.read(), words.add(1).read())
    };
    let stack = word1 & ((1 << 24) - 1);
    if word1 >> 24 != check_bits(user, word0 & !FREED_BIT, stack) {
        return None;
    }
    let offset = decode_offset(((word0 >> 48) & 0x3f) as u32)?;
    Some(Guarded {
        base: (user as usize).checked_sub(offset)? as *mut c_void,
        size: word0 & SIZE_MASK,
        family: Family::from_bits(word0 >> 54),
        freed: word0 & FREED_BIT != 0,
        stack: stack as u32,
    })
}

/// The first byte in `bytes` that is not `pattern`.
pub fn first_changed(bytes: &[u8], pattern: u8) -> Option<usize> {
    bytes.iter().position(|&b| b != pattern)
}

/// The last byte in `bytes` that is not `pattern`.
pub fn last_changed(bytes: &[u8], pattern: u8) -> Option<usize> {
    bytes.iter().rposition(|&b| b != pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip() {
        for offset in [48usize, 64, 96, 128, 496, 512, 4096, 1 << 20] {
            assert_eq!(
                decode_offset(encode_offset(offset) as u32),
                Some(offset),
                "{offset}"
            );
        }
    }
}
