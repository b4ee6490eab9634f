//! Unit tests of the stack memo: hits only while every word read holds, its ways, its
//! proofs, and an entry per path into one frame.

use super::*;

fn key() -> MemoKey {
    MemoKey {
        snapshot: 1,
        ip: 0x401000,
        sp: 0x7ff0_0000,
        bp: 0,
    }
}

/// Stack memory where the word at 0x7ff0_0008 holds `first` and every other `rest`.
fn memory(first: u64, rest: u64) -> impl Fn(u64) -> Result<u64, ()> {
    move |address| Ok(if address == 0x7ff0_0008 { first } else { rest })
}

#[test]
fn hit_only_while_every_read_word_is_unchanged() {
    let mut memo = StackMemo::boxed();
    let mut reads = RecordedReads::default();
    reads.push(0x7ff0_0008, Ok(0x401234));
    reads.push(0x7ff0_0100, Ok(0x55));
    memo.store(key(), &reads, 7, Proof::Untried);
    let same = memory(0x401234, 0x55);
    assert_eq!(memo.lookup(&key(), &same), Lookup::Hit(7));
    // A changed word is worth a proof once; after one was tried, it is a plain miss.
    let changed = memory(0x999, 0x55);
    assert_eq!(memo.lookup(&key(), &changed), Lookup::WordsChanged);
    let unreadable = |_address: u64| Err(());
    assert_eq!(memo.lookup(&key(), &unreadable), Lookup::WordsChanged);
    memo.store(key(), &reads, 7, Proof::Nothing);
    assert_eq!(memo.lookup(&key(), &changed), Lookup::Miss);
    assert_eq!(memo.lookup(&key(), &same), Lookup::Hit(7));
    let other = MemoKey {
        sp: 0x7ff0_0010,
        ..key()
    };
    assert_eq!(memo.lookup(&other, &same), Lookup::Miss);
}

#[test]
fn a_changed_return_address_is_another_stack_not_worth_a_proof() {
    let mut memo = StackMemo::boxed();
    let mut reads = RecordedReads::default();
    reads.push_return(0x7ff0_0008, Ok(0x401234));
    reads.push(0x7ff0_0100, Ok(0x55));
    memo.store(key(), &reads, 7, Proof::Untried);
    let saved_word_changed = memory(0x401234, 0x66);
    assert_eq!(
        memo.lookup(&key(), &saved_word_changed),
        Lookup::WordsChanged
    );
    assert_eq!(memo.lookup(&key(), &memory(0x401300, 0x66)), Lookup::Miss);
}

#[test]
fn one_frame_reached_by_two_paths_keeps_an_entry_for_each() {
    let mut memo = StackMemo::boxed();
    let path = |return_address: u64| {
        let mut reads = RecordedReads::default();
        reads.push_return(0x7ff0_0008, Ok(return_address));
        reads.push(0x7ff0_0100, Ok(0x55));
        reads
    };
    memo.store(key(), &path(0x401234), 7, Proof::Untried);
    memo.store(key(), &path(0x405678), 8, Proof::Untried);
    for _pass in 0..2 {
        assert_eq!(memo.lookup(&key(), &memory(0x401234, 0x55)), Lookup::Hit(7));
        assert_eq!(memo.lookup(&key(), &memory(0x405678, 0x55)), Lookup::Hit(8));
    }
    // A path's walk stored again (its other words changed) replaces its own entry only.
    memo.store(key(), &path(0x401234), 9, Proof::Nothing);
    assert_eq!(memo.lookup(&key(), &memory(0x401234, 0x55)), Lookup::Hit(9));
    assert_eq!(memo.lookup(&key(), &memory(0x405678, 0x55)), Lookup::Hit(8));
    assert_eq!(memo.lookup(&key(), &memory(0x409999, 0x55)), Lookup::Miss);
}

#[test]
fn one_frame_reached_by_eight_paths_keeps_them_all() {
    // sqlite's allocations all reach `malloc` from one wrapper, at a few stack pointers,
    // each by many paths: they must not evict each other on every pass.
    let mut memo = StackMemo::boxed();
    let path = |n: u64| {
        let mut reads = RecordedReads::default();
        reads.push_return(0x7ff0_0008, Ok(0x401000 + n));
        reads
    };
    for n in 0..8 {
        memo.store(key(), &path(n), n as u32 + 1, Proof::Untried);
    }
    for _pass in 0..2 {
        for n in 0..8 {
            let stack = memory(0x401000 + n, 0);
            assert_eq!(memo.lookup(&key(), &stack), Lookup::Hit(n as u32 + 1));
        }
    }
}

/// `count` keys that fall in the set of `key()`.
fn keys_of_one_set(count: usize) -> Vec<MemoKey> {
    (0..u64::MAX)
        .map(|n| MemoKey {
            ip: key().ip + n,
            ..key()
        })
        .filter(|k| Place::of(k).set == Place::of(&key()).set)
        .take(count)
        .collect()
}

