//! Store: interns call stacks. Each unique stack gets a dense id, a `StackRecord` in the
//! profile file and its frames in the file's frame area; a hash-chain index in anonymous
//! memory finds a known stack without locks (new stacks are linked in with one CAS). The
//! chains run through a dense array of links beside it, each with a tag of its stack's
//! hash, so that walking a chain reads a record only where the tag matches. Each chain's
//! head word also sums up which hashes the chain holds, so that most new stacks are known
//! to be new without walking their chain at all.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memwarden_abi::{flags, Header, StackRecord, UNKNOWN_STACK_ID};

use crate::lifecycle;
use crate::profile_file::ProfileFile;

/// Stacks per hash chain, on average, once the table is full: chains stay short enough
/// that a lookup reads a few links even for the two million stacks of `import torch`,
/// and the index of a program of a few thousand stacks stays within 2 MiB.
const STACKS_PER_BUCKET: u64 = 8;
/// Bounds of the chain count: the index costs 4 bytes a chain, in huge pages touched as
/// chains are first used (2 MiB, one huge page, by default).
const MIN_BUCKET_BITS: u32 = 16;
const MAX_BUCKET_BITS: u32 = 22;

pub struct StackTable {
    /// Each hash chain's head word, in an anonymous mapping: the head stack id (0 = empty)
    /// in the low `id_bits`, and above it the chain's summary (see [`Summary`]).
    buckets: *const AtomicU32,
    /// log2 of the number of chains.
    bucket_bits: u32,
    /// How the head words are split between the id and the summary.
    summary: Summary,
    /// By stack id: the next id in its chain (low half) and its hash's tag (high half), in
    /// an anonymous mapping. A new stack's lookup walks its whole chain; through the
    /// records (128 bytes apart, spread over a file of up to 256 MiB of them) each step
    /// was a cache and TLB miss, the largest part of `import torch`'s time in the preload.
    links: *const AtomicU64,
    /// Entries in `links`: the file's stack capacity, above every id it hands out.
    link_count: u64,
}

// SAFETY: the bucket and link arrays are shared memory accessed only through atomics.
unsafe impl Sync for StackTable {}
// SAFETY: as above.
unsafe impl Send for StackTable {}

/// Hash of a stack's return addresses.
pub fn hash_frames(frames: &[u64]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64 ^ frames.len() as u64;
    for &frame in frames {
        hash = (hash.rotate_left(23) ^ frame).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    hash ^ (hash >> 29)
}

/// The part of a stack's hash its link keeps; the bucket is chosen by the hash's top bits.
fn tag_of(hash: u64) -> u32 {
    hash as u32
}

/// A link: the next id of the chain, and the tag of the linked stack's hash.
fn link_word(next: u32, tag: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(next)
}

fn published(record: *mut StackRecord) -> &'static AtomicU32 {
    // SAFETY: `published` is an aligned u32 inside a record of the mapped file, which lives
    // for the whole process; it is only accessed atomically.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*record).published)) }
}

/// The bits of a head word above the stack id: one bit per group of hashes, set when a
/// stack of that group is linked into the chain. A new stack's lookup (most of `import
/// torch`'s two million stacks are new) walks its chain only if its group's bit is set:
/// each step of a walk is a cache miss. The ids take the bits the stack capacity needs
/// (22 by default, leaving 10 for the summary); a capacity of 2^32 leaves none, and every
/// chain is then walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Summary {
    id_bits: u32,
}

/// The hash bits that choose a summary bit: below the bucket index's (the top
/// [`MAX_BUCKET_BITS`] at most) and above the tag's, so that neither decides them.
const SUMMARY_HASH_SHIFT: u32 = 32;
const SUMMARY_HASH_BITS: u32 = 64 - MAX_BUCKET_BITS - SUMMARY_HASH_SHIFT;

impl Summary {
    fn for_capacity(stack_capacity: u64) -> Summary {
        let highest_id = stack_capacity.saturating_sub(1);
        let id_bits = (u64::BITS - highest_id.leading_zeros()).clamp(1, u32::BITS);
        Summary { id_bits }
    }

    fn bits(self) -> u32 {
        u32::BITS - self.id_bits
    }

