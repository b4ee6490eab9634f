//! Event (header guard): where the guarded blocks start — one bit per 16 bytes of address
//! space, set while a block is memwarden's (live or in quarantine). Setting, clearing and
//! testing a bit is one atomic operation on a word that covers 1 KiB of the heap, so
//! neighbouring blocks share a cache line; a hash map of blocks costs a cache miss per
//! call instead. Lock-free: nothing to take at fork.
//!
//! The bits live in leaves of 512 KiB, one per 64 MiB of address space, mapped when first
//! needed and never unmapped. A leaf is found through a fixed table whose entries each pack
//! a leaf's key and address into one word, so one compare-and-swap publishes a leaf.

use core::sync::atomic::{AtomicU64, Ordering};

/// Blocks start on 16-byte boundaries (glibc's alignment, and every guard alignment).
const GRANULE_SHIFT: u32 = 4;
const GRANULE_MASK: u64 = (1 << GRANULE_SHIFT) - 1;
/// Each leaf covers 2^26 bytes (64 MiB) of addresses.
const LEAF_SHIFT: u32 = 26;
const LEAF_WORDS: usize = 1 << (LEAF_SHIFT - GRANULE_SHIFT - 6);
const LEAF_BYTES: usize = LEAF_WORDS * 8;
/// Leaves the table can hold: 256 GiB of address space holding guarded blocks.
const TABLE_SLOTS: usize = 4096;
/// Addresses above this are not covered (user space on x86-64 and AArch64 with 4-level
/// page tables; glibc's heap stays below unless asked otherwise).
const ADDRESS_BITS: u32 = 47;
/// A table entry: the leaf's key above `KEY_SHIFT`, the leaf's page number below.
const KEY_SHIFT: u32 = 35;
const PAGE_MASK: u64 = (1 << KEY_SHIFT) - 1;

/// The starts of guarded blocks.
pub struct BlockStarts {
    table: [AtomicU64; TABLE_SLOTS],
}

impl BlockStarts {
    pub const fn new() -> BlockStarts {
        BlockStarts {
            table: [const { AtomicU64::new(0) }; TABLE_SLOTS],
        }
    }

    /// Marks `address` as a block start; false when its leaf cannot be had (out of memory,
    /// table full, or an address beyond the covered range).
    pub fn insert(&self, address: u64) -> bool {
        self.word_of(address, true)
            .map(|(word, bit)| word.fetch_or(bit, Ordering::Release))
            .is_some()
    }

    /// Clears `address`'s mark; true if it was set (the caller now owns the block's end).
    pub fn remove(&self, address: u64) -> bool {
        self.word_of(address, false)
            .is_some_and(|(word, bit)| word.fetch_and(!bit, Ordering::AcqRel) & bit != 0)
    }

    /// Whether `address` is marked as a block start.
    #[inline(always)]
    pub fn contains(&self, address: u64) -> bool {
        self.word_of(address, false)
            .is_some_and(|(word, bit)| word.load(Ordering::Acquire) & bit != 0)
    }

    /// The bit word holding `address`'s mark, and its bit; none for an address that is not
    /// 16-aligned (never a block start) or has no leaf (mapped now if `create`).
    #[inline(always)]
    fn word_of(&self, address: u64, create: bool) -> Option<(&'static AtomicU64, u64)> {
        if address & GRANULE_MASK != 0 {
            return None;
        }
        let leaf = self.leaf(address, create)?;
        let (word, bit) = position(address);
        Some((leaf_word(leaf, word), bit))
    }

    /// Calls `each` with every marked address, leaf by leaf (leaves in no particular order).
    pub fn for_each(&self, mut each: impl FnMut(u64)) {
        for entry in &self.table {
            let entry = entry.load(Ordering::Acquire);
            if entry != 0 {
                scan_leaf(entry, &mut each);
            }
        }
    }