#[test]
fn as_many_keys_as_ways_in_one_set_all_stay() {
    let mut memo = StackMemo::boxed();
    let keys = keys_of_one_set(WAYS);
    let mut reads = RecordedReads::default();
    reads.push(0x7ff0_0008, Ok(1));
    for (stack, key) in keys.iter().enumerate() {
        memo.store(*key, &reads, stack as u32, Proof::Untried);
    }
    let memory = |_address: u64| Ok(1);
    for _pass in 0..3 {
        for (stack, key) in keys.iter().enumerate() {
            assert_eq!(memo.lookup(key, &memory), Lookup::Hit(stack as u32));
        }
    }
}

#[test]
fn the_least_recently_used_way_is_replaced() {
    let mut memo = StackMemo::boxed();
    let keys = keys_of_one_set(WAYS + 1);
    let mut reads = RecordedReads::default();
    reads.push(0x7ff0_0008, Ok(1));
    let memory = |_address: u64| Ok(1);
    for (stack, key) in keys[..WAYS].iter().enumerate() {
        memo.store(*key, &reads, stack as u32, Proof::Untried);
    }
    // The first key is used again: the second is now the least recently used.
    assert_eq!(memo.lookup(&keys[0], &memory), Lookup::Hit(0));
    memo.store(keys[WAYS], &reads, 99, Proof::Untried);
    assert_eq!(memo.lookup(&keys[1], &memory), Lookup::Miss);
    assert_eq!(memo.lookup(&keys[0], &memory), Lookup::Hit(0));
    assert_eq!(memo.lookup(&keys[WAYS], &memory), Lookup::Hit(99));
}

#[test]
fn a_reduced_entry_ignores_the_words_it_does_not_hold() {
    let mut memo = StackMemo::boxed();
    let mut reads = RecordedReads::default();
    reads.push(0x7ff0_0008, Ok(0x401234));
    memo.store(key(), &reads, 6, Proof::OnlyTheseWords);
    let saved_bp_changed = |address: u64| {
        Ok(if address == 0x7ff0_0008 {
            0x401234
        } else {
            address ^ 0x5a5a
        })
    };
    let with_bp = MemoKey { bp: 0x777, ..key() };
    assert_eq!(memo.lookup(&with_bp, &saved_bp_changed), Lookup::Hit(6));
    let return_changed = |_address: u64| Ok(0x401300);
    assert_eq!(memo.lookup(&key(), &return_changed), Lookup::Miss);
}

#[test]
fn an_entry_that_ignores_bp_matches_any_bp_and_only_that() {
    let mut memo = StackMemo::boxed();
    let mut reads = RecordedReads::default();
    reads.push(0x7ff0_0008, Ok(1));
    memo.store(key(), &reads, 4, Proof::Bp);
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
        Proof::Untried,
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
    memo.store(key(), &reads, 9, Proof::Untried);
    assert_eq!(memo.lookup(&key(), &|_address: u64| Err(())), Lookup::Miss);
}

#[test]
fn walks_too_deep_to_remember_are_not_stored() {
    let mut memo = StackMemo::boxed();
    let mut reads = RecordedReads::default();
    for word in 0..=MEMO_READS as u64 {
        reads.push(0x7ff0_0000 + word * 8, Ok(word));
    }
    memo.store(key(), &reads, 3, Proof::Untried);
    assert_eq!(
        memo.lookup(&key(), &|a: u64| Ok((a - 0x7ff0_0000) / 8)),
        Lookup::Miss
    );
}

/// A made-up stack of `words` from `base`, read as the unwinder reads the thread's own
/// stack: a span that lies inside it is read with no check per word.
struct Span {
    base: u64,
    words: Vec<u64>,
}

impl StackWords for Span {
    fn read(&self, address: u64) -> Result<u64, ()> {
        if self.all_read(address, address) {
            // SAFETY: just checked.
            Ok(unsafe { self.read_unchecked(address) })
        } else {
            Err(())
        }
    }

    fn all_read(&self, lowest: u64, highest: u64) -> bool {
        let end = self.base + 8 * self.words.len() as u64;
        lowest >= self.base && highest + 8 <= end && (lowest | highest).is_multiple_of(8)
    }

    unsafe fn read_unchecked(&self, address: u64) -> u64 {
        self.words[((address - self.base) / 8) as usize]
    }
}

