//! Interposed call → stack: reuse of the outer part of the thread's previous stack.
//!
//! Consecutive allocations of a thread usually share most of their stack: only the innermost
//! frames differ. Unwinding from a frame's registers (ip, sp, bp) is a deterministic function
//! of the stack words it reads, so when a new walk reaches a level whose registers equal
//! those of a level of the previous stack, and every word the previous walk read from that
//! level on still holds its value, the rest of the stack is the previous one's. The walk
//! stops there and splices. Anything else — a changed word, other registers — just walks on.

use crate::stack_memo::{RecordedReads, StackRead};

/// Deepest stack kept (the layout's limit).
pub const MAX_LEVELS: usize = memwarden_abi::MAX_DEPTH_LIMIT as usize;
/// Stack words a walk can remember (two per level is the common worst case).
const MAX_READS: usize = 2 * MAX_LEVELS;

/// The registers at one frame: its address and its caller-visible stack and frame pointers.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct Level {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// One walk: its levels in order (innermost first) and, for each, where the reads made to
/// unwind past it start.
pub struct Walk {
    levels: [Level; MAX_LEVELS],
    /// The levels' `ip`s again, contiguous: the frames to intern.
    ips: [u64; MAX_LEVELS],
    /// The stack id the walk was interned as.
    stack: u32,
    reads_start: [u32; MAX_LEVELS],
    count: usize,
    reads: [StackRead; MAX_READS],
    reads_len: usize,
    overflowed: bool,
    /// The walk stopped at the depth limit, not at the end of the stack.
    truncated: bool,
    /// The first level from which on the walk is shown not to use bp (see
    /// [`Walk::keep_return_address_reads`]): resuming there needs no equal bp.
    bp_free_from: usize,
    /// The module snapshot it was made with (0: no valid walk).
    snapshot: u64,
}

impl Walk {
    /// An empty walk, made directly on the heap (it is about 20 KiB).
    pub fn boxed() -> Box<Walk> {
        let walk = Box::<Walk>::new_zeroed();
        // SAFETY: all-zero bytes are a valid Walk: integers zero, booleans false, no levels.
        unsafe { walk.assume_init() }
    }

    pub fn clear(&mut self, snapshot: u64) {
        self.count = 0;
        self.reads_len = 0;
        self.overflowed = false;
        self.truncated = false;
        self.bp_free_from = MAX_LEVELS;
        self.snapshot = snapshot;
    }

    /// Appends a level; the reads recorded after this call belong to unwinding past it.
    pub fn push_level(&mut self, level: Level) {
        if self.count < MAX_LEVELS {
            self.levels[self.count] = level;
            self.ips[self.count] = level.ip;
            self.reads_start[self.count] = self.reads_len as u32;
            self.count += 1;
        }
    }

    pub fn record_read(&mut self, address: u64, value: Result<u64, ()>) {
        if self.reads_len == MAX_READS {
            self.overflowed = true;
            return;
        }
        self.reads[self.reads_len] = StackRead::new(address, value);
        self.reads_len += 1;
    }

    pub fn set_truncated(&mut self) {
        self.truncated = true;
    }

    pub fn len(&self) -> usize {
        self.count
    }

    /// The frame addresses, innermost first.
    pub fn frames(&self) -> &[u64] {
        &self.ips[..self.count]
    }

    /// The stack id this walk was interned as.
    pub fn stack(&self) -> u32 {
        self.stack
    }

    pub fn set_stack(&mut self, stack: u32) {
        self.stack = stack;
    }

