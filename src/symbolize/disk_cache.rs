//! Symbolization's memory across runs: what each module's addresses resolved to, kept in a
//! file per module version under the user's cache folder, so that a program profiled again
//! is symbolized without loading (and inflating) its debug information.
//!
//! A file is named by a hash of its key and holds the key itself, which is checked: the
//! key is made of this format's version, memwarden's version, the run's build id of the
//! module, and the path, device, inode, size and modification time of every file the
//! symbols come from (the module, its debug file, the dwz supplementary file). A module
//! rebuilt, a debug package installed or memwarden upgraded is thus another key, never a
//! stale answer. Files are replaced by a rename, so concurrent runs never read half a file;
//! a file that cannot be read whole is ignored.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use memwarden_faults::Fnv1a;

use super::module::{Location, ModuleFiles};

/// The environment variable that names the cache folder, or turns the cache off (`off`).
pub const CACHE_VARIABLE: &str = "MEMWARDEN_SYMBOL_CACHE";
/// First bytes of a cache file; the digits are the format's version.
const MAGIC: &[u8; 8] = b"MWSYMC01";
/// Files kept in the folder; past this, the least recently used are removed.
const MAX_FILES: usize = 2000;
/// A temporary file older than this was left by a run that died while writing it.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// The cache folder: `$MEMWARDEN_SYMBOL_CACHE`, else `$XDG_CACHE_HOME/memwarden/symbols`,
/// else `~/.cache/memwarden/symbols`; `None` when turned off (`off` or empty) or no home
/// is known.
pub fn default_dir() -> Option<PathBuf> {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|path| path.is_absolute())
    };
    match std::env::var_os(CACHE_VARIABLE) {
        Some(value) if value.is_empty() || value == "off" => None,
        Some(value) => Some(PathBuf::from(value)),
        None => absolute("XDG_CACHE_HOME")
            .or_else(|| absolute("HOME").map(|home| home.join(".cache")))
            .map(|cache| cache.join("memwarden").join("symbols")),
    }
}

/// The key of a module's symbols as found in `files`; `None` if a file cannot be looked at.
pub(crate) fn key(build_id: &[u8], files: &ModuleFiles) -> Option<Vec<u8>> {
    let mut key = Vec::new();
    put_bytes(&mut key, MAGIC);
    put_bytes(&mut key, env!("CARGO_PKG_VERSION").as_bytes());
    put_bytes(&mut key, build_id);
    for path in files.paths() {
        let facts = std::fs::metadata(path).ok()?;
        put_bytes(&mut key, path.as_os_str().as_encoded_bytes());
        for number in [
            facts.dev(),
            facts.ino(),
            facts.size(),
            facts.mtime() as u64,
            facts.mtime_nsec() as u64,
        ] {
            key.extend_from_slice(&number.to_le_bytes());
        }
    }
    Some(key)
}

/// The file of `key` in `dir`.
fn file_of(dir: &Path, key: &[u8]) -> PathBuf {
    // A stable name; the key inside the file settles any collision.
    let mut hash = Fnv1a::new();
    hash.eat(key);
    dir.join(format!("{:016x}.sym", hash.finish()))
}

/// The addresses (file-relative probes) and their frames stored for `key`; empty if there
/// is no usable file. A file found is marked as just used.
pub(crate) fn load(dir: &Path, key: &[u8]) -> Vec<(u64, Box<[Location]>)> {
    let path = file_of(dir, key);
    let Ok(bytes) = std::fs::read(&path) else {
        return Vec::new();
    };
    let entries = decode(&bytes, key).unwrap_or_default();
    if !entries.is_empty() {
        if let Ok(file) = std::fs::File::options().write(true).open(&path) {
            let _ = file.set_modified(SystemTime::now());
        }
    }
    entries
}

/// Stores `entries` for `key` in `dir` (created if needed), replacing what was there.
/// Failures are ignored: the cache only saves time. [`trim`] keeps the folder's size.
pub(crate) fn save(dir: &Path, key: &[u8], entries: &[(u64, &[Location])]) {
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let path = file_of(dir, key);
    let temporary = dir.join(format!(
        ".{}.{}.tmp",
        std::process::id(),
        path.file_name().and_then(|n| n.to_str()).unwrap_or("sym")
    ));
    let written = std::fs::File::create(&temporary)
        .and_then(|mut file| file.write_all(&encode(key, entries)));
    if written.is_err() || std::fs::rename(&temporary, &path).is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
}

