//! Interposed call → stack: the 64-bit hash the per-thread memos check and key their entries
//! by — the native memo the words a walk read (`stack_memo`), the memos of merged Python
//! stacks what a merge is made of (`python_stack_memo`).
//!
//! Each word's step, `(rotl(state, 26) ^ word) * K` with K odd, is a bijection of the state
//! for a given word and of the word for a given state, and so is the finish: two sequences
//! of the same length that differ in one word never hash alike, and any other two agree
//! with odds of about 2^-64.

/// A sequence of words being hashed.
#[derive(Clone, Copy)]
pub struct WordHash(u64);

impl WordHash {
    /// An empty sequence.
    #[inline(always)]
    pub fn new() -> WordHash {
        WordHash::seeded(0)
    }

    /// An empty sequence whose hashes differ from those of any other `seed`.
    #[inline(always)]
    pub fn seeded(seed: u64) -> WordHash {
        WordHash(0x243f_6a88_85a3_08d3 ^ seed)
    }

    #[inline(always)]
    pub fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(26) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    /// The hash of the words added, their bits mixed into every bit of it.
    #[inline(always)]
    pub fn finish(self) -> u64 {
        let mut hash = self.0;
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^ (hash >> 33)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_of(words: &[u64]) -> u64 {
        let mut hash = WordHash::new();
        words.iter().for_each(|&word| hash.add(word));
        hash.finish()
    }

    #[test]
    fn one_word_changed_anywhere_changes_the_hash() {
        let words: Vec<u64> = (0..16).map(|i| 0x40_1000 + 8 * i).collect();
        let whole = hash_of(&words);
        for at in 0..words.len() {
            for bit in [0, 1, 12, 47, 63] {
                let mut changed = words.clone();
                changed[at] ^= 1 << bit;
                assert_ne!(hash_of(&changed), whole, "word {at} bit {bit}");
            }
        }
    }

    #[test]
    fn order_length_and_seed_count() {
        assert_ne!(hash_of(&[1, 2]), hash_of(&[2, 1]));
        assert_ne!(hash_of(&[1, 2]), hash_of(&[1, 2, 0]));
        assert_ne!(hash_of(&[]), hash_of(&[0]));
        assert_ne!(WordHash::seeded(1).finish(), WordHash::seeded(2).finish());
    }
}
