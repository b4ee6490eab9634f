//! Analysis and report stages: the hash maps keyed by frame words, addresses and the
//! frames built from them. The standard library's default hash (SipHash, built to resist
//! chosen keys) cost several percent of a large report; these keys come from the run's own
//! profile, and a multiply-rotate hash of eight bytes at a time serves them.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hash of frame words (and of the strings of frames), eight bytes a round.
#[derive(Default)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    /// The state mixed once more: the table picks buckets by the low bits, which a
    /// product alone leaves depending on the low bits of the input only.
    fn finish(&self) -> u64 {
        let folded = (self.0 ^ (self.0 >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
        folded ^ (folded >> 32)
    }

    /// Eight bytes at a time: a slice of words (a `Vec<u64>` key) reaches the hasher as
    /// its bytes, and one round per byte made hashing most of the call-site keys' time.
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(word);
            self.write_u64(u64::from_le_bytes(eight));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut eight = [0u8; 8];
            eight[..rest.len()].copy_from_slice(rest);
            // The length too, so that "ab" and "ab\0" differ.
            self.write_u64(u64::from_le_bytes(eight) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// A hash map hashed by [`WordHasher`].
pub(crate) type WordMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash_of(value: impl Hash) -> u64 {
        BuildHasherDefault::<WordHasher>::default().hash_one(value)
    }

    #[test]
    fn a_slice_of_words_hashes_a_word_at_a_time() {
        let words = [1u64, 0xdead_beef, 3];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut by_bytes = WordHasher::default();
        by_bytes.write(&bytes);
        let mut by_words = WordHasher::default();
        words.iter().for_each(|&w| by_words.write_u64(w));
        assert_eq!(by_bytes.finish(), by_words.finish());
        let mut odd = WordHasher::default();
        odd.write(&bytes[..9]);
        assert_ne!(odd.finish(), by_words.finish());
    }

    #[test]
    fn strings_differing_in_any_byte_or_length_hash_apart() {
        let words = [
            "",
            "a",
            "ab",
            "ab\0",
            "abcdefgh",
            "abcdefgh\0",
            "abcdefghi",
            "bbcdefghi",
        ];
        let hashes: std::collections::HashSet<u64> = words.iter().map(hash_of).collect();
        assert_eq!(hashes.len(), words.len());
    }

    #[test]
    fn consecutive_addresses_spread_over_the_low_bits() {
        // Return addresses 16 bytes apart: the buckets of a 1024-slot table they fall in.
        let buckets: std::collections::HashSet<u64> = (0..1024u64)
            .map(|i| hash_of(0x7f00_0000_1000 + 16 * i) & 1023)
            .collect();
        assert!(buckets.len() > 600, "{}", buckets.len());
    }
}
