//! The call-site key: one number naming a stack independently of where modules were
//! loaded, computed the same way by the preload (to match `site=`) and the report (the
//! `site` field of each stack).

use crate::Fnv1a;

/// FNV-1a 64 over the frames, innermost first: for each, the module's file name (the part
/// after the last `/`, so a full path gives the same key as its basename), a `0xff` byte,
/// then the frame's offset from the module's load bias as 8 little-endian bytes. A frame
/// outside every module contributes an empty name and its absolute address.
pub fn site_key(frames: &mut dyn Iterator<Item = (&[u8], u64)>) -> u64 {
    let mut hash = Fnv1a::new();
    for (module, offset) in frames {
        let name = match module.iter().rposition(|&b| b == b'/') {
            Some(slash) => &module[slash + 1..],
            None => module,
        };
        hash.eat(name);
        hash.eat(&[0xff]);
        hash.eat(&offset.to_le_bytes());
    }
    hash.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_stack_is_the_offset_basis() {
        assert_eq!(site_key(&mut core::iter::empty()), 0xcbf2_9ce4_8422_2325);
    }

    #[test]
    fn known_value() {
        // FNV-1a 64 of b"a\xff\x10\0\0\0\0\0\0\0", computed independently (Python).
        let frames: [(&[u8], u64); 1] = [(b"a", 0x10)];
        assert_eq!(site_key(&mut frames.into_iter()), 0xf01c_21a6_337d_b099);
    }

    #[test]
    fn path_and_basename_agree_and_order_matters() {
        let full: [(&[u8], u64); 2] = [(b"/usr/lib/libc.so.6", 0x10), (b"/bin/prog", 0x20)];
        let base: [(&[u8], u64); 2] = [(b"libc.so.6", 0x10), (b"prog", 0x20)];
        let swapped: [(&[u8], u64); 2] = [(b"prog", 0x20), (b"libc.so.6", 0x10)];
        let k = site_key(&mut full.into_iter());
        assert_eq!(k, site_key(&mut base.into_iter()));
        assert_ne!(k, site_key(&mut swapped.into_iter()));
    }
}