    /// The highest marked address at or below `address` (an error path: may read a
    /// whole leaf or more).
    pub fn at_or_below(&self, address: u64) -> Option<u64> {
        let key = address >> LEAF_SHIFT;
        if let Some(leaf) = self.leaf(address, false) {
            let (word, bit) = position(address);
            // `bit` and every bit under it.
            let below = bit | (bit - 1);
            let first = leaf_word(leaf, word).load(Ordering::Acquire) & below;
            if first != 0 {
                return Some(address_of(key, word, 63 - first.leading_zeros()));
            }
            if let Some(found) = highest_in(key, leaf, word) {
                return Some(found);
            }
        }
        // The nearest lower leaf that holds a mark.
        let mut below = key;
        loop {
            let next = self
                .table
                .iter()
                .map(|e| e.load(Ordering::Acquire))
                .filter(|&e| e != 0 && (e >> KEY_SHIFT) < below)
                .max_by_key(|&e| e >> KEY_SHIFT)?;
            below = next >> KEY_SHIFT;
            if let Some(found) = highest_in(below, leaf_of(next), LEAF_WORDS) {
                return Some(found);
            }
        }
    }

    /// The leaf of `address`, mapped now if `create` and it has none.
    #[inline(always)]
    fn leaf(&self, address: u64, create: bool) -> Option<*const AtomicU64> {
        if address >> ADDRESS_BITS != 0 {
            return None;
        }
        let key = address >> LEAF_SHIFT;
        let mut slot = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize;
        let mut fresh: Option<*mut u8> = None;
        for _ in 0..TABLE_SLOTS {
            let entry = self.table[slot].load(Ordering::Acquire);
            if entry != 0 && entry >> KEY_SHIFT == key {
                if let Some(unused) = fresh {
                    unmap_leaf(unused);
                }
                return Some(leaf_of(entry));
            }
            if entry == 0 {
                if !create {
                    return None;
                }
                let page = match fresh {
                    Some(page) => page,
                    None => {
                        let page = map_leaf()?;
                        fresh = Some(page);
                        page
                    }
                };
                let packed = (key << KEY_SHIFT) | (page as u64 >> 12);
                match self.table[slot].compare_exchange(
                    0,
                    packed,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Some(page as *const AtomicU64),
                    // Another thread took the slot: look at what it put there.
                    Err(_) => continue,
                }
            }
            slot = (slot + 1) % TABLE_SLOTS;
        }
        if let Some(unused) = fresh {
            unmap_leaf(unused);
        }
        None
    }
}

/// The word index in its leaf and the bit of `address`.
#[inline(always)]
fn position(address: u64) -> (usize, u64) {
    let granule = (address >> GRANULE_SHIFT) as usize & (LEAF_WORDS * 64 - 1);
    (granule / 64, 1u64 << (granule % 64))
}

fn address_of(key: u64, word: usize, bit: u32) -> u64 {
    (key << LEAF_SHIFT) | (((word as u64) * 64 + u64::from(bit)) << GRANULE_SHIFT)
}

fn leaf_of(entry: u64) -> *const AtomicU64 {
    ((entry & PAGE_MASK) << 12) as *const AtomicU64
}

#[inline(always)]
fn leaf_word(leaf: *const AtomicU64, word: usize) -> &'static AtomicU64 {
    // SAFETY: `word` is below LEAF_WORDS (masked by `position` or bounded by the callers),
    // and leaves are mapped for LEAF_BYTES and never unmapped once published.
    unsafe { &*leaf.add(word) }
}

/// The highest marked address in the words of `leaf` below `end`.
fn highest_in(key: u64, leaf: *const AtomicU64, end: usize) -> Option<u64> {
    (0..end).rev().find_map(|word| {
        let bits = leaf_word(leaf, word).load(Ordering::Acquire);
        (bits != 0).then(|| address_of(key, word, 63 - bits.leading_zeros()))
    })
}

/// Calls `each` with the marked addresses of the leaf `entry` names, in order.
fn scan_leaf(entry: u64, each: &mut impl FnMut(u64)) {
    let key = entry >> KEY_SHIFT;
    let leaf = leaf_of(entry);
    for word in 0..LEAF_WORDS {
        let mut bits = leaf_word(leaf, word).load(Ordering::Acquire);
        while bits != 0 {
            let bit = bits.trailing_zeros();
            bits &= bits - 1;
            each(address_of(key, word, bit));
        }
    }
}

