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

/// One stack read made by the unwinder: where, and what it got (or that it was refused).
#[derive(Clone, Copy, Default)]
pub struct StackRead {
    pub address: u64,
    pub value: u64,
    pub ok: bool,
}

impl StackRead {
    pub fn new(address: u64, value: Result<u64, ()>) -> StackRead {
        StackRead {
            address,
            value: value.unwrap_or(0),
            ok: value.is_ok(),
        }
    }

    /// True if reading the word again gives the same answer.
    #[inline]
    pub fn still_holds(&self, read: &impl Fn(u64) -> Result<u64, ()>) -> bool {
        match read(self.address) {
            Ok(value) => self.ok && value == self.value,
            Err(()) => !self.ok,
        }
    }
}

/// The reads of one full unwinding, in order.
#[derive(Clone, Copy)]
pub struct RecordedReads {
    reads: [StackRead; MEMO_READS],
    len: usize,
    overflowed: bool,
}

impl Default for RecordedReads {
    fn default() -> Self {
        RecordedReads {
            reads: [StackRead::default(); MEMO_READS],
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
        // Walks with a refused read are not memoized: they are rare (the end of a stack is a
        // rule, not a failed read).
        if value.is_err() {
            self.overflowed = true;
            return;
        }
        self.reads[self.len] = StackRead::new(address, value);
        self.len += 1;
    }
}

#[derive(Clone, Copy)]
struct Entry {
    key: MemoKey,
    stack: u32,
    used: bool,
    /// The walk was shown not to depend on the first frame's bp (see `store`).
    ignores_bp: bool,
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

/// The set of a key: by ip and sp only, so that an entry that ignores bp is found whatever
/// bp is now (in code built without frame pointers, rbp is an ordinary register).
fn set_index(key: &MemoKey) -> usize {
    let mixed = (key.ip ^ key.sp.rotate_left(29) ^ key.snapshot.rotate_left(47))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> (64 - MEMO_SETS.trailing_zeros())) as usize
}

/// What the memo knows of a key.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The stack id, every word it depended on unchanged.
    Hit(u32),
    /// Nothing usable.
    Miss,
    /// An entry for the same frame exists but was stored for another bp: this frame's bp
    /// varies, so it is worth proving that the walk ignores it (see `store`).
    OnlyBpDiffers,
}

impl Entry {
    fn matches(&self, key: &MemoKey) -> bool {
        self.used
            && self.key.snapshot == key.snapshot
            && self.key.ip == key.ip
            && self.key.sp == key.sp
            && (self.ignores_bp || self.key.bp == key.bp)
    }
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
    pub fn lookup(&mut self, key: &MemoKey, read: &impl Fn(u64) -> Result<u64, ()>) -> Lookup {
        let set = &mut self.sets[set_index(key)];
        let Some(way) = set.ways.iter().position(|entry| entry.matches(key)) else {
            let bp_only = set.ways.iter().any(|entry| {
                entry.used
                    && entry.key.snapshot == key.snapshot
                    && entry.key.ip == key.ip
                    && entry.key.sp == key.sp
            });
            return if bp_only {
                Lookup::OnlyBpDiffers
            } else {
                Lookup::Miss
            };
        };
        let entry = &set.ways[way];
        let unchanged = entry.reads.reads[..entry.reads.len]
            .iter()
            .all(|recorded| recorded.still_holds(read));
        if !unchanged {
            return Lookup::Miss;
        }
        set.recent = way;
        Lookup::Hit(entry.stack)
    }

    /// Remembers the result of a full unwinding (unless it read too many words to keep).
    /// `ignores_bp`: the caller walked again with bp set to 0 and got the same frames with
    /// no refused read, so bp was never used (any use as an address, or as the base of a
    /// frame, would have failed or ended the walk).
    pub fn store(&mut self, key: MemoKey, reads: &RecordedReads, stack: u32, ignores_bp: bool) {
        if reads.overflowed {
            return;
        }
        let set = &mut self.sets[set_index(&key)];
        let way = set
            .ways
            .iter()
            .position(|entry| entry.matches(&key))
            .unwrap_or(1 - set.recent);
        set.ways[way] = Entry {
            key,
            stack,
            used: true,
            ignores_bp,
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
        memo.store(key(), &reads, 7, false);
        let same = |address: u64| {
            Ok(if address == 0x7ff0_0008 {
                0x401234
            } else {
                0x55
            })
        };
        assert_eq!(memo.lookup(&key(), &same), Lookup::Hit(7));
        let changed = |address: u64| Ok(if address == 0x7ff0_0008 { 0x999 } else { 0x55 });
        assert_eq!(memo.lookup(&key(), &changed), Lookup::Miss);
        let unreadable = |_address: u64| Err(());
        assert_eq!(memo.lookup(&key(), &unreadable), Lookup::Miss);
        let other = MemoKey {
            sp: 0x7ff0_0010,
            ..key()
        };
        assert_eq!(memo.lookup(&other, &same), Lookup::Miss);
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
        memo.store(first, &reads, 1, false);
        memo.store(second, &reads, 2, false);
        let memory = |_address: u64| Ok(1);
        assert_eq!(memo.lookup(&first, &memory), Lookup::Hit(1));
        assert_eq!(memo.lookup(&second, &memory), Lookup::Hit(2));
    }

    #[test]
    fn an_entry_that_ignores_bp_matches_any_bp_and_only_that() {
        let mut memo = StackMemo::boxed();
        let mut reads = RecordedReads::default();
        reads.push(0x7ff0_0008, Ok(1));
        memo.store(key(), &reads, 4, true);
        let memory = |_address: u64| Ok(1);
        assert_eq!(
            memo.lookup(
                &MemoKey {
                    bp: 0x1234,
                    ..key()
                },
                &memory
            ),
            Lookup::Hit(4)
        );
        memo.store(
            MemoKey {
                ip: 0x402000,
                ..key()
            },
            &reads,
            5,
            false,
        );
        let other_bp = MemoKey {
            ip: 0x402000,
            bp: 0x1234,
            ..key()
        };
        assert_eq!(memo.lookup(&other_bp, &memory), Lookup::OnlyBpDiffers);
    }

    #[test]
    fn walks_with_a_refused_read_are_not_stored() {
        let mut memo = StackMemo::boxed();
        let mut reads = RecordedReads::default();
        reads.push(0x7ff0_0008, Err(()));
        memo.store(key(), &reads, 9, false);
        assert_eq!(memo.lookup(&key(), &|_address: u64| Err(())), Lookup::Miss);
    }

    #[test]
    fn walks_too_deep_to_remember_are_not_stored() {
        let mut memo = StackMemo::boxed();
        let mut reads = RecordedReads::default();
        for word in 0..=MEMO_READS as u64 {
            reads.push(0x7ff0_0000 + word * 8, Ok(word));
        }
        memo.store(key(), &reads, 3, false);
        assert_eq!(
            memo.lookup(&key(), &|a: u64| Ok((a - 0x7ff0_0000) / 8)),
            Lookup::Miss
        );
    }
}
