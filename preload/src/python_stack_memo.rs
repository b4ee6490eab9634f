//! Interposed call → stack (Python): a per-thread memo from what a merged stack is made of
//! — the native stack's id, the marker, and the thread's Python frame words cut into their
//! groups — to the merged stack's id. An allocation made again from the same Python lines
//! and the same C path then costs a hash of its Python frames, not the merge of some forty
//! words and their hash and lookup in the stack table (two cache misses, most of a stack's
//! cost in an import-heavy program).
//!
//! The merge is a function of exactly these inputs (the interpreter's address ranges, the
//! other input, never change once Python is detected), so a memo hit gives the same id the
//! merge would. An entry also keeps the native id, so a false hit needs two different
//! inputs agreeing on it and on a 64-bit hash.
//! An entry is 16 bytes, four to a cache line, so that a lookup reads one line: at 24, one
//! entry in three straddled two.

use crate::word_hash::WordHash;

/// Entries per thread, direct-mapped by the key's top bits.
const ENTRIES: usize = 4096;
const INDEX_SHIFT: u32 = 64 - ENTRIES.trailing_zeros();

#[derive(Clone, Copy, Default)]
#[repr(C, align(16))]
struct Entry {
    key: u64,
    native: u32,
    merged: u32,
}

const _: () = assert!(core::mem::size_of::<Entry>() == 16);

/// What the merged stacks of one thread were made of, and their ids.
pub struct MergedMemo {
    entries: [Entry; ENTRIES],
}

/// What one merged stack is made of.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MergeInputs {
    key: u64,
    native: u32,
}

impl MergeInputs {
    /// The inputs of a merge: the native stack's id, the marker (0 for none), the Python
    /// frame words innermost first, and where each native evaluation call's group ends.
    pub fn new(native: u32, marker: u64, words: &[u64], group_ends: &[u16]) -> MergeInputs {
        let mut hash = KeyHash::new(native, marker);
        words.iter().for_each(|&word| hash.add(word));
        // Each end shifted past any word's top bits would put it elsewhere: the same words
        // grouped otherwise hash otherwise.
        group_ends
            .iter()
            .for_each(|&end| hash.add(u64::from(end).rotate_right(16)));
        hash.finish(native)
    }
}

/// A memo key being hashed: the native stack's id and the marker, then any number of words.
pub struct KeyHash(WordHash);

impl KeyHash {
    #[inline(always)]
    pub fn new(native: u32, marker: u64) -> KeyHash {
        KeyHash(WordHash::seeded(u64::from(native) ^ marker.rotate_left(32)))
    }

    #[inline(always)]
    pub fn add(&mut self, word: u64) {
        self.0.add(word);
    }

    /// The key of the inputs hashed, for a stack of native stack `native`. The number of
    /// words is not kept beside it: sequences of other lengths hash apart like any others.
    #[inline(always)]
    pub fn finish(self, native: u32) -> MergeInputs {
        MergeInputs {
            key: self.0.finish() | 1,
            native,
        }
    }
}

impl MergedMemo {
    /// An empty memo, made on the heap directly: at 64 KiB it must never pass through
    /// the hook's stack, and its zero pages cost nothing until the thread fills them.
    pub fn boxed() -> Box<MergedMemo> {
        let memo = Box::<MergedMemo>::new_zeroed();
        // SAFETY: all-zero bytes are a valid MergedMemo: every entry `Entry::default()`,
        // whose key 0 matches no inputs (their keys are odd).
        unsafe { memo.assume_init() }
    }

    /// The merged stack of `inputs`, if this thread made it lately.
    #[inline]
    pub fn get(&self, inputs: &MergeInputs) -> Option<u32> {
        let entry = &self.entries[(inputs.key >> INDEX_SHIFT) as usize];
        (entry.key == inputs.key && entry.native == inputs.native).then_some(entry.merged)
    }

    /// Remembers that `inputs` merge into the stack `merged`.
    #[inline]
    pub fn put(&mut self, inputs: &MergeInputs, merged: u32) {
        self.entries[(inputs.key >> INDEX_SHIFT) as usize] = Entry {
            key: inputs.key,
            native: inputs.native,
            merged,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_it_was_given_and_nothing_else() {
        let mut memo = MergedMemo::boxed();
        let words = [0x8000_0000_0001_0004u64, 0x8000_0000_0002_0010];
        let inputs = MergeInputs::new(7, 0, &words, &[2]);
        assert_eq!(memo.get(&inputs), None);
        memo.put(&inputs, 42);
        assert_eq!(memo.get(&MergeInputs::new(7, 0, &words, &[2])), Some(42));
        // Another native stack, line, grouping or marker is another merge.
        assert_eq!(memo.get(&MergeInputs::new(8, 0, &words, &[2])), None);
        let moved = [words[0], words[1] + 2];
        assert_eq!(memo.get(&MergeInputs::new(7, 0, &moved, &[2])), None);
        assert_eq!(memo.get(&MergeInputs::new(7, 0, &words, &[1, 2])), None);
        assert_eq!(memo.get(&MergeInputs::new(7, 5, &words, &[2])), None);
    }
}