/// Removes the least recently used files past [`MAX_FILES`], and temporary files a run
/// that died while writing left behind (once per report: it looks at every file of the
/// folder).
pub(crate) fn trim(dir: &Path) {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    // A clock set before 1970 + an hour leaves temporary files alone (no panic).
    let abandoned_before = SystemTime::now().checked_sub(ABANDONED_AFTER);
    let mut files: Vec<(SystemTime, PathBuf)> = Vec::new();
    for entry in listing.filter_map(Result::ok) {
        let path = entry.path();
        let Some(modified) = entry.metadata().ok().and_then(|m| m.modified().ok()) else {
            continue;
        };
        match path.extension().and_then(|e| e.to_str()) {
            Some("sym") => files.push((modified, path)),
            Some("tmp") if abandoned_before.is_some_and(|before| modified < before) => {
                let _ = std::fs::remove_file(&path);
            }
            _ => {}
        }
    }
    if files.len() <= MAX_FILES {
        return;
    }
    files.sort();
    for (_, path) in &files[..files.len() - MAX_FILES] {
        let _ = std::fs::remove_file(path);
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Flags of a stored location.
const INLINED: u8 = 1;
const HAS_LINE: u8 = 2;

/// The file's bytes: magic, key, the distinct strings, then each probe with its frames
/// (strings by index + 1, 0 for none).
fn encode(key: &[u8], entries: &[(u64, &[Location])]) -> Vec<u8> {
    let mut strings: Vec<&str> = Vec::new();
    let mut index: HashMap<&str, u32> = HashMap::new();
    let mut body = Vec::new();
    body.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for &(probe, locations) in entries {
        body.extend_from_slice(&probe.to_le_bytes());
        body.extend_from_slice(&(locations.len() as u32).to_le_bytes());
        for location in locations {
            for text in [&location.function, &location.file] {
                let id = text.as_deref().map_or(0, |text| {
                    *index.entry(text).or_insert_with(|| {
                        strings.push(text);
                        strings.len() as u32
                    })
                });
                body.extend_from_slice(&id.to_le_bytes());
            }
            body.extend_from_slice(&location.line.unwrap_or(0).to_le_bytes());
            let flags = (if location.inlined { INLINED } else { 0 })
                | (if location.line.is_some() { HAS_LINE } else { 0 });
            body.push(flags);
        }
    }
    let mut out = MAGIC.to_vec();
    put_bytes(&mut out, key);
    out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    for text in strings {
        put_bytes(&mut out, text.as_bytes());
    }
    out.extend_from_slice(&body);
    out
}

/// Reads what [`encode`] wrote for `key`; `None` for another key or any damage.
fn decode(bytes: &[u8], key: &[u8]) -> Option<Vec<(u64, Box<[Location]>)>> {
    let mut reader = Reader { bytes };
    if reader.take(MAGIC.len())? != MAGIC {
        return None;
    }
    let stored_key_len = reader.u32()? as usize;
    if reader.take(stored_key_len)? != key {
        return None;
    }
    let string_count = reader.u32()? as usize;
    let mut strings = Vec::with_capacity(string_count.min(reader.bytes.len() / 4));
    for _ in 0..string_count {
        let len = reader.u32()? as usize;
        strings.push(std::str::from_utf8(reader.take(len)?).ok()?.to_owned());
    }
    let text = |id: u32| -> Option<Option<String>> {
        match id {
            0 => Some(None),
            id => strings.get(id as usize - 1).cloned().map(Some),
        }
    };
    let entry_count = reader.u32()? as usize;
    let mut entries = Vec::with_capacity(entry_count.min(reader.bytes.len() / 12));
    for _ in 0..entry_count {
        let probe = reader.u64()?;
        let levels = reader.u32()? as usize;
        let mut locations = Vec::with_capacity(levels.min(reader.bytes.len() / 13));
        for _ in 0..levels {
            let function = text(reader.u32()?)?;
            let file = text(reader.u32()?)?;
            let line = reader.u32()?;
            let flags = reader.take(1)?[0];
            locations.push(Location {
                function,
                file,
                line: (flags & HAS_LINE != 0).then_some(line),
                inlined: flags & INLINED != 0,
            });
        }
        if locations.is_empty() {
            return None;
        }
        entries.push((probe, locations.into_boxed_slice()));
    }
    reader.bytes.is_empty().then_some(entries)
}

/// A cursor over a cache file's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.bytes.len() {
            return None;
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Some(taken)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
#[path = "disk_cache_tests.rs"]
mod tests;