    /// The level of the previous walk (`self`) where `level` can resume, if every word
    /// read from there on is unchanged and the result would not be cut short by a depth
    /// limit the previous walk hit.
    ///
    /// `cursor` starts at 0 for each new walk: stack pointers strictly increase from one
    /// level to the next in both walks, so it only moves forward.
    pub fn resume_point(
        &self,
        cursor: &mut usize,
        snapshot: u64,
        level: &Level,
        new_levels: usize,
        depth: usize,
        read: &impl Fn(u64) -> Result<u64, ()>,
    ) -> Option<usize> {
        if self.snapshot != snapshot || self.overflowed {
            return None;
        }
        while *cursor < self.count && self.levels[*cursor].sp < level.sp {
            *cursor += 1;
        }
        let at = *cursor;
        let found = self.levels[..self.count].get(at)?;
        let bp_free = at >= self.bp_free_from;
        if found.ip != level.ip || found.sp != level.sp || (!bp_free && found.bp != level.bp) {
            return None;
        }
        if self.truncated && new_levels + (self.count - at) < depth {
            return None;
        }
        let start = self.reads_start[at] as usize;
        let unchanged = self.reads[start..self.reads_len]
            .iter()
            .all(|recorded| recorded.still_holds(read));
        unchanged.then_some(at)
    }

    /// Completes `self` (a new walk whose last pushed level equals `previous`'s level
    /// `at`) with the previous walk's levels and reads from `at` on.
    pub fn splice_from(&mut self, previous: &Walk, at: usize, depth: usize) {
        // The equal level was pushed by the new walk already; replace it by the previous
        // walk's tail so its reads come along.
        self.count -= 1;
        self.bp_free_from = self.count + previous.bp_free_from.saturating_sub(at);
        self.reads_len = self.reads_start[self.count] as usize;
        let shift = previous.reads_start[at] as usize;
        let mut cut = false;
        for index in at..previous.count {
            if self.count == depth.min(MAX_LEVELS) {
                cut = true;
                break;
            }
            self.levels[self.count] = previous.levels[index];
            self.ips[self.count] = previous.ips[index];
            let start = previous.reads_start[index] as usize - shift + self.reads_len;
            self.reads_start[self.count] = start as u32;
            self.count += 1;
        }
        let tail = &previous.reads[shift..previous.reads_len];
        if self.reads_len + tail.len() > MAX_READS {
            self.overflowed = true;
            return;
        }
        self.reads[self.reads_len..self.reads_len + tail.len()].copy_from_slice(tail);
        self.reads_len += tail.len();
        // Extra reads past a cut only make later resumption stricter, never wrong.
        self.truncated = cut || previous.truncated;
    }

    /// The walk's reads as a memo entry can hold them, if they fit.
    pub fn memo_reads(&self) -> Option<RecordedReads> {
        // Known not to fit before any is copied: under a deep recursion (CPython's parser)
        // most walks that miss the memo are too long for it.
        if self.reads_len > RecordedReads::CAPACITY {
            return None;
        }
        self.memo_reads_where(|_, _| true)
    }

    /// The reads the walk's frames depend on if it never used bp: the return addresses it
    /// read, and every read made past its last level (which decided that the walk ended).
    /// As a memo entry can hold them, if they fit.
    pub fn return_address_reads(&self) -> Option<RecordedReads> {
        self.memo_reads_where(|level, read| self.keeps(level, read))
    }

    /// Drops every read but [`Walk::return_address_reads`]', once the walk is shown to
    /// depend on nothing else, bp included: later walks then resume from it whatever the
    /// other words and bp.
    pub fn keep_return_address_reads(&mut self) {
        self.bp_free_from = 0;
        let mut kept = 0;
        for level in 0..self.count {
            let (start, end) = self.reads_of(level);
            self.reads_start[level] = kept as u32;
            for index in start..end {
                let read = self.reads[index];
                if self.keeps(level, &read) {
                    self.reads[kept] = read;
                    kept += 1;
                }
            }
        }
        self.reads_len = kept;
    }

    fn memo_reads_where(&self, keep: impl Fn(usize, &StackRead) -> bool) -> Option<RecordedReads> {
        if self.overflowed || self.truncated {
            return None;
        }
        let mut reads = RecordedReads::default();
        for level in 0..self.count {
            let (start, end) = self.reads_of(level);
            for read in self.reads[start..end]
                .iter()
                .filter(|read| keep(level, read))
            {
                let value = if read.ok { Ok(read.value) } else { Err(()) };
                match self.is_return(level, read) {
                    true => reads.push_return(read.address, value),
                    false => reads.push(read.address, value),
                }
                if reads.overflowed() {
                    return None;
                }
            }
        }
        Some(reads)
    }

