//! Interposed call → stack: a per-thread memo of recent stacks.
//!
//! Unwinding from a frame's registers (ip, sp, bp) is a deterministic function of the stack
//! words it reads. For the state at the first frame outside memwarden, the memo keeps the
//! words the last full unwinding read (with their values) and the stack id it produced. If
//! every one of those words still holds its value, a new unwinding would produce exactly the
//! same frames, so the id is reused with no unwinding, hashing or table lookup. Any change —
//! another caller, another return address, another module snapshot — is a miss. Once a
//! second walk has shown that the frames depend on the return addresses alone (`Proof`),
//! the entry keeps only those: saved values of rbp may then change at will.

use crate::word_hash::{hash_in_lanes, WordHash};

/// Sets per thread, each of [`WAYS`] entries: a hot loop's dozen call sites then fit
/// however their addresses fall. With two ways of 32 sets, three sites sharing a set (as
/// about one run in three had, by where the loader put things) evicted each other on every
/// pass, and most of a NumPy loop's stacks were unwound again. Eight ways of 32 sets rather
/// than four of 64 (the same 256 entries): a program whose allocations all go through one
/// wrapper (sqlite's `sqlite3MemMalloc`) reaches `malloc` at one return address and a few
/// stack pointers, each by many paths, and each frame keeps an entry per path in its set.
/// With four ways, the sqlite benchmark's walks in full went from 0.18 to 2.9 million from
/// run to run, by where ASLR put the stack (which frames shared a set); with eight, 22,000
/// to 49,000.
const MEMO_SETS: usize = 32;
const WAYS: usize = 8;
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

/// A word a memo entry depends on, and its value (every memoized read succeeded).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoRead {
    pub address: u64,
    pub value: u64,
}

/// The calling thread's stack words, as the memo reads them to check an entry.
pub trait StackWords {
    /// The word at `address`, or `Err` where the stack may not be read.
    fn read(&self, address: u64) -> Result<u64, ()>;

    /// Whether every aligned word from `lowest` to `highest` (both included) reads.
    fn all_read(&self, lowest: u64, highest: u64) -> bool;

    /// The word at `address`, with no check.
    ///
    /// # Safety
    /// `address` is aligned and lies between two addresses that [`StackWords::all_read`]
    /// accepted.
    unsafe fn read_unchecked(&self, address: u64) -> u64;
}

/// Any function from an address to a word (tests' made-up stacks): every word is read
/// through it, so a span is never known to read as a whole.
impl<F: Fn(u64) -> Result<u64, ()>> StackWords for F {
    fn read(&self, address: u64) -> Result<u64, ()> {
        self(address)
    }

    fn all_read(&self, _lowest: u64, _highest: u64) -> bool {
        false
    }

    unsafe fn read_unchecked(&self, address: u64) -> u64 {
        self(address).unwrap_or(0)
    }
}

/// The reads of one full unwinding, in order.
#[derive(Clone, Copy)]
pub struct RecordedReads {
    reads: [MemoRead; MEMO_READS],
    /// Bit i: read i fetched a return address (see [`RecordedReads::push_return`]).
    returns: u32,
    len: usize,
    overflowed: bool,
}

impl Default for RecordedReads {
    fn default() -> Self {
        RecordedReads {
            reads: [MemoRead::default(); MEMO_READS],
            returns: 0,
            len: 0,
            overflowed: false,
        }
    }
}

impl RecordedReads {
    /// Stack words it can hold.
    pub const CAPACITY: usize = MEMO_READS;

    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = &MemoRead> {
        self.reads[..self.len].iter()
    }

    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    pub fn push(&mut self, address: u64, value: Result<u64, ()>) {
        // Walks with a refused read are not memoized: they are rare (the end of a stack is a
        // rule, not a failed read).
        let (Ok(value), false) = (value, self.len == MEMO_READS) else {
            self.overflowed = true;
            return;
        };
        self.reads[self.len] = MemoRead { address, value };
        self.len += 1;
    }

    /// [`RecordedReads::push`] for a read that fetched the return address of a frame: if
    /// it changes, the stack is another one, which no proof can make this entry's.
    pub fn push_return(&mut self, address: u64, value: Result<u64, ()>) {
        if self.len < MEMO_READS {
            self.returns |= 1 << self.len;
        }
        self.push(address, value);
    }
}

