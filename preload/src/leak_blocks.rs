//! Analysis at exit (leak check): finds the live blocks with no bookkeeping while the
//! program runs. Every tracked block carries memwarden's header, whose check word depends
//! on the block's address, and a free (or a realloc that moves the block) erases it; so
//! the live blocks are exactly the valid headers in the anonymous memory glibc hands out.
//! The scan steps 16 bytes at a time, rejects most places on the header's fixed zero bits,
//! and jumps over each block it finds.
//!
//! It also names glibc's heap memory, which is never a root (free chunks keep stale
//! pointers): `[heap]` (the main arena), each non-main arena heap (glibc reserves 64 MiB
//! aligned to 64 MiB, read-write up to its top and inaccessible above, so it shows as a
//! read-write mapping up to an inaccessible one that ends on a 64 MiB boundary, with live
//! blocks in it), and each block's own chunk — page-rounded for a chunk glibc mapped on its
//! own, whose header sits at the start of a page.

use crate::block_header;
use crate::leak_classify::Block;
use crate::leak_maps::{vma, Maps, Vma};

/// glibc's `HEAP_MAX_SIZE` on 64-bit: the size and alignment of a non-main arena heap.
const ARENA_HEAP: u64 = 64 << 20;
const PAGE: u64 = 4096;

/// An address range `[start, end)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Interval {
    pub start: u64,
    pub end: u64,
}

/// Where blocks can be: private, read-write, anonymous memory, not a stack and not
/// memwarden's own (its scratch memory lies in these too, but holds no header).
pub fn may_hold_blocks(v: &Vma) -> bool {
    v.is_private_data() && v.has(vma::ANONYMOUS) && !v.has(vma::STACK)
}

/// Room for every block the mappings could hold (a glibc chunk is at least 32 bytes).
pub fn block_capacity(maps: &Maps) -> usize {
    let bytes: u64 = maps
        .as_slice()
        .iter()
        .filter(|v| may_hold_blocks(v))
        .map(|v| v.end - v.start)
        .sum();
    (bytes / 32) as usize + 1
}

/// Fills `into` with the live blocks in address order, outside the sorted, disjoint
/// `own` ranges (memwarden's memory); returns how many.
pub fn find_blocks(maps: &Maps, own: &[Interval], into: &mut [Block]) -> usize {
    let mut count = 0;
    for v in maps.as_slice().iter().filter(|v| may_hold_blocks(v)) {
        // The first user pointer possible: glibc's chunk header, then memwarden's.
        let mut user = v.start.next_multiple_of(16) + 32;
        let mut next_own = own.partition_point(|o| o.end <= v.start);
        while user <= v.end && count < into.len() {
            if let Some(o) = own.get(next_own) {
                if user - 32 >= o.start {
                    if user - 32 < o.end {
                        user = o.end.next_multiple_of(16) + 32;
                    }
                    next_own += 1;
                    continue;
                }
            }
            // SAFETY: user - 16 .. user lies inside the readable mapping `v`.
            let word0 = unsafe { ((user - 16) as *const u64).read_volatile() };
            let offset_log2 = (word0 >> 48) & 0x3f;
            if word0 >> 54 != 0 || offset_log2 < 4 {
                user += 16;
                continue;
            }
            // SAFETY: the 16 bytes before `user` are readable (checked above).
            let Some(tracked) = (unsafe { block_header::read(user as *mut libc::c_void) }) else {
                user += 16;
                continue;
            };
            let end = user.saturating_add(tracked.size);
            if end > v.end || (tracked.base as u64) < v.start + 16 {
                user += 16;
                continue;
            }
            into[count] = Block {
                start: user,
                size: tracked.size,
                stack: tracked.stack,
                offset_log2: offset_log2 as u8,
                ..Block::default()
            };
            count += 1;
            user = end.next_multiple_of(16) + 16;
        }
    }
    count
}

/// glibc's heap memory and the chunks glibc mapped on their own: never roots. Pushed into `into`;
/// returns how many.
pub fn allocator_intervals(maps: &Maps, blocks: &[Block], into: &mut [Interval]) -> usize {
    let mut count = 0;
    let mut push = |interval: Interval, count: &mut usize| {
        if *count < into.len() && interval.end > interval.start {
            into[*count] = interval;
            *count += 1;
        }
    };
    let holds_block = |start: u64, end: u64| {
        let first = blocks.partition_point(|b| b.start < start);
        blocks.get(first).is_some_and(|b| b.start < end)
    };
    for v in maps.as_slice() {
        if v.has(vma::HEAP) {
            push(
                Interval {
                    start: v.start,
                    end: v.end,
                },
                &mut count,
            );
        }
        let reserve = v.has(vma::ANONYMOUS) && !v.has(vma::READ) && !v.has(vma::WRITE);
        if reserve && v.end.is_multiple_of(ARENA_HEAP) {
            let heap = v.end - ARENA_HEAP;
            if heap < v.start && holds_block(heap, v.start) {
                push(
                    Interval {
                        start: heap,
                        end: v.start,
                    },
                    &mut count,
                );
            }
        }
    }
    // A block's own memory is skipped by the root scan; a chunk glibc mapped on its own
    // also has its glibc header and the rest of its last page.
    for block in blocks {
        let chunk = block.start - (1u64 << block.offset_log2) - 16;
        if chunk.is_multiple_of(PAGE) {
            let end = (block.start + block.size).next_multiple_of(PAGE);
            push(Interval { start: chunk, end }, &mut count);
        }
    }
    count
}
