//! Analysis at exit (leak check): the reachability of the live blocks, classified exactly as
//! Valgrind memcheck does (`mc_leakcheck.c`), or as LeakSanitizer does.
//!
//! - Marking from the roots: a pointer to a block's start from a root or from a *reachable*
//!   block makes it reachable; any other pointer into it (an interior pointer, or any pointer
//!   from a *possible* block) makes an unreached block possible. Each change of state pushes
//!   the block on the mark stack, so its contents are (re)scanned with its new state.
//! - Then, in address order, every block still unreached leads a clique: every unreached
//!   block reached from it (start or interior pointer, transitively) is indirect. A leader
//!   reached from a later clique becomes indirect too; a cycle back to the leader is
//!   ignored, so a cycle of lost blocks is one definite block and the rest indirect.
//! - LeakSanitizer's view: interior pointers count as pointers to the block (so nothing is
//!   possible), and a lost block is indirect if any other lost block points into it.
//!
//! A pointer to the one 16-aligned place in a block's last 8 bytes is not counted: it is
//! glibc's pointer to the next chunk, whose first word the block borrows.
//!
//! Blocks are sorted by address; a candidate word is looked up through a page index
//! ([`crate::leak_index`]) after a range check, so the cost is linear in the memory scanned.

use crate::leak_index::BlockIndex;

/// A live tracked block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Block {
    /// The pointer the program got.
    pub start: u64,
    /// Requested bytes.
    pub size: u64,
    pub stack: u32,
    /// One of the `state` codes.
    pub state: u8,
    /// log2 of the offset from glibc's block to `start` (16 for plain blocks).
    pub offset_log2: u8,
    pub reserved: u16,
}

/// Codes of [`Block::state`].
pub mod state {
    pub const UNREACHED: u8 = 0;
    pub const POSSIBLE: u8 = 1;
    pub const REACHABLE: u8 = 2;
    pub const INDIRECT: u8 = 3;
}

/// The marking engine over blocks sorted by `start` and a mark stack of at least twice as
/// many entries.
pub struct Marker<'a> {
    blocks: &'a mut [Block],
    index: Option<BlockIndex<'a>>,
    stack: &'a mut [u32],
    top: usize,
    interior_counts: bool,
    low: u64,
    high: u64,
    /// Bytes of memory read so far.
    pub scanned_bytes: u64,
}

impl<'a> Marker<'a> {
    /// `blocks` sorted by start and not overlapping; `stack` with room for 2 × blocks.
    pub fn new(
        blocks: &'a mut [Block],
        stack: &'a mut [u32],
        interior_counts: bool,
        index: Option<BlockIndex<'a>>,
    ) -> Self {
        let low = blocks.first().map_or(u64::MAX, |b| b.start);
        let high = blocks.last().map_or(0, |b| b.start + b.size.max(1));
        Marker {
            blocks,
            index,
            stack,
            top: 0,
            interior_counts,
            low,
            high,
            scanned_bytes: 0,
        }
    }

    #[cfg(test)]
    pub fn blocks(&self) -> &[Block] {
        self.blocks
    }

    /// The block `value` points into, and whether it points to its start. A zero-sized
    /// block is pointed to by its start only.
    #[inline]
    fn find(&self, value: u64) -> Option<(usize, bool)> {
        if value < self.low || value >= self.high {
            return None;
        }
        let index = match &self.index {
            Some(page_index) => {
                let (low, high) = page_index.candidates(value)?;
                let after = low + self.blocks[low..high].partition_point(|b| b.start <= value);
                after.checked_sub(1)?
            }
            None => self
                .blocks
                .partition_point(|b| b.start <= value)
                .checked_sub(1)?,
        };
        let block = &self.blocks[index];
        let at_start = value == block.start;
        if at_start {
            return Some((index, true));
        }
        let offset = value - block.start;
        // glibc lends a block the first 8 bytes of the next chunk (its `prev_size`), so the
        // next chunk's start — where glibc's free lists and top pointer point — can lie
        // inside the block: the one 16-aligned place in its last 8 bytes. Not a pointer
        // to the block.
        let next_chunk = offset >= block.size.saturating_sub(8) && offset.is_multiple_of(16);
        (offset < block.size && !next_chunk).then_some((index, false))
    }

    fn push(&mut self, index: usize) {
        if self.top < self.stack.len() {
            self.stack[self.top] = index as u32;
            self.top += 1;
        }
    }