/// What changed among the words an entry depends on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Changed {
    ReturnAddress,
    OtherWordsOnly,
}

/// What a second walk showed a stored walk independent of.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Proof {
    /// Not tried: the walk may depend on bp and on every word it read.
    Untried,
    /// Tried, and nothing shown.
    Nothing,
    /// The first frame's bp (but not the words).
    Bp,
    /// bp, and every stack word but those stored.
    OnlyTheseWords,
}

/// The words a walk read, as an entry keeps them: where each lies, in words above the
/// key's stack pointer and in address order, and hashes of their values: of all of them,
/// and of the return addresses alone. A lookup reads 64 bytes of places and the stack
/// words themselves, where keeping every address and value took 16 bytes a word, and a
/// line more for their count and span.
struct StoredWords {
    offsets: [u16; MEMO_READS],
    /// Bit i: word i (in address order) is a return address.
    returns: u32,
    len: u8,
    words_hash: u64,
    returns_hash: u64,
}

impl StoredWords {
    /// `reads`, made by a walk from stack pointer `sp`; `None` if one lies below it, too far
    /// above it, or off a word's alignment (never seen: such a walk is simply not kept).
    fn of(reads: &RecordedReads, sp: u64) -> Option<StoredWords> {
        // (place, value, return address?), sorted by place: the span's ends are then the
        // first and last, and both hashes run in that order at every lookup.
        let mut words = [(0u16, 0u64, false); MEMO_READS];
        for (i, read) in reads.iter().enumerate() {
            let above = read
                .address
                .checked_sub(sp)
                .filter(|b| b.is_multiple_of(8))?;
            words[i] = (
                u16::try_from(above / 8).ok()?,
                read.value,
                reads.returns & (1 << i) != 0,
            );
        }
        let words = &mut words[..reads.len];
        // Unstable: it never allocates (the same word read twice has one value).
        words.sort_unstable_by_key(|&(place, ..)| place);
        let mut stored = StoredWords {
            offsets: [0; MEMO_READS],
            returns: 0,
            len: reads.len as u8,
            words_hash: 0,
            returns_hash: 0,
        };
        let mut returns = WordHash::new();
        for (i, &(place, value, is_return)) in words.iter().enumerate() {
            stored.offsets[i] = place;
            if is_return {
                stored.returns |= 1 << i;
                returns.add(value);
            }
        }
        stored.words_hash = hash_in_lanes(words.len(), |i| words[i].1);
        stored.returns_hash = returns.finish();
        Some(stored)
    }
}

/// The places of the return-address words among `len` words at `offsets`, in order.
fn return_places(
    len: u8,
    returns: u32,
    offsets: &[u16; MEMO_READS],
) -> impl Iterator<Item = u16> + '_ {
    (0..usize::from(len).min(MEMO_READS))
        .filter(move |i| returns & (1 << i) != 0)
        .map(move |i| offsets[i])
}

/// One way of a set: an entry and the words it read, in two cache lines — the head and
/// the words' hashes in the first, their places in the second. A lookup reads the heads
/// only of the ways its tag names, and the places only of the entry for its frame.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Way {
    key: MemoKey,
    stack: u32,
    /// When the entry was last stored or hit, by the memo's clock (0: never used).
    used_at: u32,
    /// Bit i: word i is a return address.
    returns: u32,
    /// Words the entry depends on.
    len: u8,
    /// The walk was shown not to depend on the first frame's bp (see `store`).
    ignores_bp: bool,
    /// A proof was tried (see `store`): a changed word is then no reason to try again.
    tried: bool,
    /// The hash of every word's value, in address order; of the return addresses' alone.
    words_hash: u64,
    returns_hash: u64,
    /// Where each word is, in address order: its address less the key's sp, in words.
    offsets: [u16; MEMO_READS],
}

/// The head and the hashes fill the first line, the places the second.
const _: () =
    assert!(core::mem::size_of::<Way>() == 128 && core::mem::offset_of!(Way, offsets) == 64);