    fn head(self, word: u32) -> u32 {
        word & (u32::MAX >> self.bits())
    }

    /// The summary bit of `hash`, in head-word position (0 when there is no summary).
    fn bit_of(self, hash: u64) -> u32 {
        let group = (hash >> SUMMARY_HASH_SHIFT) & ((1 << SUMMARY_HASH_BITS) - 1);
        // Spread over the summary's bits: group * bits / 2^SUMMARY_HASH_BITS < bits.
        let index = ((group * u64::from(self.bits())) >> SUMMARY_HASH_BITS) as u32;
        match self.bits() {
            0 => 0,
            _ => 1u32 << (self.id_bits + index),
        }
    }

    /// Whether the chain of `word` may hold a stack of summary bit `bit`.
    fn may_hold(self, word: u32, bit: u32) -> bool {
        bit == 0 || word & bit != 0
    }

    /// The head word of a chain `word` once stack `id` (of summary bit `bit`) heads it.
    fn linked(self, word: u32, id: u32, bit: u32) -> u32 {
        (word & !(u32::MAX >> self.bits())) | bit | id
    }
}

/// log2 of the chain count for a table of `stack_capacity` stacks.
fn bucket_bits_for(stack_capacity: u64) -> u32 {
    let wanted = (stack_capacity / STACKS_PER_BUCKET).max(1);
    // Rounded up to a power of two: ceil(log2(wanted)).
    let bits = u64::BITS - (wanted - 1).leading_zeros();
    bits.clamp(MIN_BUCKET_BITS, MAX_BUCKET_BITS)
}

impl StackTable {
    /// An empty index for a profile file of `stack_capacity` stack records.
    pub fn new(stack_capacity: u64) -> Option<StackTable> {
        let bucket_bits = bucket_bits_for(stack_capacity);
        let bytes = (1usize << bucket_bits) * 4;
        // Zero-filled: every chain is empty.
        let buckets = crate::own_regions::map_table(bytes)?;
        // Touched in id order, a page per 512 stacks: small pages keep a small program's
        // share small.
        let link_bytes = usize::try_from(stack_capacity).ok()?.checked_mul(8)?;
        let links = crate::own_regions::map_scratch(link_bytes.max(8))?;
        Some(StackTable {
            buckets: buckets.cast(),
            bucket_bits,
            summary: Summary::for_capacity(stack_capacity),
            links: links.cast(),
            link_count: stack_capacity,
        })
    }

    /// The link of stack `id`, `None` past the file's capacity (no chain holds such an id).
    fn link(&self, id: u32) -> Option<&AtomicU64> {
        // SAFETY: below `link_count`, the index lies inside the mapped link array.
        (u64::from(id) < self.link_count).then(|| unsafe { &*self.links.add(id as usize) })
    }

    fn bucket(&self, hash: u64) -> &AtomicU32 {
        // SAFETY: the index is below 2^bucket_bits (the hash's top bucket_bits bits), the
        // number of chains mapped.
        unsafe { &*self.buckets.add((hash >> (64 - self.bucket_bits)) as usize) }
    }