    /// A word found in a root (`prior_definite`) or in a block being marked.
    #[inline]
    fn reach(&mut self, value: u64, prior_definite: bool) {
        let Some((index, at_start)) = self.find(value) else {
            return;
        };
        let start_pointer = at_start || self.interior_counts;
        let current = self.blocks[index].state;
        if current == state::REACHABLE {
            return;
        }
        if start_pointer && prior_definite {
            self.blocks[index].state = state::REACHABLE;
            self.push(index);
        } else if current == state::UNREACHED {
            self.blocks[index].state = state::POSSIBLE;
            self.push(index);
        }
    }

    /// Scans the words of `[start, end)` as a root, skipping the blocks' own memory (a
    /// block is never a root).
    ///
    /// # Safety
    /// `[start, end)` is readable.
    pub unsafe fn scan_root(&mut self, start: u64, end: u64) {
        let mut at = start.next_multiple_of(8);
        let mut next_block = self.blocks.partition_point(|b| b.start + b.size <= at);
        while at.saturating_add(8) <= end {
            if let Some(block) = self.blocks.get(next_block) {
                // The block's extent includes memwarden's 16-byte header before it.
                let (skip_from, skip_to) = (block.start - 16, block.start + block.size);
                if at >= skip_from {
                    if at < skip_to {
                        at = skip_to.next_multiple_of(8);
                    }
                    next_block += 1;
                    continue;
                }
            }
            // SAFETY: `at` is 8-aligned and `at + 8 <= end`, inside the readable range.
            let value = unsafe { (at as *const u64).read_volatile() };
            self.reach(value, true);
            at += 8;
        }
        self.scanned_bytes += end.saturating_sub(start);
    }

    /// Words held outside memory (a thread's registers), as a root.
    pub fn scan_values(&mut self, values: &[u64]) {
        for &value in values {
            self.reach(value, true);
        }
    }

    /// Reads the words of block `index`.
    fn for_each_word(&mut self, index: usize, mut each: impl FnMut(&mut Self, u64)) {
        let block = self.blocks[index];
        let mut at = block.start;
        let end = block.start + block.size;
        while at + 8 <= end {
            // SAFETY: a live block found by its valid header; its `size` bytes are inside a
            // readable mapping (checked when it was found), and no other thread runs.
            let value = unsafe { (at as *const u64).read_volatile() };
            each(self, value);
            at += 8;
        }
        self.scanned_bytes += block.size;
    }

    /// Marks everything reachable from what the roots reached.
    pub fn propagate(&mut self) {
        while self.top > 0 {
            self.top -= 1;
            let index = self.stack[self.top] as usize;
            let prior_definite = self.blocks[index].state == state::REACHABLE;
            self.for_each_word(index, |marker, value| marker.reach(value, prior_definite));
        }
    }

    /// Splits the unreached blocks into definite (left unreached) and indirect.
    pub fn classify_lost(&mut self) {
        if self.interior_counts {
            self.classify_lost_lsan();
            return;
        }
        for leader in 0..self.blocks.len() {
            if self.blocks[leader].state != state::UNREACHED {
                continue;
            }
            self.top = 0;
            self.push(leader);
            while self.top > 0 {
                self.top -= 1;
                let index = self.stack[self.top] as usize;
                self.for_each_word(index, |marker, value| {
                    let Some((found, _)) = marker.find(value) else {
                        return;
                    };
                    if found != leader && marker.blocks[found].state == state::UNREACHED {
                        marker.blocks[found].state = state::INDIRECT;
                        marker.push(found);
                    }
                });
            }
        }
    }

    /// LeakSanitizer: a lost block that another lost block points into is indirect.
    fn classify_lost_lsan(&mut self) {
        for index in 0..self.blocks.len() {
            let lost = matches!(self.blocks[index].state, state::UNREACHED | state::INDIRECT);
            if !lost {
                continue;
            }
            self.for_each_word(index, |marker, value| {
                if let Some((found, _)) = marker.find(value) {
                    if found != index && marker.blocks[found].state == state::UNREACHED {
                        marker.blocks[found].state = state::INDIRECT;
                    }
                }
            });
        }
    }
}

/// The leak kind (`memwarden_abi::leak_kind`) of a classified block.
pub fn kind_of(block_state: u8) -> u32 {
    use memwarden_abi::leak_kind;
    match block_state {
        state::REACHABLE => leak_kind::REACHABLE,
        state::POSSIBLE => leak_kind::POSSIBLE,
        state::INDIRECT => leak_kind::INDIRECT,
        _ => leak_kind::DEFINITE,
    }
}

#[cfg(test)]
#[path = "leak_classify_tests.rs"]
mod tests;
