//! Store: interns call stacks. Each unique stack gets a dense id, a `StackRecord` in the
//! profile file and its frames in the file's frame area; a hash-chain index in anonymous
//! memory finds a known stack without locks (new stacks are linked in with one CAS).

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memwarden_abi::{flags, Header, StackRecord, UNKNOWN_STACK_ID};

use crate::lifecycle;
use crate::profile_file::ProfileFile;

/// Stacks per hash chain, on average, once the table is full: chains stay short enough
/// that a lookup reads a few records even for the two million stacks of `import torch`,
/// and the index of a program of a few thousand stacks stays within 2 MiB.
const STACKS_PER_BUCKET: u64 = 8;
/// Bounds of the chain count: the index costs 4 bytes a chain, in huge pages touched as
/// chains are first used (2 MiB, one huge page, by default).
const MIN_BUCKET_BITS: u32 = 16;
const MAX_BUCKET_BITS: u32 = 22;

pub struct StackTable {
    /// Head stack id of each hash chain (0 = empty), in an anonymous mapping.
    buckets: *const AtomicU32,
    /// log2 of the number of chains.
    bucket_bits: u32,
}

// SAFETY: the bucket array is shared memory accessed only through atomics.
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

fn next_link(record: *mut StackRecord) -> &'static AtomicU32 {
    // SAFETY: `next` is an aligned u32 inside a record of the mapped file, which lives for
    // the whole process; it is only accessed atomically.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*record).next)) }
}

fn published(record: *mut StackRecord) -> &'static AtomicU32 {
    // SAFETY: as `next_link`, for the `published` word.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*record).published)) }
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
        Some(StackTable {
            buckets: buckets.cast(),
            bucket_bits,
        })
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
        let mut head = bucket.load(Ordering::Acquire);
        if let Some(id) = find(file, head, UNKNOWN_STACK_ID, hash, frames) {
            return id;
        }
        let Some(id) = self.store(file, hash, frames) else {
            return UNKNOWN_STACK_ID;
        };
        let record = file.stack(u64::from(id));
        loop {
            next_link(record).store(head, Ordering::Relaxed);
            match bucket.compare_exchange(head, id, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    published(record).store(1, Ordering::Release);
                    return id;
                }
                Err(newer) => {
                    // Another thread linked stacks meanwhile; one may be ours. Our record
                    // then stays unpublished, a hole the reader skips.
                    if let Some(existing) = find(file, newer, head, hash, frames) {
                        return existing;
                    }
                    head = newer;
                }
            }
        }
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

/// Walks a chain from `from` until `until`, for a record with these frames.
fn find(file: &ProfileFile, from: u32, until: u32, hash: u64, frames: &[u64]) -> Option<u32> {
    let mut id = from;
    while id != UNKNOWN_STACK_ID && id != until {
        let record = file.stack(u64::from(id));
        // SAFETY: ids in a chain were linked after their record and frames were written
        // (release CAS on the bucket, acquire load by the caller), and never change again.
        let same = unsafe {
            (*record).hash == hash
                && (*record).depth as usize == frames.len()
                && core::slice::from_raw_parts(
                    file.frame_words((*record).frames_start),
                    frames.len(),
                ) == frames
        };
        if same {
            return Some(id);
        }
        id = next_link(record).load(Ordering::Acquire);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