    /// The id of `frames`, storing it if new; [`UNKNOWN_STACK_ID`] for an empty stack or
    /// when the file has no room left.
    pub fn intern(&self, file: &ProfileFile, frames: &[u64]) -> u32 {
        if frames.is_empty() {
            return UNKNOWN_STACK_ID;
        }
        let hash = hash_frames(frames);
        let bucket = self.bucket(hash);
        let bit = self.summary.bit_of(hash);
        let mut word = bucket.load(Ordering::Acquire);
        if self.summary.may_hold(word, bit) {
            let head = self.summary.head(word);
            if let Some(id) = self.find(file, head, UNKNOWN_STACK_ID, hash, frames) {
                return id;
            }
        }
        let Some(id) = self.store(file, hash, frames) else {
            return UNKNOWN_STACK_ID;
        };
        let (Some(link), record) = (self.link(id), file.stack(u64::from(id))) else {
            return UNKNOWN_STACK_ID;
        };
        loop {
            let head = self.summary.head(word);
            link.store(link_word(head, tag_of(hash)), Ordering::Relaxed);
            let linked = self.summary.linked(word, id, bit);
            match bucket.compare_exchange(word, linked, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    published(record).store(1, Ordering::Release);
                    return id;
                }
                Err(newer) => {
                    // Another thread linked stacks meanwhile; one may be ours. Our record
                    // then stays unpublished, a hole the reader skips.
                    if self.summary.may_hold(newer, bit) {
                        let newest = self.summary.head(newer);
                        if let Some(existing) = self.find(file, newest, head, hash, frames) {
                            return existing;
                        }
                    }
                    word = newer;
                }
            }
        }
    }

    /// Walks a chain from `from` until `until`, for a record with these frames.
    fn find(
        &self,
        file: &ProfileFile,
        from: u32,
        until: u32,
        hash: u64,
        frames: &[u64],
    ) -> Option<u32> {
        let tag = tag_of(hash);
        let mut id = from;
        while id != UNKNOWN_STACK_ID && id != until {
            // Ids in a chain were linked after their link, record and frames were written
            // (release CAS on the bucket, acquire load by the caller), and never change again.
            let link = self.link(id)?.load(Ordering::Acquire);
            if (link >> 32) as u32 == tag && same_stack(file, id, hash, frames) {
                return Some(id);
            }
            id = link as u32;
        }
        None
    }

    /// Claims a record and frame words and writes the stack into them.
    fn store(&self, file: &ProfileFile, hash: u64, frames: &[u64]) -> Option<u32> {
        let layout = *file.layout();
        let depth = frames.len() as u64;
        let id = claim(
            file.counter(core::mem::offset_of!(Header, stack_count)),
            1,
            layout.stack_capacity,
        );
        let start = id.and_then(|_| {
            claim(
                file.counter(core::mem::offset_of!(Header, frame_words_used)),
                depth,
                layout.frame_capacity,
            )
        });
        let (Some(id), Some(start)) = (id, start) else {
            file.counter(core::mem::offset_of!(Header, flags))
                .fetch_or(flags::STACKS_FULL, Ordering::Relaxed);
            return None;
        };
        let record_bytes = core::mem::size_of::<StackRecord>() as u64;
        if !file.back(layout.stack_offset(id), record_bytes)
            || !file.back(layout.frame_offset(start), depth * 8)
        {
            lifecycle::degrade(memwarden_abi::degraded_reason::FILE_GROW_FAILED);
            return None;
        }
        // SAFETY: the frame words [start, start + depth) and record `id` were claimed by this
        // thread alone (fetch-add above), lie inside the mapping and are backed.
        unsafe {
            core::ptr::copy_nonoverlapping(frames.as_ptr(), file.frame_words(start), frames.len());
            let record = file.stack(id);
            (*record).depth = depth as u32;
            (*record).hash = hash;
            (*record).frames_start = start;
        }
        Some(id as u32)
    }
}

/// Atomically takes `amount` units of a counter bounded by `capacity`; the first index.
fn claim(counter: &AtomicU64, amount: u64, capacity: u64) -> Option<u64> {
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            used.checked_add(amount).filter(|&end| end <= capacity)
        })
        .ok()
}

