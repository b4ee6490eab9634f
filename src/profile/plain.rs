//! The store's records as bytes: the one place that reinterprets file bytes as the
//! `repr(C)` structs of `memwarden-abi`, with a bounds check before every read.

use memwarden_abi::python::CodeRecord;
use memwarden_abi::{ErrorRecord, FailureRecord, Header, ModuleRecord, StackRecord};

// The file is little-endian and the structs are read in native byte order.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "memwarden reads profile files in native byte order, which must be little-endian"
);

/// A `repr(C)` record that can be read from any bytes.
///
/// # Safety
/// Implementors must be `Copy` types whose fields are all integers or arrays of integers,
/// so that every bit pattern of `size_of::<Self>()` bytes is a valid value.
pub(crate) unsafe trait Plain: Copy {}

// SAFETY: `Header` is `repr(C)` and holds only integers and integer arrays.
unsafe impl Plain for Header {}
// SAFETY: `ModuleRecord` is `repr(C)` and holds only integers and integer arrays.
unsafe impl Plain for ModuleRecord {}
// SAFETY: `StackRecord` is `repr(C)` and holds only integers.
unsafe impl Plain for StackRecord {}
// SAFETY: `FailureRecord` is `repr(C)` and holds only integers.
unsafe impl Plain for FailureRecord {}
// SAFETY: `ErrorRecord` is `repr(C)` and holds only integers.
unsafe impl Plain for ErrorRecord {}
// SAFETY: `CodeRecord` is `repr(C)` and holds only integers and `repr(C)` pairs of them.
unsafe impl Plain for CodeRecord {}
// SAFETY: `LeakRecord` is `repr(C)` and holds only integers.
unsafe impl Plain for memwarden_abi::LeakRecord {}

/// Reads the record of type `T` starting at `offset` in `bytes`; `None` if it does not fit.
pub(crate) fn read_plain<T: Plain>(bytes: &[u8], offset: usize) -> Option<T> {
    let end = offset.checked_add(size_of::<T>())?;
    let source = bytes.get(offset..end)?;
    // SAFETY: `source` is `size_of::<T>()` initialized bytes (checked just above);
    // `read_unaligned` has no alignment requirement; `T: Plain` makes any bit pattern a
    // valid `T`.
    Some(unsafe { source.as_ptr().cast::<T>().read_unaligned() })
}

/// The bytes of `words`, to read a file's little-endian words into them in place.
pub(crate) fn words_as_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: the bytes are exactly those of `words` (its length times 8, from its own
    // pointer), borrowed mutably for as long as `words` is; `u8` has no alignment
    // requirement, and any bytes written make valid `u64`s.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 8) }
}

/// Reads the little-endian `u64` at `offset`; `None` if it does not fit.
pub(crate) fn read_u64(bytes: &[u8], offset: usize) -> Option<u64> {
    let end = offset.checked_add(8)?;
    let word: [u8; 8] = bytes.get(offset..end)?.try_into().ok()?;
    Some(u64::from_le_bytes(word))
}

/// Each field of a [`Layout`](memwarden_abi::Layout) with its offset inside the struct, for
/// writing a layout into header bytes field by field.
pub(crate) fn layout_fields(l: &memwarden_abi::Layout) -> [(usize, u64); 17] {
    use memwarden_abi::Layout;
    use std::mem::offset_of;
    [
        (offset_of!(Layout, modules_offset), l.modules_offset),
        (offset_of!(Layout, module_capacity), l.module_capacity),
        (offset_of!(Layout, stacks_offset), l.stacks_offset),
        (offset_of!(Layout, stack_capacity), l.stack_capacity),
        (offset_of!(Layout, frames_offset), l.frames_offset),
        (offset_of!(Layout, frame_capacity), l.frame_capacity),
        (offset_of!(Layout, failures_offset), l.failures_offset),
        (offset_of!(Layout, failure_capacity), l.failure_capacity),
        (offset_of!(Layout, errors_offset), l.errors_offset),
        (offset_of!(Layout, error_capacity), l.error_capacity),
        (offset_of!(Layout, codes_offset), l.codes_offset),
        (offset_of!(Layout, code_capacity), l.code_capacity),
        (offset_of!(Layout, blob_offset), l.blob_offset),
        (offset_of!(Layout, blob_capacity), l.blob_capacity),
        (offset_of!(Layout, file_size), l.file_size),
        (offset_of!(Layout, leaks_offset), l.leaks_offset),
        (offset_of!(Layout, leak_capacity), l.leak_capacity),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_refuse_short_input() {
        let bytes = [0u8; 127];
        assert!(read_plain::<StackRecord>(&bytes, 0).is_none());
        assert!(read_plain::<StackRecord>(&[0u8; 128], 1).is_none());
        assert!(read_plain::<StackRecord>(&[0u8; 128], usize::MAX).is_none());
        assert!(read_u64(&bytes, 120).is_none());
    }

    #[test]
    fn reads_fields_at_their_offsets() {
        let mut bytes = vec![0u8; 1 + 128];
        let depth_at = 1 + std::mem::offset_of!(StackRecord, depth);
        bytes[depth_at..depth_at + 4].copy_from_slice(&7u32.to_le_bytes());
        let record = read_plain::<StackRecord>(&bytes, 1).unwrap();
        assert_eq!(record.depth, 7);
        assert_eq!(read_u64(&[1, 0, 0, 0, 0, 0, 0, 2], 0), Some(2 << 56 | 1));
    }
}