fn map_leaf() -> Option<*mut u8> {
    // SAFETY: a fresh private anonymous mapping; pages are zero (no marks) until touched.
    let page = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            LEAF_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED || (page as u64) >> (KEY_SHIFT + 12) != 0 {
        if page != libc::MAP_FAILED {
            unmap_leaf(page.cast());
        }
        return None;
    }
    crate::own_regions::note(page.cast(), LEAF_BYTES);
    Some(page.cast())
}

fn unmap_leaf(page: *mut u8) {
    crate::own_regions::forget(page);
    // SAFETY: a leaf mapped by `map_leaf` and never published.
    unsafe { libc::munmap(page.cast(), LEAF_BYTES) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_tests_and_clears_addresses() {
        let starts = Box::new(BlockStarts::new());
        let heap = 0x5555_0000_0000u64;
        assert!(!starts.contains(heap + 0x40));
        assert!(starts.insert(heap + 0x40));
        assert!(starts.insert(heap + 0x50));
        assert!(starts.contains(heap + 0x40));
        assert!(!starts.contains(heap + 0x60));
        // Inside the first block, in the same 16 bytes as its start.
        assert!(!starts.contains(heap + 0x48));
        assert!(!starts.remove(heap + 0x48));
        assert!(starts.remove(heap + 0x40));
        assert!(!starts.remove(heap + 0x40));
        assert!(!starts.contains(heap + 0x40));
        assert!(starts.contains(heap + 0x50));
    }

    #[test]
    fn enumerates_and_finds_the_nearest_start_below() {
        let starts = Box::new(BlockStarts::new());
        let low = 0x7f00_0000_0010u64;
        let high = low + (3 << LEAF_SHIFT) + 0x1230;
        for address in [low, low + 0x400, high] {
            assert!(starts.insert(address));
        }
        let mut seen = Vec::new();
        starts.for_each(|a| seen.push(a));
        seen.sort_unstable();
        assert_eq!(seen, vec![low, low + 0x400, high]);
        assert_eq!(starts.at_or_below(low + 0x400), Some(low + 0x400));
        assert_eq!(starts.at_or_below(low + 0x3f0), Some(low));
        assert_eq!(starts.at_or_below(high + 0x10_0000), Some(high));
        assert_eq!(starts.at_or_below(high - 0x10), Some(low + 0x400));
        assert_eq!(starts.at_or_below(low - 0x10), None);
    }

    #[test]
    fn addresses_beyond_the_covered_range_are_refused() {
        let starts = Box::new(BlockStarts::new());
        assert!(!starts.insert(1 << 50));
        assert!(!starts.contains(1 << 50));
    }

    #[test]
    fn agrees_with_an_ordered_set_under_random_inserts_and_removes() {
        use std::collections::BTreeSet;
        let starts = Box::new(BlockStarts::new());
        let mut model = BTreeSet::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // Three leaves apart, plus the edge between two neighbouring ones.
        let bases = [0x5600_0000_0000u64, 0x5600_0c00_0000, 0x7ff0_0000_0000];
        for _ in 0..20_000 {
            let base = bases[(next() % 3) as usize];
            let address = base + (next() % (1 << 20)) * 16 - (1 << 19) * 16;
            if next() % 3 == 0 {
                assert_eq!(starts.remove(address), model.remove(&address));
            } else {
                assert!(starts.insert(address));
                model.insert(address);
            }
            let probe = base + (next() % (1 << 24)) - (1 << 23);
            assert_eq!(starts.contains(probe), model.contains(&probe));
            assert_eq!(
                starts.at_or_below(probe),
                model.range(..=probe).next_back().copied()
            );
        }
        let mut seen = Vec::new();
        starts.for_each(|a| seen.push(a));
        seen.sort_unstable();
        assert_eq!(seen, model.into_iter().collect::<Vec<_>>());
    }
}
