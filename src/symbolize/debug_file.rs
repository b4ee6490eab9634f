//! Symbolization's file finder: given a module mapped in the profiled process, decides
//! which file on disk holds its DWARF — the module itself, or a separate debug file found
//! by build id or `.gnu_debuglink` — and whether the file still matches the run.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use object::{Object, ObjectSection};

/// Where separate debug files are installed (`/usr/lib/debug/.build-id/…`, `/usr/lib/debug/<dir>/…`).
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// What symbolization needs to know about an ELF file, read without loading it whole.
#[derive(Debug, Default)]
pub(crate) struct ElfFacts {
    /// GNU build id, if any.
    pub build_id: Option<Vec<u8>>,
    /// It has a `.debug_info` section.
    pub has_dwarf: bool,
    /// File name from `.gnu_debuglink`.
    pub debuglink: Option<PathBuf>,
    /// Path and build id from `.gnu_debugaltlink` (the dwz supplementary file).
    pub altlink: Option<(PathBuf, Vec<u8>)>,
}

impl ElfFacts {
    /// Reads the facts of the object file at `path`.
    pub fn read(path: &Path) -> Result<ElfFacts, String> {
        let data = mapped(path).map_err(|e| e.to_string())?;
        let object = object::File::parse(&*data).map_err(|e| e.to_string())?;
        Ok(ElfFacts {
            build_id: object.build_id().ok().flatten().map(<[u8]>::to_vec),
            has_dwarf: object
                .section_by_name(".debug_info")
                .is_some_and(|s| s.size() > 0),
            debuglink: object
                .gnu_debuglink()
                .ok()
                .flatten()
                .map(|(name, _crc)| path_from_bytes(name)),
            altlink: object
                .gnu_debugaltlink()
                .ok()
                .flatten()
                .map(|(name, id)| (path_from_bytes(name), id.to_vec())),
        })
    }
}

/// The file at `path`, mapped read-only. Parsing an ELF file reads many small pieces of
/// it (headers, section names, a symbol table's names one by one): from a mapping they
/// cost no system call, where a read-through cache made one or two per piece (a tenth of
/// the look-ahead's time on a NumPy run).
pub(crate) fn mapped(path: &Path) -> std::io::Result<Mmap> {
    let file = File::open(path)?;
    // SAFETY: a read-only mapping of a file memwarden never writes, read as plain bytes
    // (any content is valid input to the parser). Libraries are replaced by new files (a
    // rename), which leaves this mapping intact; a file truncated in place while mapped
    // would make a read past its new end fault — the risk addr2line's loader already
    // takes with its mappings of the same files.
    unsafe { Mmap::map(&file) }
}

fn path_from_bytes(bytes: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
}

/// The path under [`DEBUG_ROOT`] where a debug file for `build_id` lives, by convention.
pub(crate) fn build_id_path(root: &Path, build_id: &[u8], suffix: &str) -> Option<PathBuf> {
    let (first, rest) = build_id.split_first()?;
    if rest.is_empty() {
        return None;
    }
    let rest: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    Some(
        root.join(".build-id")
            .join(format!("{first:02x}"))
            .join(format!("{rest}{suffix}")),
    )
}

/// Candidate separate debug files for the module at `path`, most specific first: by
/// build id, then by debuglink next to the file, in `.debug/`, and under [`DEBUG_ROOT`].
pub(crate) fn debug_file_candidates(path: &Path, facts: &ElfFacts) -> Vec<PathBuf> {
    let root = Path::new(DEBUG_ROOT);
    let mut candidates = Vec::new();
    if let Some(id) = &facts.build_id {
        candidates.extend(build_id_path(root, id, ".debug"));
    }
    if let Some(link) = &facts.debuglink {
        let real = path.canonicalize().unwrap_or_else(|_| path.to_owned());
        if let Some(dir) = real.parent() {
            candidates.push(dir.join(link));
            candidates.push(dir.join(".debug").join(link));
            let relative = dir.strip_prefix("/").unwrap_or(dir);
            candidates.push(root.join(relative).join(link));
        }
    }
    candidates
}

/// The first candidate that holds DWARF and, when both have build ids, the same one.
pub(crate) fn find_debug_file(path: &Path, facts: &ElfFacts) -> Option<(PathBuf, ElfFacts)> {
    debug_file_candidates(path, facts)
        .into_iter()
        .filter(|candidate| candidate != path)
        .find_map(|candidate| {
            let found = ElfFacts::read(&candidate).ok()?;
            let same_build = match (&facts.build_id, &found.build_id) {
                (Some(want), Some(have)) => want == have,
                _ => true,
            };
            (found.has_dwarf && same_build).then_some((candidate, found))
        })
}

/// The dwz supplementary file a DWARF file refers to, if it can be found.
pub(crate) fn find_supplementary(dwarf_path: &Path, facts: &ElfFacts) -> Option<PathBuf> {
    let (link, id) = facts.altlink.as_ref()?;
    let beside = dwarf_path.parent().map(|dir| dir.join(link));
    [beside, build_id_path(Path::new(DEBUG_ROOT), id, ".debug")]
        .into_iter()
        .flatten()
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_paths_follow_the_gdb_convention() {
        let path = build_id_path(Path::new("/usr/lib/debug"), &[0xab, 0x01, 0xff], ".debug");
        assert_eq!(
            path.unwrap(),
            Path::new("/usr/lib/debug/.build-id/ab/01ff.debug")
        );
        assert_eq!(build_id_path(Path::new("/r"), &[0xab], ".debug"), None);
        assert_eq!(build_id_path(Path::new("/r"), &[], ".debug"), None);
    }

    #[test]
    fn debuglink_candidates_cover_the_three_usual_places() {
        let facts = ElfFacts {
            build_id: Some(vec![0x12, 0x34]),
            debuglink: Some(PathBuf::from("libx.so.debug")),
            ..ElfFacts::default()
        };
        let candidates = debug_file_candidates(Path::new("/nonexistent/lib/libx.so"), &facts);
        let expected = [
            "/usr/lib/debug/.build-id/12/34.debug",
            "/nonexistent/lib/libx.so.debug",
            "/nonexistent/lib/.debug/libx.so.debug",
            "/usr/lib/debug/nonexistent/lib/libx.so.debug",
        ];
        assert_eq!(candidates, expected.map(PathBuf::from));
    }

    #[test]
    fn reads_the_facts_of_the_test_binary() {
        let exe = std::env::current_exe().unwrap();
        let facts = ElfFacts::read(&exe).unwrap();
        assert!(facts.has_dwarf, "test binaries are built with debug info");
        assert!(ElfFacts::read(Path::new("/nonexistent")).is_err());
    }
}
