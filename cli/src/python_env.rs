//! Before the run: the Python end of the pipeline. Writes memwarden's `sitecustomize.py`
//! (and the NumPy installer it loads, `memwarden_numpy.py`) into a hidden folder of the
//! output folder and builds the environment that puts that folder first on `PYTHONPATH`,
//! so that every Python of the profiled tree installs memwarden's NumPy data-memory
//! handler (NEP 49) when it imports NumPy (docs/python.md); with `--python-objects`, also
//! sets `PYTHONMALLOC` so that Python's small objects reach `malloc`.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::io_reason as reason;

/// The folder of the output folder that holds memwarden's Python files.
pub const SITE_DIR: &str = ".python";
/// The files of that folder: memwarden's `sitecustomize.py`, read by every Python start,
/// and the part it loads only when NumPy is imported.
pub const FILES: [(&str, &str); 2] = [
    ("sitecustomize.py", include_str!("python/sitecustomize.py")),
    (
        "memwarden_numpy.py",
        include_str!("python/memwarden_numpy.py"),
    ),
];
/// Python's search path, read by every Python the target starts.
const PYTHONPATH: &str = "PYTHONPATH";
/// The path of `libmemwarden.so`, for the Python side to find the handler's exports by.
const LIBRARY_VARIABLE: &str = "MEMWARDEN_LIBRARY";
/// Python's choice of allocator, read by every Python the target starts.
const PYTHONMALLOC: &str = "PYTHONMALLOC";
/// The `PYTHONMALLOC` values that send every object through `malloc`.
const THROUGH_MALLOC: [&str; 2] = ["malloc", "malloc_debug"];

/// The variables the target gets for Python: `PYTHONPATH` and `MEMWARDEN_LIBRARY`.
pub type PythonEnv = Vec<(&'static str, OsString)>;

/// Writes `out_dir/.python/sitecustomize.py` and `memwarden_numpy.py`, and returns the
/// variables to set. `Ok(None)` when `out_dir`'s path holds a `:`, which `PYTHONPATH`
/// cannot carry (the run goes on, NumPy's array data is then seen through malloc only);
/// `Err` when a file cannot be written.
pub fn prepare(
    out_dir: &Path,
    library: &Path,
    existing: Option<&OsStr>,
) -> Result<Option<PythonEnv>, String> {
    let site = out_dir.join(SITE_DIR);
    let Some(python_path) = python_path(&site, existing) else {
        return Ok(None);
    };
    fs::create_dir_all(&site)
        .map_err(|e| format!("cannot create {}: {}", site.display(), reason(&e)))?;
    for (name, text) in FILES {
        let file = site.join(name);
        fs::write(&file, text)
            .map_err(|e| format!("cannot write {}: {}", file.display(), reason(&e)))?;
    }
    Ok(Some(vec![
        (PYTHONPATH, python_path),
        (LIBRARY_VARIABLE, library.as_os_str().to_owned()),
    ]))
}

/// What `--python-objects` sets: `PYTHONMALLOC=malloc`, so that objects under 512 bytes
/// leave pymalloc's arenas (which memwarden does not see inside) for `malloc`;
/// `malloc_debug` when the user's value, `existing`, asked for Python's debug hooks
/// (`debug`, `pymalloc_debug`). `None` when it sends objects through `malloc` already.
pub fn objects_through_malloc(existing: Option<&OsStr>) -> Option<(&'static str, OsString)> {
    let [plain, debug] = THROUGH_MALLOC;
    match existing.and_then(OsStr::to_str) {
        Some(value) if THROUGH_MALLOC.contains(&value) => None,
        Some("debug" | "pymalloc_debug") => Some((PYTHONMALLOC, debug.into())),
        _ => Some((PYTHONMALLOC, plain.into())),
    }
}

/// `PYTHONPATH` for the target: `site` first, then the user's entries as they were (an
/// empty value adds nothing: an empty entry would mean the current folder). `None` when
/// `site` holds the separator.
pub fn python_path(site: &Path, existing: Option<&OsStr>) -> Option<OsString> {
    if site.as_os_str().as_bytes().contains(&b':') {
        return None;
    }
    let mut value = site.as_os_str().to_owned();
    if let Some(existing) = existing.filter(|e| !e.is_empty()) {
        value.push(":");
        value.push(existing);
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_folder_goes_first_and_the_users_entries_stay_as_they_were() {
        let site = Path::new("/out/.python");
        assert_eq!(python_path(site, None).unwrap(), "/out/.python");
        assert_eq!(
            python_path(site, Some(OsStr::new(""))).unwrap(),
            "/out/.python"
        );
        assert_eq!(
            python_path(site, Some(OsStr::new("/a::b"))).unwrap(),
            "/out/.python:/a::b"
        );
    }

    #[test]
    fn python_objects_go_through_malloc_unless_they_do_already() {
        let set = Some((PYTHONMALLOC, OsString::from("malloc")));
        assert_eq!(objects_through_malloc(None), set);
        assert_eq!(objects_through_malloc(Some(OsStr::new("pymalloc"))), set);
        let debug = Some((PYTHONMALLOC, OsString::from("malloc_debug")));
        assert_eq!(objects_through_malloc(Some(OsStr::new("debug"))), debug);
        assert_eq!(
            objects_through_malloc(Some(OsStr::new("pymalloc_debug"))),
            debug
        );
        assert_eq!(objects_through_malloc(Some(OsStr::new("malloc"))), None);
        assert_eq!(
            objects_through_malloc(Some(OsStr::new("malloc_debug"))),
            None
        );
    }

    #[test]
    fn a_folder_holding_the_separator_is_not_put_on_the_path() {
        assert!(python_path(Path::new("/x:y/.python"), None).is_none());
    }

    #[test]
    fn the_file_is_written_and_the_library_named() {
        let dir = tempfile::tempdir().unwrap();
        let env = prepare(dir.path(), Path::new("/lib/libmemwarden.so"), None)
            .unwrap()
            .unwrap();
        for (name, text) in FILES {
            let written = fs::read_to_string(dir.path().join(SITE_DIR).join(name)).unwrap();
            assert_eq!(written, text);
        }
        assert_eq!(env[1], (LIBRARY_VARIABLE, "/lib/libmemwarden.so".into()));
    }
}