/// Whether record `id`, linked into a chain, holds the stack `frames` of hash `hash`.
fn same_stack(file: &ProfileFile, id: u32, hash: u64, frames: &[u64]) -> bool {
    let record = file.stack(u64::from(id));
    // SAFETY: a linked record and its frames were written before it was linked (the chain's
    // release CAS, the caller's acquire load) and never change again.
    unsafe {
        (*record).hash == hash
            && (*record).depth as usize == frames.len()
            && core::slice::from_raw_parts(file.frame_words((*record).frames_start), frames.len())
                == frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile_file::scratch_profile;

    /// `count` one-frame stacks whose hashes fall in the same chain.
    fn stacks_in_one_chain(count: usize) -> Vec<[u64; 1]> {
        let bucket_of = |frame: u64| hash_frames(&[frame]) >> (64 - MIN_BUCKET_BITS);
        let wanted = bucket_of(0x1000);
        (0x1000u64..)
            .step_by(16)
            .filter(|&frame| bucket_of(frame) == wanted)
            .take(count)
            .map(|frame| [frame])
            .collect()
    }

    #[test]
    fn every_stack_of_a_long_chain_keeps_its_own_id() {
        let scratch = scratch_profile("stack-table-chain", 4096);
        let file = &scratch.file;
        // Id 0 is the unknown stack's, as the recorder sets it up.
        file.counter(core::mem::offset_of!(Header, stack_count))
            .store(1, Ordering::Relaxed);
        let table = StackTable::new(file.layout().stack_capacity).unwrap();
        let stacks = stacks_in_one_chain(9);
        let (linked, left_out) = stacks.split_at(8);
        let ids: Vec<u32> = linked.iter().map(|s| table.intern(file, s)).collect();
        let mut distinct = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ids.len());
        assert!(!ids.contains(&UNKNOWN_STACK_ID));
        // Found again from any place in the chain, the head (the last linked) to its end.
        for (stack, &id) in linked.iter().zip(&ids) {
            assert_eq!(table.intern(file, stack), id);
            // SAFETY: a record the table handed out, inside the scratch mapping.
            assert_eq!(unsafe { (*file.stack(u64::from(id))).published }, 1);
        }
        // A stack of the same chain never linked is new.
        let new = table.intern(file, &left_out[0]);
        assert!(!ids.contains(&new) && new != UNKNOWN_STACK_ID);
        assert_eq!(table.intern(file, &left_out[0]), new);
    }

    #[test]
    fn a_head_word_keeps_its_id_and_every_linked_stack_s_summary_bit() {
        let summary = Summary::for_capacity(1 << 22);
        assert_eq!((summary.id_bits, summary.bits()), (22, 10));
        let mut word = 0u32;
        let mut bits = Vec::new();
        for (id, frame) in (1u32..).zip((0x1000u64..).step_by(16).take(40)) {
            let bit = summary.bit_of(hash_frames(&[frame]));
            assert_eq!(bit.count_ones(), 1);
            assert!(bit >= 1 << 22);
            word = summary.linked(word, id, bit);
            assert_eq!(summary.head(word), id);
            bits.push(bit);
            assert!(bits.iter().all(|&bit| summary.may_hold(word, bit)));
        }
        // Forty hashes reach every one of the ten bits.
        assert_eq!(word >> 22, (1 << 10) - 1);
        // A chain of one stack holds only its own group.
        let lone = summary.linked(0, 7, bits[0]);
        let mut others = bits.iter().filter(|&&bit| bit != bits[0]);
        assert!(others.clone().count() > 0);
        assert!(others.all(|&bit| !summary.may_hold(lone, bit)));
    }

    #[test]
    fn ids_the_capacity_needs_leave_the_rest_of_the_word_to_the_summary() {
        assert_eq!(Summary::for_capacity(1 << 22).bits(), 10);
        assert_eq!(Summary::for_capacity((1 << 22) + 1).bits(), 9);
        assert_eq!(Summary::for_capacity(2).bits(), 31);
        assert_eq!(Summary::for_capacity(0).bits(), 31);
        // No room left: no summary, and every chain may hold every stack.
        let full = Summary::for_capacity(1 << 32);
        assert_eq!(full.bits(), 0);
        assert_eq!(full.bit_of(u64::MAX), 0);
        assert!(full.may_hold(0, 0));
        assert_eq!(full.linked(5, u32::MAX - 1, 0), u32::MAX - 1);
        assert_eq!(full.head(u32::MAX), u32::MAX);
    }

    #[test]
    fn chains_grow_with_the_capacity_within_their_bounds() {
        assert_eq!(bucket_bits_for(1 << 22), 19);
        assert_eq!(bucket_bits_for((1 << 22) + STACKS_PER_BUCKET), 20);
        assert_eq!(bucket_bits_for(16), MIN_BUCKET_BITS);
        assert_eq!(bucket_bits_for(0), MIN_BUCKET_BITS);
        assert_eq!(bucket_bits_for(1 << 25), MAX_BUCKET_BITS);
        assert_eq!(bucket_bits_for(u64::MAX), MAX_BUCKET_BITS);
    }
}