    /// The range of `reads` made to unwind past level `level`.
    fn reads_of(&self, level: usize) -> (usize, usize) {
        let end = match level + 1 < self.count {
            true => self.reads_start[level + 1] as usize,
            false => self.reads_len,
        };
        (self.reads_start[level] as usize, end)
    }

    /// Whether `read`, made past level `level`, is one [`Walk::return_address_reads`] keeps:
    /// the word the next level's address came from (just below its stack pointer, the
    /// canonical frame address), or any read past the last level.
    fn keeps(&self, level: usize, read: &StackRead) -> bool {
        level + 1 >= self.count || self.is_return(level, read)
    }

    /// Whether `read`, made past level `level`, fetched the next level's address.
    fn is_return(&self, level: usize, read: &StackRead) -> bool {
        let Some(next) = self.levels[..self.count].get(level + 1) else {
            return false;
        };
        read.ok && read.address == next.sp.wrapping_sub(8) && read.value == next.ip
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(ip: u64, sp: u64) -> Level {
        Level { ip, sp, bp: 0 }
    }

    /// A walk of `levels` where unwinding past level i reads the word at its sp.
    fn walk_of(levels: &[Level], memory: &impl Fn(u64) -> Result<u64, ()>) -> Box<Walk> {
        let mut walk = Walk::boxed();
        walk.clear(1);
        for l in levels {
            walk.push_level(*l);
            walk.record_read(l.sp, memory(l.sp));
        }
        walk
    }

    #[test]
    fn resumes_at_an_equal_level_with_unchanged_words_and_splices_the_tail() {
        let memory = |address: u64| Ok(address * 3);
        let previous = walk_of(
            &[
                level(10, 100),
                level(20, 200),
                level(30, 300),
                level(40, 400),
            ],
            &memory,
        );
        let at = previous.resume_point(&mut 0, 1, &level(30, 300), 2, 64, &memory);
        assert_eq!(at, Some(2));
        let mut fresh = walk_of(&[level(11, 150), level(30, 300)], &memory);
        fresh.splice_from(&previous, 2, 64);
        assert_eq!(fresh.frames(), &[11, 30, 40]);
        // The spliced walk can itself be resumed from its spliced part.
        assert_eq!(
            fresh.resume_point(&mut 0, 1, &level(40, 400), 1, 64, &memory),
            Some(2)
        );
    }

    #[test]
    fn refuses_when_a_word_changed_or_registers_differ_or_the_snapshot_changed() {
        let memory = |address: u64| Ok(address * 3);
        let previous = walk_of(&[level(10, 100), level(30, 300), level(40, 400)], &memory);
        let changed = |address: u64| {
            if address == 400 {
                Ok(7)
            } else {
                Ok(address * 3)
            }
        };
        assert_eq!(
            previous.resume_point(&mut 0, 1, &level(30, 300), 1, 64, &changed),
            None
        );
        assert_eq!(
            previous.resume_point(&mut 0, 1, &level(31, 300), 1, 64, &memory),
            None
        );
        assert_eq!(
            previous.resume_point(
                &mut 0,
                1,
                &Level {
                    ip: 30,
                    sp: 300,
                    bp: 5
                },
                1,
                64,
                &memory
            ),
            None
        );
        assert_eq!(
            previous.resume_point(&mut 0, 2, &level(30, 300), 1, 64, &memory),
            None
        );
    }

    #[test]
    fn a_walk_cut_by_the_depth_limit_only_resumes_if_the_result_reaches_it() {
        let memory = |address: u64| Ok(address);
        let mut previous = walk_of(&[level(10, 100), level(20, 200), level(30, 300)], &memory);
        previous.set_truncated();
        assert_eq!(
            previous.resume_point(&mut 0, 1, &level(20, 200), 0, 3, &memory),
            None
        );
        assert_eq!(
            previous.resume_point(&mut 0, 1, &level(20, 200), 1, 3, &memory),
            Some(1)
        );
    }

    #[test]
    fn a_walk_with_more_reads_than_a_memo_entry_holds_is_not_memoized() {
        let memory = |address: u64| Ok(address);
        let levels = |count: u64| -> Vec<Level> { (1..=count).map(|i| level(i, i * 16)).collect() };
        let fits = walk_of(&levels(RecordedReads::CAPACITY as u64), &memory);
        let reads = fits.memo_reads().expect("as many reads as an entry holds");
        assert_eq!(reads.iter().count(), RecordedReads::CAPACITY);
        assert_eq!(reads.iter().last().map(|read| read.address), Some(32 * 16));
        let deeper = walk_of(&levels(RecordedReads::CAPACITY as u64 + 1), &memory);
        assert!(deeper.memo_reads().is_none());
        // Its return-address reads alone (here: only the read past its last level) fit.
        assert!(deeper.return_address_reads().is_some());
    }

    /// A walk like a real one: unwinding past level i reads a saved bp at its sp and the
    /// next level's address just below the next level's sp.
    fn walk_with_return_addresses(levels: &[Level], saved_bp: u64) -> Box<Walk> {
        let mut walk = Walk::boxed();
        walk.clear(1);
        for (i, l) in levels.iter().enumerate() {
            walk.push_level(*l);
            walk.record_read(l.sp, Ok(saved_bp));
            if let Some(next) = levels.get(i + 1) {
                walk.record_read(next.sp - 8, Ok(next.ip));
            }
        }
        walk
    }

    #[test]
    fn a_walk_kept_to_its_return_addresses_resumes_whatever_the_other_words_and_bp() {
        let levels = [level(10, 100), level(20, 200), level(30, 300)];
        let mut walk = walk_with_return_addresses(&levels, 0x5555);
        let memory = |address: u64| match address {
            192 => Ok(20),
            292 => Ok(30),
            _ => Ok(0x7777),
        };
        let other_bp = Level {
            ip: 20,
            sp: 200,
            bp: 0x1234,
        };
        // Every read kept: the saved bp changed, and bp must be equal.
        assert_eq!(
            walk.resume_point(&mut 0, 1, &level(20, 200), 1, 64, &memory),
            None
        );
        let kept = walk.return_address_reads().unwrap();
        let words: Vec<u64> = kept.iter().map(|read| read.address).collect();
        // The return addresses, and the saved bp read past the last level.
        assert_eq!(words, [192, 292, 300]);
        walk.keep_return_address_reads();
        let memory = |address: u64| match address {
            300 => Ok(0x5555),
            _ => memory(address),
        };
        assert_eq!(
            walk.resume_point(&mut 0, 1, &other_bp, 1, 64, &memory),
            Some(1)
        );
        let return_changed = |address: u64| match address {
            292 => Ok(31),
            _ => memory(address),
        };
        assert_eq!(
            walk.resume_point(&mut 0, 1, &other_bp, 1, 64, &return_changed),
            None
        );
        // A walk spliced onto it resumes without bp from the spliced part on only.
        let mut fresh = walk_with_return_addresses(&[level(11, 150), level(20, 200)], 0x6666);
        fresh.splice_from(&walk, 1, 64);
        assert_eq!(fresh.frames(), &[11, 20, 30]);
        let other_bp_at_start = Level {
            bp: 9,
            ..level(11, 150)
        };
        assert_eq!(
            fresh.resume_point(&mut 0, 1, &other_bp_at_start, 0, 64, &memory),
            None
        );
        assert_eq!(
            fresh.resume_point(&mut 0, 1, &other_bp, 1, 64, &memory),
            Some(1)
        );
    }
}
