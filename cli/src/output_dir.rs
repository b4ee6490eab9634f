//! Before the run: prepares the output folder the preload writes into — created, writable,
//! with an empty `raw/` (profiles of an earlier run taken away, and its report files with
//! them: a run that leaves no report must not seem to have left the last one). They are
//! set aside at once and deleted while the target runs (`discard`).

use std::fs;
use std::path::{Path, PathBuf};

use memwarden::report::folded::Measure;
use memwarden::report::REPORT_FILE;
use memwarden_abi::{PROFILE_EXTENSION, RAW_DIR};

use crate::discard::Discard;
use crate::io_reason as reason;

/// Lets a report file that would pass the file size limit (`ulimit -f`) fail to be written,
/// with an error that says so, instead of killing memwarden (SIGXFSZ). Called once no
/// target is left to start: an ignored signal stays ignored across `exec`.
pub fn fail_writes_past_file_limit() {
    // SAFETY: SIG_IGN installs no handler code.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}

/// Creates `dir` and `dir/raw`, sets aside stale `raw/*.mwp` and the report files of an
/// earlier run, checks that both can be written; returns the absolute path of `dir`, and
/// what was set aside, for the caller to delete.
pub fn prepare(dir: &Path) -> Result<(PathBuf, Discard), String> {
    let shown = dir.display();
    fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create output folder {shown}: {}", reason(&e)))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("output folder {shown}: {}", reason(&e)))?;
    let raw = dir.join(RAW_DIR);
    fs::create_dir_all(&raw)
        .map_err(|e| format!("cannot create {}: {}", raw.display(), reason(&e)))?;
    let entries =
        fs::read_dir(&raw).map_err(|e| format!("cannot list {}: {}", raw.display(), reason(&e)))?;
    let mut discard = Discard::new(&dir);
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == PROFILE_EXTENSION) {
            discard.set_aside(&path).map_err(|e| {
                format!(
                    "cannot delete the stale profile {}: {}",
                    path.display(),
                    reason(&e)
                )
            })?;
        }
    }
    for stale in report_files(&dir) {
        discard.set_aside(&stale).map_err(|e| {
            format!(
                "cannot delete the earlier report file {}: {}",
                stale.display(),
                reason(&e)
            )
        })?;
    }
    for folder in [&dir, &raw] {
        probe_writable(folder)?;
    }
    Ok((dir, discard))
}

/// The files the report writes into `dir`.
fn report_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![dir.join(REPORT_FILE)];
    for measure in Measure::ALL {
        files.push(dir.join(measure.folded_file()));
        files.push(dir.join(measure.svg_file()));
    }
    files
}

/// Creates and deletes a file in `folder`: the only sure test of writability (root,
/// read-only mounts, ACLs).
fn probe_writable(folder: &Path) -> Result<(), String> {
    let probe = folder.join(format!(".memwarden-probe-{}", std::process::id()));
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| format!("cannot write into {}: {}", folder.display(), reason(&e)))?;
    fs::remove_file(&probe)
        .map_err(|e| format!("cannot write into {}: {}", folder.display(), reason(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_the_folders_and_deletes_only_stale_profiles_and_reports() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("a/b");
        fs::create_dir_all(dir.join("raw")).unwrap();
        fs::write(dir.join("raw/old.mwp"), b"x").unwrap();
        fs::write(dir.join("raw/notes.txt"), b"x").unwrap();
        for old_report in [
            "report.json",
            "peak.svg",
            "allocated.folded",
            "numpy-peak.svg",
        ] {
            fs::write(dir.join(old_report), b"x").unwrap();
        }
        let (prepared, discard) = prepare(&dir).unwrap();
        assert!(prepared.is_absolute() && prepared.join("raw").is_dir());
        assert!(!dir.join("raw/old.mwp").exists());
        assert!(!dir.join("report.json").exists());
        assert!(dir.join("raw/notes.txt").exists());
        discard.delete();
        let left: Vec<_> = fs::read_dir(&prepared)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, ["raw"], "the write probes are removed");
    }

    #[test]
    fn a_file_in_the_way_or_an_impossible_place_is_refused() {
        let scratch = tempfile::tempdir().unwrap();
        let file = scratch.path().join("f");
        fs::write(&file, b"x").unwrap();
        let error = prepare(&file).unwrap_err();
        assert_eq!(
            error,
            format!(
                "cannot create output folder {}: exists and is not a folder",
                file.display()
            )
        );
        let under = file.join("out");
        let error = prepare(&under).unwrap_err();
        assert_eq!(
            error,
            format!(
                "cannot create output folder {}: a file is in the way (not a folder)",
                under.display()
            )
        );
        assert!(prepare(Path::new("/proc/memwarden-forbidden")).is_err());
    }
}