#[test]
fn a_span_read_whole_answers_as_word_by_word_reads_do() {
    let base = 0x7ff0_0000;
    let recorded: Vec<u64> = (0..6).map(|i| 0x40_1000 + i).collect();
    let mut reads = RecordedReads::default();
    for (i, &value) in recorded.iter().enumerate() {
        let address = base + 8 * i as u64;
        // Words 1 and 4 are return addresses.
        if i % 3 == 1 {
            reads.push_return(address, Ok(value));
        } else {
            reads.push(address, Ok(value));
        }
    }
    for changed in 0u32..64 {
        let words: Vec<u64> = recorded
            .iter()
            .enumerate()
            .map(|(i, &v)| if changed & (1 << i) != 0 { v ^ 0xff } else { v })
            .collect();
        let span = Span { base, words };
        let word_by_word = |address: u64| span.read(address);
        let mut memo = StackMemo::boxed();
        memo.store(key(), &reads, 5, Proof::Untried);
        let whole = memo.lookup(&key(), &span);
        let mut memo = StackMemo::boxed();
        memo.store(key(), &reads, 5, Proof::Untried);
        assert_eq!(
            whole,
            memo.lookup(&key(), &word_by_word),
            "changed {changed:06b}"
        );
        let expected = match changed {
            0 => Lookup::Hit(5),
            _ if changed & 0b01_0010 != 0 => Lookup::Miss,
            _ => Lookup::WordsChanged,
        };
        assert_eq!(whole, expected, "changed {changed:06b}");
    }
}

#[test]
fn a_span_reaching_past_the_stack_reads_word_by_word() {
    let base = 0x7ff0_0000;
    let mut reads = RecordedReads::default();
    reads.push(base, Ok(1));
    reads.push(base + 16, Ok(3));
    let mut memo = StackMemo::boxed();
    memo.store(key(), &reads, 4, Proof::Untried);
    // The stack now ends before the second word: it cannot be read, so it has changed.
    let short = Span {
        base,
        words: vec![1, 2],
    };
    assert_eq!(memo.lookup(&key(), &short), Lookup::WordsChanged);
    let whole = Span {
        base,
        words: vec![1, 2, 3],
    };
    assert_eq!(memo.lookup(&key(), &whole), Lookup::Hit(4));
}

#[test]
fn a_walk_with_a_word_its_places_cannot_hold_is_not_stored() {
    let sp = key().sp;
    let memory = |_address: u64| Ok(1);
    // Below the stack pointer, off a word's alignment, and past the farthest place an
    // entry holds (65,535 words above it): each such walk is simply walked again.
    for address in [sp - 8, sp + 12, sp + 8 * 65_536] {
        let mut memo = StackMemo::boxed();
        let mut reads = RecordedReads::default();
        reads.push(sp + 8, Ok(1));
        reads.push(address, Ok(1));
        memo.store(key(), &reads, 2, Proof::Untried);
        assert_eq!(memo.lookup(&key(), &memory), Lookup::Miss, "{address:#x}");
    }
    let mut memo = StackMemo::boxed();
    let mut reads = RecordedReads::default();
    reads.push(sp + 8 * 65_535, Ok(1));
    memo.store(key(), &reads, 2, Proof::Untried);
    assert_eq!(memo.lookup(&key(), &memory), Lookup::Hit(2));
}

#[test]
fn every_one_of_an_entrys_32_words_is_checked() {
    let sp = key().sp;
    let mut reads = RecordedReads::default();
    for word in 0..MEMO_READS as u64 {
        match word % 4 {
            0 => reads.push_return(sp + 8 * word, Ok(0x40_0000 + word)),
            _ => reads.push(sp + 8 * word, Ok(word)),
        }
    }
    let mut memo = StackMemo::boxed();
    memo.store(key(), &reads, 5, Proof::Untried);
    let original = |address: u64| {
        let word = (address - sp) / 8;
        Ok(if word.is_multiple_of(4) {
            0x40_0000 + word
        } else {
            word
        })
    };
    assert_eq!(memo.lookup(&key(), &original), Lookup::Hit(5));
    for changed in 0..MEMO_READS as u64 {
        let one_changed = |address: u64| {
            let value = original(address)?;
            Ok(if address == sp + 8 * changed {
                value ^ 1
            } else {
                value
            })
        };
        let expected = match changed % 4 {
            0 => Lookup::Miss,
            _ => Lookup::WordsChanged,
        };
        assert_eq!(
            memo.lookup(&key(), &one_changed),
            expected,
            "word {changed}"
        );
    }
    // Two words swapped between their places change the walk's words too.
    let swapped = |address: u64| match (address - sp) / 8 {
        1 => Ok(2),
        2 => Ok(1),
        _ => original(address),
    };
    assert_eq!(memo.lookup(&key(), &swapped), Lookup::WordsChanged);
}

#[test]
fn a_way_is_two_cache_lines_and_the_memo_about_33_kib() {
    assert_eq!(core::mem::size_of::<Way>(), 128);
    assert_eq!(core::mem::align_of::<Way>(), 64);
    assert!(core::mem::size_of::<StackMemo>() <= 34 * 1024);
}