pub struct StackMemo {
    /// Counts lookups that hit and stores: the least recently used way is replaced.
    clock: u32,
    /// Each entry's frame tag ([`Place::tag`]; 0: unused), by set and way: a lookup reads
    /// the 32 bytes of its set's tags, then the heads only of the ways its tag names. The
    /// tags of every set (1 KiB) stay in the CPU's first-level cache between allocations
    /// far more often than the ways (32 KiB) do.
    tags: [[u32; WAYS]; MEMO_SETS],
    ways: [[Way; WAYS]; MEMO_SETS],
}

/// Where a key's entries are: its set, and the tag its ways carry there. Both come from ip
/// and sp only, so that an entry that ignores bp is found whatever bp is now (in code built
/// without frame pointers, rbp is an ordinary register).
struct Place {
    set: usize,
    tag: u32,
}

impl Place {
    fn of(key: &MemoKey) -> Place {
        let mixed = (key.ip ^ key.sp.rotate_left(29) ^ key.snapshot.rotate_left(47))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Place {
            set: (mixed >> (64 - MEMO_SETS.trailing_zeros())) as usize,
            // Never 0, the tag of an unused way.
            tag: (mixed as u32) | 1,
        }
    }
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
    /// An entry for the same frame exists, but words it read other than return addresses
    /// have changed, and no proof was tried for it: worth proving which words the walk
    /// depends on (see `store`). In code built without frame pointers most such words are
    /// saved values of rbp, an ordinary register there, that change from call to call.
    WordsChanged,
}

impl Way {
    /// Whether it holds the same path as `words`: the same return addresses at the same
    /// places.
    fn same_path(&self, words: &StoredWords) -> bool {
        self.returns_hash == words.returns_hash
            && return_places(self.len, self.returns, &self.offsets).eq(return_places(
                words.len,
                words.returns,
                &words.offsets,
            ))
    }

    /// Which words no longer hold their value, if any: whether a return address is among
    /// them. A word that cannot be read has changed.
    #[inline]
    fn changed(&self, words: &impl StackWords) -> Option<Changed> {
        // Never more than MEMO_READS (`StoredWords::of`); bounded here so that no index
        // below can fail.
        let len = usize::from(self.len).min(MEMO_READS);
        let sp = self.key.sp;
        let word_at = |i: usize| sp + 8 * u64::from(self.offsets[i]);
        // Every word of the span reads (the usual case: the same thread at the same stack
        // pointer), so each is read with no check, and one hash says whether all hold.
        if len == 0 || !words.all_read(word_at(0), word_at(len - 1)) {
            return self.changed_word_by_word(words);
        }
        // SAFETY: aligned addresses (whole words above the stack pointer of this entry's
        // key, which the lookup's key shares, as a walk read them) between the span's ends,
        // which `all_read` accepted.
        let read = |i: usize| unsafe { words.read_unchecked(word_at(i)) };
        if hash_in_lanes(len, read) == self.words_hash {
            return None;
        }
        let mut returns = WordHash::new();
        (0..len)
            .filter(|i| self.returns & (1 << i) != 0)
            .for_each(|i| returns.add(read(i)));
        Some(match returns.finish() == self.returns_hash {
            true => Changed::OtherWordsOnly,
            false => Changed::ReturnAddress,
        })
    }

    /// [`Way::changed`] where the span does not read whole (it reaches past this stack's
    /// end, or there is none): each word read on its own.
    #[cold]
    fn changed_word_by_word(&self, words: &impl StackWords) -> Option<Changed> {
        let mut values = [0u64; MEMO_READS];
        let mut returns = WordHash::new();
        let mut refused = 0u32;
        let len = usize::from(self.len).min(MEMO_READS);
        for (i, (value, &at)) in values.iter_mut().zip(&self.offsets[..len]).enumerate() {
            match words.read(self.key.sp + 8 * u64::from(at)) {
                Ok(read) => {
                    *value = read;
                    if self.returns & (1 << i) != 0 {
                        returns.add(read);
                    }
                }
                Err(()) => refused |= 1 << i,
            }
        }
        if refused & self.returns != 0 || returns.finish() != self.returns_hash {
            Some(Changed::ReturnAddress)
        } else if refused != 0 || hash_in_lanes(len, |i| values[i]) != self.words_hash {
            Some(Changed::OtherWordsOnly)
        } else {
            None
        }
    }

