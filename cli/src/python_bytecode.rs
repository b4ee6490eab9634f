//! Before and after the run: the bytecode of memwarden's Python files, kept across runs.
//! Every Python of a run reads memwarden's `sitecustomize.py`, and one that imports NumPy
//! the installer too; compiling them costs a few milliseconds per process, which bytecode
//! saves. The `sitecustomize` writes pycs checked by the source's hash into
//! `DIR/.python/__pycache__` (a pyc checked by time would not outlive the run: each run
//! writes the files anew); after the run they are copied into memwarden's cache folder,
//! and before the next run back into its `__pycache__`. The cache's subfolder is named by
//! a hash of the files' text, so a pyc of other sources is never offered, and Python checks
//! each pyc against its source anyway.

use std::fs;
use std::path::{Path, PathBuf};

use memwarden_faults::Fnv1a;

use crate::python_env::{FILES, SITE_DIR};

/// Python's folder of bytecode, beside the sources.
const PYCACHE: &str = "__pycache__";
/// The subfolder of memwarden's cache folder that holds the kept bytecode.
const CACHE_SUBDIR: &str = "python";
/// The flag of a pyc's header (PEP 552) that says it is checked by the source's hash.
const HASH_BASED: u32 = 0b01;

/// The folder of `cache`, memwarden's cache folder, that keeps the bytecode of this
/// version's Python files.
pub fn cache_dir(cache: &Path) -> PathBuf {
    cache
        .join(CACHE_SUBDIR)
        .join(format!("{:016x}", sources_hash()))
}

/// Before the run: empties `DIR/.python/__pycache__` (an earlier run's bytecode may be of
/// other sources) and fills it with the bytecode `kept` holds. Best effort: without it
/// each Python compiles the files.
pub fn offer(out_dir: &Path, kept: Option<&Path>) {
    let pycache = out_dir.join(SITE_DIR).join(PYCACHE);
    let _ = fs::remove_dir_all(&pycache);
    let Some(kept) = kept else {
        return;
    };
    let Ok(listing) = fs::read_dir(kept) else {
        return;
    };
    if fs::create_dir_all(&pycache).is_err() {
        return;
    }
    for entry in listing.filter_map(Result::ok) {
        let name = entry.file_name();
        if name.to_str().is_some_and(is_ours) {
            let _ = fs::copy(entry.path(), pycache.join(&name));
        }
    }
}

/// After the run: copies into `kept` the pycs of memwarden's files that the run's Pythons
/// wrote (those checked by hash, one per Python version) and `kept` lacks, and removes the
/// bytecode kept for other versions of the files. Best effort.
pub fn keep(out_dir: &Path, kept: &Path) {
    let Ok(listing) = fs::read_dir(out_dir.join(SITE_DIR).join(PYCACHE)) else {
        return;
    };
    let mut made = false;
    for entry in listing.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(text) = name.to_str().filter(|n| is_ours(n)) else {
            continue;
        };
        let target = kept.join(text);
        if target.exists() || !is_hash_based(&entry.path()) {
            continue;
        }
        if !made {
            if fs::create_dir_all(kept).is_err() {
                return;
            }
            remove_others(kept);
            made = true;
        }
        // Copied under another name, then renamed: a run starting meanwhile copies the
        // old file or the new one, never part of one.
        let partial = kept.join(format!("{text}.{}.tmp", std::process::id()));
        if fs::copy(entry.path(), &partial).is_err() || fs::rename(&partial, &target).is_err() {
            let _ = fs::remove_file(&partial);
        }
    }
}

/// Removes the folders beside `kept`: bytecode of other versions of the files.
fn remove_others(kept: &Path) {
    let (Some(parent), Some(own)) = (kept.parent(), kept.file_name()) else {
        return;
    };
    let Ok(listing) = fs::read_dir(parent) else {
        return;
    };
    for entry in listing.filter_map(Result::ok) {
        if entry.file_name() != own {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// A pyc of one of memwarden's files (`sitecustomize.cpython-311.pyc`), for any Python.
fn is_ours(name: &str) -> bool {
    FILES.iter().any(|(source, _)| {
        let stem = source.strip_suffix(".py").unwrap_or(source);
        name.strip_prefix(stem)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|tag| tag.ends_with(".pyc"))
    })
}

/// Whether the pyc at `path` is checked by its source's hash (its flags word, after the
/// magic number, says so).
fn is_hash_based(path: &Path) -> bool {
    let mut header = [0u8; 8];
    let read = fs::File::open(path).and_then(|mut file| {
        use std::io::Read;
        file.read_exact(&mut header)
    });
    read.is_ok()
        && u32::from_le_bytes([header[4], header[5], header[6], header[7]]) & HASH_BASED != 0
}

/// A hash (FNV-1a) of memwarden's version and its Python files' names and text.
fn sources_hash() -> u64 {
    let mut hash = Fnv1a::new();
    let version = env!("CARGO_PKG_VERSION");
    let parts = FILES
        .iter()
        .flat_map(|(name, text)| [name.as_bytes(), text.as_bytes()]);
    for part in std::iter::once(version.as_bytes()).chain(parts) {
        hash.eat(part);
        hash.eat(&[0]);
    }
    hash.finish()
}

#[cfg(test)]
#[path = "python_bytecode_tests.rs"]
mod tests;
