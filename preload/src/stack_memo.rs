//! Interposed call → stack: a per-thread memo of recent stacks.
//!
//! Unwinding from a frame's registers (ip, sp, bp) is a deterministic function of the stack
//! words it reads. For the state at the first frame outside memwarden, the memo keeps the
//! words the last full unwinding read (with their values) and the stack id it produced. If
//! every one of those words still holds its value, a new unwinding would produce exactly the
//! same frames, so the id is reused with no unwinding, hashing or table lookup. Any change —
//! another caller, another return address, another module snapshot — is a miss.

/// Entries per thread (direct-mapped).
const MEMO_ENTRIES: usize = 32;
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

/// One stack read made by the unwinder: where, and what it got (or that it was refused).
#[derive(Clone, Copy, Default)]
struct Read {
    address: u64,
    value: u64,
    ok: bool,
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
        self.reads[self.len] = Read {
            address,
            value: value.unwrap_or(0),
            ok: value.is_ok(),
        };
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

pub struct StackMemo {
    entries: [Entry; MEMO_ENTRIES],
}

fn index(key: &MemoKey) -> usize {
    let mixed = (key.ip ^ key.sp.rotate_left(29) ^ key.bp.rotate_left(47))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> (64 - MEMO_ENTRIES.trailing_zeros())) as usize
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
    pub fn lookup(&self, key: &MemoKey, read: &impl Fn(u64) -> Result<u64, ()>) -> Option<u32> {
        let entry = &self.entries[index(key)];
        if !entry.used || entry.key != *key {
            return None;
        }
        let unchanged = entry.reads.reads[..entry.reads.len].iter().all(|recorded| {
            match read(recorded.address) {
                Ok(value) => recorded.ok && value == recorded.value,
                Err(()) => !recorded.ok,
            }
        });
        unchanged.then_some(entry.stack)
    }

    /// Remembers the result of a full unwinding (unless it read too many words to keep).
    pub fn store(&mut self, key: MemoKey, reads: &RecordedReads, stack: u32) {
        if reads.overflowed {
            return;
        }
        self.entries[index(&key)] = Entry {
            key,
            stack,
            used: true,
            reads: *reads,
        };
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
        reads.push(0x7ff0_0100, Err(()));
        memo.store(key(), &reads, 7);
        let same = |address: u64| {
            if address == 0x7ff0_0008 {
                Ok(0x401234)
            } else {
                Err(())
            }
        };
        assert_eq!(memo.lookup(&key(), &same), Some(7));
        let changed = |address: u64| {
            if address == 0x7ff0_0008 {
                Ok(0x999)
            } else {
                Err(())
            }
        };
        assert_eq!(memo.lookup(&key(), &changed), None);
        let now_readable = |_address: u64| Ok(0x401234);
        assert_eq!(memo.lookup(&key(), &now_readable), None);
        let other = MemoKey {
            sp: 0x7ff0_0010,
            ..key()
        };
        assert_eq!(memo.lookup(&other, &same), None);
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
