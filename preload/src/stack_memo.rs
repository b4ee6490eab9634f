//! Interposed call → stack: a per-thread memo of recent stacks.
//!
//! Unwinding from a frame's registers (ip, sp, bp) is a deterministic function of the stack
//! words it reads. For the state at the first frame outside memwarden, the memo keeps the
//! words the last full unwinding read (with their values) and the stack id it produced. If
//! every one of those words still holds its value, a new unwinding would produce exactly the
//! same frames, so the id is reused with no unwinding, hashing or table lookup. Any change —
//! another caller, another return address, another module snapshot — is a miss.

/// Sets per thread; each holds two entries (two-way set-associative, so two hot call sites
/// that hash alike do not evict each other).
const MEMO_SETS: usize = 32;
/// Stack words an entry can remember; deeper walks are simply not memoized.
const MEMO_READS: usize = 32;

/// The unwinding state at the first frame outside memwarden, and the module snapshot used.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct MemoKey {
    pub snapshot: u64,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// One stack read made by the unwinder: where, and what it got. Walks with a refused read
/// are not memoized (they are rare: the end of a stack is a rule, not a failed read).
#[derive(Clone, Copy, Default)]
struct Read {
    address: u64,
    value: u64,
}

/// The reads of one full unwinding, in order.
#[derive(Clone, Copy)]
pub struct RecordedReads {
    reads: [Read; MEMO_READS],
    len: usize,
    overflowed: bool,
}

impl Default for RecordedReads {
    fn default() -> Self {
        RecordedReads {
            reads: [Read::default(); MEMO_READS],
            len: 0,
            overflowed: false,
        }
    }
}

impl RecordedReads {
    /// Reads an entry can hold.
    pub const CAPACITY: usize = MEMO_READS;

    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    pub fn push(&mut self, address: u64, value: Result<u64, ()>) {
        if self.len == MEMO_READS {
            self.overflowed = true;
            return;
        }
        let Ok(value) = value else {
            self.overflowed = true;
            return;
        };
        self.reads[self.len] = Read { address, value };
        self.len += 1;
    }
}

#[derive(Clone, Copy)]
struct Entry {
    key: MemoKey,
    stack: u32,
    used: bool,
    reads: RecordedReads,
}

#[derive(Clone, Copy)]
struct Set {
    ways: [Entry; 2],
    /// The way used last; a store replaces the other.
    recent: usize,
}

pub struct StackMemo {
    sets: [Set; MEMO_SETS],
}

fn set_index(key: &MemoKey) -> usize {
    let mixed = (key.ip ^ key.sp.rotate_left(29) ^ key.bp.rotate_left(47))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> (64 - MEMO_SETS.trailing_zeros())) as usize
}

impl StackMemo {
    /// An empty memo, made directly on the heap (it is tens of KiB: too big for small
    /// thread stacks).
    pub fn boxed() -> Box<StackMemo> {
        let memo = Box::<StackMemo>::new_zeroed();
        // SAFETY: all-zero bytes are a valid StackMemo: every entry unused, integers zero,
        // booleans false.
        unsafe { memo.assume_init() }
    }

    /// The stack id remembered for `key`, if every stack word it depended on is unchanged.
    #[inline]
    pub fn lookup(&mut self, key: &MemoKey, read: &impl Fn(u64) -> Result<u64, ()>) -> Option<u32> {
        let set = &mut self.sets[set_index(key)];
        let way = set
            .ways
            .iter()
            .position(|entry| entry.used && entry.key == *key)?;
        let entry = &set.ways[way];
        let unchanged = entry.reads.reads[..entry.reads.len]
            .iter()
            .all(|recorded| read(recorded.address) == Ok(recorded.value));
        if !unchanged {
            return None;
        }
        set.recent = way;
        Some(entry.stack)
    }

    /// Remembers the result of a full unwinding (unless it read too many words to keep).
    pub fn store(&mut self, key: MemoKey, reads: &RecordedReads, stack: u32) {
        if reads.overflowed {
            return;
        }
        let set = &mut self.sets[set_index(&key)];
        let way = set
            .ways
            .iter()
            .position(|entry| entry.used && entry.key == key)
            .unwrap_or(1 - set.recent);
        set.ways[way] = Entry {
            key,
            stack,
            used: true,
            reads: *reads,
        };
        set.recent = way;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> MemoKey {
        MemoKey {
            snapshot: 1,
            ip: 0x401000,
            sp: 0x7ff0_0000,
            bp: 0,
        }
    }

    #[test]
    fn hit_only_while_every_read_word_is_unchanged() {
        let mut memo = StackMemo::boxed();
        let mut reads = RecordedReads::default();
        reads.push(0x7ff0_0008, Ok(0x401234));
        reads.push(0x7ff0_0100, Ok(0x55));
        memo.store(key(), &reads, 7);
        let same = |address: u64| {
            Ok(if address == 0x7ff0_0008 {
                0x401234
            } else {
                0x55
            })
        };
        assert_eq!(memo.lookup(&key(), &same), Some(7));
        let changed = |address: u64| Ok(if address == 0x7ff0_0008 { 0x999 } else { 0x55 });
        assert_eq!(memo.lookup(&key(), &changed), None);
        let unreadable = |_address: u64| Err(());
        assert_eq!(memo.lookup(&key(), &unreadable), None);
        let other = MemoKey {
            sp: 0x7ff0_0010,
            ..key()
        };
        assert_eq!(memo.lookup(&other, &same), None);
    }

    #[test]
    fn two_keys_of_one_set_both_stay() {
        let mut memo = StackMemo::boxed();
        let first = key();
        let second = (1..u64::MAX)
            .map(|n| MemoKey {
                ip: first.ip + n,
                ..first
            })
            .find(|k| set_index(k) == set_index(&first))
            .unwrap();
        let mut reads = RecordedReads::default();
        reads.push(0x7ff0_0008, Ok(1));
        memo.store(first, &reads, 1);
        memo.store(second, &reads, 2);
        let memory = |_address: u64| Ok(1);
        assert_eq!(memo.lookup(&first, &memory), Some(1));
        assert_eq!(memo.lookup(&second, &memory), Some(2));
    }

    #[test]
    fn walks_with_a_refused_read_are_not_stored() {
        let mut memo = StackMemo::boxed();
        let mut reads = RecordedReads::default();
        reads.push(0x7ff0_0008, Err(()));
        memo.store(key(), &reads, 9);
        assert_eq!(memo.lookup(&key(), &|_address: u64| Err(())), None);
    }

    #[test]
    fn walks_too_deep_to_remember_are_not_stored() {
        let mut memo = StackMemo::boxed();
        let mut reads = RecordedReads::default();
        for word in 0..=MEMO_READS as u64 {
            reads.push(0x7ff0_0000 + word * 8, Ok(word));
        }
        memo.store(key(), &reads, 3);
        assert_eq!(
            memo.lookup(&key(), &|a: u64| Ok((a - 0x7ff0_0000) / 8)),
            None
        );
    }
}
