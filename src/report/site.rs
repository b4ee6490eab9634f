//! Report stage: the call-site key of a stack (`site` in report.json), the number
//! `memwarden run --fail site=KEY` and `memwarden sweep` name a call site by. Computed from
//! the raw frames exactly as the preload computes it at run time
//! (`memwarden_faults::site_key`), so the key of a report matches the preload's.

use memwarden_abi::python::{self, FrameWord};
use memwarden_abi::UNKNOWN_STACK_ID;

use super::warm::Shown;
use crate::analysis::StackFigures;
use crate::profile::{Module, Profile};
use crate::python::module_of_word;
use crate::word_map::WordMap;

/// The `site` of each of `stacks` (of `profile`), in order: none for the unknown stack, nor
/// for a stack without return addresses (pymalloc's arenas), which no call site makes.
/// A stack whose key the look-ahead found (`ahead`) takes it; the others are computed.
/// Only return addresses count, so the stacks of a Python program share keys where they
/// differ in Python frames only: each distinct run of return addresses is hashed once.
pub(crate) fn site_keys(
    profile: &Profile,
    stacks: &[StackFigures],
    ahead: &Shown,
) -> Vec<Option<String>> {
    let mut known: WordMap<Vec<u64>, Option<u64>> = WordMap::default();
    // The module of each return address, found once: finding it scans the modules loaded
    // below it, and the distinct runs share most of their words.
    let mut modules: WordMap<u64, Option<&Module>> = WordMap::default();
    let mut module_of = |address: u64| {
        *modules
            .entry(address)
            .or_insert_with(|| module_of_word(&profile.modules, address))
    };
    let mut native = Vec::new();
    stacks
        .iter()
        .map(|s| {
            if s.id == UNKNOWN_STACK_ID {
                return None;
            }
            if let Some(site) = ahead.site_of(s.id) {
                return site.map(hex);
            }
            native.clear();
            native.extend(s.stack.frames.iter().copied().filter(|&w| is_native(w)));
            let key = match known.get(&native) {
                Some(&key) => key,
                None => {
                    let key = key_of(&native, &mut module_of);
                    known.insert(native.clone(), key);
                    key
                }
            };
            key.map(hex)
        })
        .collect()
}

/// The key of a stack of frame `words` each of whose return addresses is held by one of
/// `modules` (as the look-ahead finds them while the process runs); `None` without return
/// addresses.
pub(crate) fn key_in(modules: &[Module], words: &[u64]) -> Option<u64> {
    key_of(words, &mut |address| module_of_word(modules, address))
}

fn is_native(word: u64) -> bool {
    matches!(python::decode(word), FrameWord::Native(_))
}

/// The key of the stack with these frame words (innermost first), as 16 lowercase hex
/// digits. Only return addresses count: Python frames and markers are left out. Each is
/// keyed by the module holding the call (the byte before the return address, as
/// symbolization looks it up): that module's file name, and the return address minus its
/// load bias; a frame in no module by an empty name and the address.
pub(crate) fn site_hex(profile: &Profile, frames: &[u64]) -> String {
    let key = key_of(frames, &mut |address| {
        module_of_word(&profile.modules, address)
    });
    // A stack without return addresses hashes nothing, as the preload's key of it does.
    hex(key.unwrap_or_else(|| memwarden_faults::site_key(&mut core::iter::empty())))
}

fn hex(key: u64) -> String {
    format!("{key:016x}")
}

/// The key of `frames`' return addresses, with `module_of` giving the module holding each;
/// `None` when there is none.
fn key_of<'p>(
    frames: &[u64],
    module_of: &mut impl FnMut(u64) -> Option<&'p Module>,
) -> Option<u64> {
    let mut native = frames
        .iter()
        .copied()
        .filter(|&word| is_native(word))
        .peekable();
    native.peek()?;
    let mut parts = native.map(|address| match module_of(address) {
        Some(module) => (module.path.as_bytes(), address.wrapping_sub(module.base)),
        None => (&[][..], address),
    });
    Some(memwarden_faults::site_key(&mut parts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::synthetic::{ProfileBuilder, SyntheticModule};

    #[test]
    fn keys_use_file_names_and_module_offsets() {
        let profile = ProfileBuilder::new(1)
            .module(SyntheticModule {
                path: "/tmp/x/prog".into(),
                base: 0x5000_0000,
                start: 0x5000_0000,
                end: 0x5001_0000,
                ..Default::default()
            })
            .build_profile();
        let frames = [0x5000_1234, 0x9999];
        let expected: [(&[u8], u64); 2] = [(b"prog", 0x1234), (b"", 0x9999)];
        assert_eq!(
            site_hex(&profile, &frames),
            format!(
                "{:016x}",
                memwarden_faults::site_key(&mut expected.into_iter())
            )
        );
        // A return address just past the module's end still belongs to it (the call is
        // inside); one at its very start does not.
        let edge = [0x5001_0000];
        let inside: [(&[u8], u64); 1] = [(b"prog", 0x1_0000)];
        assert_eq!(
            site_hex(&profile, &edge),
            format!(
                "{:016x}",
                memwarden_faults::site_key(&mut inside.into_iter())
            )
        );
        let start = [0x5000_0000];
        let outside: [(&[u8], u64); 1] = [(b"", 0x5000_0000)];
        assert_eq!(
            site_hex(&profile, &start),
            format!(
                "{:016x}",
                memwarden_faults::site_key(&mut outside.into_iter())
            )
        );
    }
}
