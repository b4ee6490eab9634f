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

/// The hash of `len` words, word `i` given by `word(i)`, hashed in four lanes (word i into
/// lane i mod 4) so that the steps' latency chains are a quarter as long: a walk's twenty-odd
/// words cost the latency of five or six steps rather than of every one. Each lane is a
/// [`WordHash`] of its own seed, and the finished lanes are combined by rotations and
/// exclusive or, each a bijection of one lane's hash given the others': two sequences of
/// the same length that differ in one word never hash alike either.
#[inline(always)]
pub fn hash_in_lanes(len: usize, word: impl Fn(usize) -> u64) -> u64 {
    let (mut a, mut b, mut c, mut d) = (
        WordHash::seeded(1),
        WordHash::seeded(2),
        WordHash::seeded(3),
        WordHash::seeded(4),
    );
    let whole = len - len % 4;
    let mut i = 0;
    while i < whole {
        a.add(word(i));
        b.add(word(i + 1));
        c.add(word(i + 2));
        d.add(word(i + 3));
        i += 4;
    }
    match len - whole {
        3 => {
            a.add(word(i));
            b.add(word(i + 1));
            c.add(word(i + 2));
        }
        2 => {
            a.add(word(i));
            b.add(word(i + 1));
        }
        1 => a.add(word(i)),
        _ => {}
    }
    a.finish()
        ^ b.finish().rotate_left(16)
        ^ c.finish().rotate_left(32)
        ^ d.finish().rotate_left(48)
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
    fn in_lanes_one_word_changed_anywhere_changes_the_hash() {
        for len in 0..=32usize {
            let words: Vec<u64> = (0..len as u64).map(|i| 0x7ffd_0000 + 8 * i).collect();
            let whole = hash_in_lanes(len, |i| words[i]);
            for at in 0..len {
                for bit in [0, 3, 31, 63] {
                    let mut changed = words.clone();
                    changed[at] ^= 1 << bit;
                    assert_ne!(
                        hash_in_lanes(len, |i| changed[i]),
                        whole,
                        "len {len} word {at}"
                    );
                }
            }
            if len >= 2 {
                let mut swapped = words.clone();
                swapped.swap(0, 1);
                assert_ne!(
                    hash_in_lanes(len, |i| swapped[i]),
                    whole,
                    "len {len} swapped"
                );
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
