//! Shared by the preload and the report: FNV-1a 64, the hash behind memwarden's stable
//! names (call-site keys, leak ids, the names of the files kept across runs). Cheap, no
//! allocation, the same on every machine and in every version.

/// FNV-1a 64 offset basis.
const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64 prime.
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// An FNV-1a 64 hash being fed bytes.
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a(u64);

impl Fnv1a {
    /// The hash of no bytes (the offset basis).
    pub const fn new() -> Self {
        Fnv1a(OFFSET)
    }

    /// Feeds `bytes`, in order.
    pub fn eat(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(PRIME);
        }
    }

    /// The hash of every byte fed so far.
    pub const fn finish(&self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(Fnv1a::new().finish(), OFFSET);
        // FNV-1a 64 of "a" and of "foobar", the reference test vectors.
        let mut a = Fnv1a::new();
        a.eat(b"a");
        assert_eq!(a.finish(), 0xaf63_dc4c_8601_ec8c);
        let mut split = Fnv1a::new();
        split.eat(b"foo");
        split.eat(b"bar");
        assert_eq!(split.finish(), 0x8594_4171_f739_67e8);
    }
}
