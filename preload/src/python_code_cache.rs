//! Interposed call → event (Python): a per-thread cache in front of the shared code table
//! (`python_codes`). A Python stack names a code object per frame, and a loop names the
//! same few again and again; the shared table's slots (4 MiB of them) are mostly out of
//! the CPU's caches by the next allocation, this thread's few kilobytes are not.
//!
//! An entry is trusted only for the code object it was made for. Where code deaths are
//! seen (`python_code_deaths`, every supported CPython), it keeps the deaths epoch it was
//! made at: while no code object has died since, the object at its address is the same
//! one, and a hit reads nothing of the code object. Otherwise it keeps the identity check
//! of the objects the code owns ([`check_of`]), compared on every use as the shared table
//! compares it.

use memwarden_abi::python::python_frame;

use crate::profile_file::ProfileFile;
use crate::python_codes::{check_of, CodeTable};
use crate::python_layout::PyLayout;

/// Entries per thread, direct-mapped by the code object's address.
const ENTRIES: usize = 512;
const INDEX_SHIFT: u32 = 64 - ENTRIES.trailing_zeros();

#[derive(Clone, Copy, Default)]
struct Entry {
    code: u64,
    /// The deaths epoch it was made at, or the code's identity check (see the module).
    tag: u64,
    /// The frame word of the code's first instruction: a frame's word is this with its
    /// instruction offset put in.
    word: u64,
    /// Bytes from the code's first instruction to its first traceable one (3.11 on; 0
    /// before), kept for hits.
    first_traceable_bytes: u32,
    index: u32,
}

/// What a hit knows of a code object without reading it.
#[derive(Clone, Copy)]
pub struct Known {
    /// The frame word at instruction offset 0 (see [`Known::word_at`]).
    pub word: u64,
    /// Bytes before the first traceable instruction, as `Entry::first_traceable_bytes`.
    pub first_traceable_bytes: u64,
}

impl Known {
    /// What is known of the code object whose record is `index` and whose
    /// `_co_firsttraceable` is `first_traceable`.
    pub fn new(index: u32, first_traceable: i32) -> Known {
        Known {
            word: python_frame(index, 0, false),
            first_traceable_bytes: u64::from(first_traceable.max(0) as u32) * 2,
        }
    }

    /// The frame word of instruction `offset` (in code units) of this code.
    #[inline(always)]
    pub fn word_at(&self, offset: u32) -> u64 {
        self.word | u64::from(offset)
    }
}

/// The code records this thread found lately.
pub struct CodeCache {
    entries: [Entry; ENTRIES],
}

impl CodeCache {
    /// An empty cache, made on the heap directly (12 KiB: never through the hook's stack).
    pub fn boxed() -> Box<CodeCache> {
        let cache = Box::<CodeCache>::new_zeroed();
        // SAFETY: all-zero bytes are a valid cache: every entry's code is 0, which no live
        // code object has, so no entry matches.
        unsafe { cache.assume_init() }
    }

    /// What this thread found of the code object at `code` at deaths epoch `epoch`: while no
    /// code object has died since, a code object is still there and it is the same one, so
    /// the caller need not read it at all (not even its type).
    #[inline(always)]
    pub fn known(&self, code: u64, epoch: u64) -> Option<Known> {
        let entry = &self.entries[slot_of(code)];
        (entry.code == code && entry.tag == epoch).then_some(Known {
            word: entry.word,
            first_traceable_bytes: u64::from(entry.first_traceable_bytes),
        })
    }

    /// The record index of code object `code`, from this cache or else from `table` (which
    /// writes the record first if the code is new); `None` when the table or file is full.
    /// `deaths` is the deaths epoch read before this thread's frames were, if deaths are
    /// seen; `first_traceable` is the code's `_co_firsttraceable`, kept for
    /// [`CodeCache::known`].
    ///
    /// # Safety
    /// As [`CodeTable::index_of`]: `code` is a live `PyCodeObject` of the layout `l`.
    #[inline]
    pub unsafe fn index_of(
        &mut self,
        table: &CodeTable,
        file: &ProfileFile,
        l: &PyLayout,
        code: u64,
        deaths: Option<u64>,
        first_traceable: i32,
    ) -> Option<u32> {
        // With deaths seen, a dead code's table slot is gone, so the address alone is the
        // table's key (check 0).
        let (tag, check) = match deaths {
            Some(epoch) => (epoch, 0),
            None => {
                // SAFETY: the caller's contract.
                let check = unsafe { check_of(l, code) };
                (check, check)
            }
        };
        let entry = &mut self.entries[slot_of(code)];
        if entry.code == code && entry.tag == tag {
            return Some(entry.index);
        }
        // SAFETY: the caller's contract.
        let index = unsafe { table.index_of(file, l, code, check) }?;
        let known = Known::new(index, first_traceable);
        *entry = Entry {
            code,
            tag,
            word: known.word,
            first_traceable_bytes: known.first_traceable_bytes.min(u64::from(u32::MAX)) as u32,
            index,
        };
        Some(index)
    }
}

fn slot_of(code: u64) -> usize {
    ((code >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> INDEX_SHIFT) as usize
}