    /// Same module snapshot, same frame.
    fn same_frame(&self, key: &MemoKey) -> bool {
        self.used_at != 0
            && self.key.snapshot == key.snapshot
            && self.key.ip == key.ip
            && self.key.sp == key.sp
    }

    fn matches(&self, key: &MemoKey) -> bool {
        self.same_frame(key) && (self.ignores_bp || self.key.bp == key.bp)
    }
}

impl StackMemo {
    /// An empty memo, made directly on the heap (about 33 KiB: too big for a thread's
    /// stack).
    pub fn boxed() -> Box<StackMemo> {
        let memo = Box::<StackMemo>::new_zeroed();
        // SAFETY: all-zero bytes are a valid StackMemo: every entry unused, integers zero,
        // booleans false.
        unsafe { memo.assume_init() }
    }

    fn tick(&mut self) -> u32 {
        // After 2^32 ticks the order is briefly wrong, which costs at most a few misses.
        self.clock = self.clock.wrapping_add(1).max(1);
        self.clock
    }

    /// The stack id remembered for `key`, if every stack word it depended on is unchanged.
    /// One frame can have an entry for each path that reached it (see `store`): the first
    /// whose words all hold is the one.
    #[inline]
    pub fn lookup(&mut self, key: &MemoKey, words: &impl StackWords) -> Lookup {
        let now = self.tick();
        let place = Place::of(key);
        let tags = &self.tags[place.set];
        let set = &mut self.ways[place.set];
        let mut outcome = Lookup::Miss;
        for way in (0..WAYS).filter(|&way| tags[way] == place.tag) {
            let entry = &mut set[way];
            if !entry.same_frame(key) {
                continue;
            }
            if !entry.matches(key) {
                if outcome == Lookup::Miss {
                    outcome = Lookup::OnlyBpDiffers;
                }
                continue;
            }
            match entry.changed(words) {
                None => {
                    entry.used_at = now;
                    return Lookup::Hit(entry.stack);
                }
                Some(Changed::OtherWordsOnly) if !entry.tried => outcome = Lookup::WordsChanged,
                Some(_) => {}
            }
        }
        outcome
    }

    /// Remembers the result of a full unwinding (unless it read too many words to keep),
    /// in place of the entry of the same key that read the same return addresses (the same
    /// path, its other words changed), or else of the least recently used one. Entries of
    /// one frame reached by other paths stay: a function that allocates (NumPy's
    /// `PyDataMem_UserNEW`) is often reached at the very same stack pointer through
    /// several callers in turn, and one entry per frame was overwritten on every call.
    /// `proof` says what the caller showed by walking again and getting the same frames
    /// with no refused read: with bp set to 0, that bp was never used (any use as an
    /// address, or as the base of a frame, would have failed or ended the walk); with, in
    /// addition, every word but `reads` read as 0, that the walk depends on `reads` alone.
    pub fn store(&mut self, key: MemoKey, reads: &RecordedReads, stack: u32, proof: Proof) {
        if reads.overflowed {
            return;
        }
        let Some(words) = StoredWords::of(reads, key.sp) else {
            return;
        };
        let now = self.tick();
        let place = Place::of(&key);
        let set = &mut self.ways[place.set];
        let way = match set
            .iter()
            .position(|entry| entry.matches(&key) && entry.same_path(&words))
        {
            Some(way) => way,
            None => (0..WAYS).min_by_key(|&way| set[way].used_at).unwrap_or(0),
        };
        set[way] = Way {
            key,
            stack,
            used_at: now,
            returns: words.returns,
            len: words.len,
            ignores_bp: matches!(proof, Proof::Bp | Proof::OnlyTheseWords),
            tried: proof != Proof::Untried,
            words_hash: words.words_hash,
            returns_hash: words.returns_hash,
            offsets: words.offsets,
        };
        self.tags[place.set][way] = place.tag;
    }
}

#[cfg(test)]
#[path = "stack_memo_tests.rs"]
mod tests;
