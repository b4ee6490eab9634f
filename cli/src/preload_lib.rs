//! Before the run: finds `libmemwarden.so`, the preload that records the target, and
//! builds the `LD_PRELOAD` value that puts it first without dropping the user's own.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// File name of the preload library.
pub const LIBRARY: &str = "libmemwarden.so";
/// Environment variable that overrides where the library is.
pub const OVERRIDE: &str = "MEMWARDEN_PRELOAD";

/// The absolute path of the preload: `$MEMWARDEN_PRELOAD`, else next to the running
/// executable, else `../lib/memwarden/` relative to it.
pub fn locate() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(OVERRIDE) {
        let path = PathBuf::from(path);
        return absolute_file(&path)
            .ok_or_else(|| format!("{OVERRIDE}={}: no such file", path.display()));
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the memwarden executable's folder: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join(LIBRARY),
        dir.join("../lib/memwarden").join(LIBRARY),
    ];
    candidates
        .iter()
        .find_map(|candidate| absolute_file(candidate))
        .ok_or_else(|| {
            format!(
                "cannot find {LIBRARY} (looked in {} and {}): build it with `cargo build --release` or set {OVERRIDE}",
                dir.display(),
                dir.join("../lib/memwarden").display()
            )
        })
}

fn absolute_file(path: &Path) -> Option<PathBuf> {
    let path = path.canonicalize().ok()?;
    path.is_file().then_some(path)
}

/// `LD_PRELOAD` for the target: the library first, then whatever was set before.
/// The loader splits the list at `:` and spaces, so a path holding either cannot be used.
pub fn ld_preload(library: &Path, existing: Option<&OsStr>) -> Result<OsString, String> {
    if library
        .as_os_str()
        .as_bytes()
        .iter()
        .any(|&b| b == b':' || b == b' ')
    {
        return Err(format!(
            "{}: the path holds ':' or a space, which LD_PRELOAD cannot carry; move the library or set {OVERRIDE}",
            library.display()
        ));
    }
    let mut value = library.as_os_str().to_owned();
    if let Some(existing) = existing.filter(|e| !e.is_empty()) {
        value.push(":");
        value.push(existing);
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_goes_first_and_the_users_entries_stay() {
        let library = Path::new("/opt/mw/libmemwarden.so");
        assert_eq!(
            ld_preload(library, None).unwrap(),
            "/opt/mw/libmemwarden.so"
        );
        assert_eq!(
            ld_preload(library, Some(OsStr::new(""))).unwrap(),
            "/opt/mw/libmemwarden.so"
        );
        assert_eq!(
            ld_preload(library, Some(OsStr::new("/a.so /b.so"))).unwrap(),
            "/opt/mw/libmemwarden.so:/a.so /b.so"
        );
    }

    #[test]
    fn paths_the_loader_would_split_are_refused() {
        let error = ld_preload(Path::new("/my libs/libmemwarden.so"), None).unwrap_err();
        assert!(error.starts_with("/my libs/libmemwarden.so: the path holds ':' or a space"));
        assert!(ld_preload(Path::new("/a:b/libmemwarden.so"), None).is_err());
    }
}
