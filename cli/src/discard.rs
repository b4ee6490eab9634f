//! Before the run: the earlier run's files (its profiles and report) are set aside by
//! renaming them into a hidden folder of the output folder, and deleted there by a thread
//! of low priority while the target runs. Deleted in place, an imports-heavy Python run's
//! profile (a sparse file of hundreds of MB apparent size) and report took 7–9 ms before
//! the target could start, on every run that reuses its output folder.

use std::fs;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

/// Names of the folders files are set aside in, followed by the CLI's pid. A folder that
/// a killed run left behind is deleted by the next run in the same output folder.
pub const DISCARD_PREFIX: &str = ".memwarden-discard-";

/// Files set aside, to be deleted.
#[derive(Debug)]
pub struct Discard {
    /// This run's folder (made at the first file set aside).
    folder: PathBuf,
    made: bool,
    /// Folders of earlier runs that never deleted theirs.
    leftovers: Vec<PathBuf>,
}

impl Discard {
    /// Nothing set aside yet in output folder `dir`; earlier runs' leftover folders found.
    pub fn new(dir: &Path) -> Discard {
        let name = format!("{DISCARD_PREFIX}{}", std::process::id());
        let leftovers = fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| {
                let found = entry.file_name();
                let found = found.to_string_lossy();
                found.starts_with(DISCARD_PREFIX) && *found != name
            })
            .map(|entry| entry.path())
            .collect();
        Discard {
            folder: dir.join(name),
            made: false,
            leftovers,
        }
    }

    /// Takes `path` out of the way: moved into the discard folder or, where it cannot be
    /// moved (another file system), deleted at once. A file that is not there is fine.
    pub fn set_aside(&mut self, path: &Path) -> io::Result<()> {
        // Most report files of a fresh output folder are not there: no folder is made, and
        // no thread started, for nothing to delete.
        if matches!(fs::symlink_metadata(path), Err(e) if e.kind() == ErrorKind::NotFound) {
            return Ok(());
        }
        if !self.made {
            // A folder of this name is a killed run's whose pid this run got: taken over.
            self.made = match fs::create_dir(&self.folder) {
                Ok(()) => true,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => self.folder.is_dir(),
                Err(_) => false,
            };
        }
        if let (true, Some(name)) = (self.made, path.file_name()) {
            match fs::rename(path, self.folder.join(name)) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(_) => {}
            }
        }
        match fs::remove_file(path) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Deletes everything set aside, and the leftovers. Failures are ignored: these files
    /// are nobody's any more, and a folder left behind is deleted by the next run.
    pub fn delete(self) {
        let own = self.made.then_some(self.folder);
        for folder in own.into_iter().chain(self.leftovers) {
            let _ = fs::remove_dir_all(folder);
        }
    }

    /// [`Discard::delete`] on a thread of the lowest priority; the deletion is waited for
    /// when the returned value is dropped. If no thread can start, the folder stays, and
    /// the next run in this output folder deletes it.
    pub fn delete_in_background(self) -> Deleting {
        if !self.made && self.leftovers.is_empty() {
            return Deleting(None);
        }
        let started = std::thread::Builder::new()
            .name("memwarden-discard".into())
            .spawn(move || {
                crate::lower_own_priority();
                self.delete();
            });
        Deleting(started.ok())
    }
}

/// A deletion under way: waited for when dropped, so that memwarden leaves no folder of
/// its own behind.
pub struct Deleting(Option<JoinHandle<()>>);

impl Drop for Deleting {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn files_set_aside_leave_their_place_at_once_and_are_deleted_later() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        fs::write(dir.join("report.json"), b"old").unwrap();
        fs::write(dir.join("keep.txt"), b"mine").unwrap();
        let mut discard = Discard::new(dir);
        discard.set_aside(&dir.join("report.json")).unwrap();
        discard.set_aside(&dir.join("absent.svg")).unwrap();
        assert!(!dir.join("report.json").exists());
        let aside = format!("{DISCARD_PREFIX}{}", std::process::id());
        assert_eq!(names(dir), [aside.as_str(), "keep.txt"]);
        drop(discard.delete_in_background());
        assert_eq!(names(dir), ["keep.txt"]);
    }

    /// A discard folder that the run of pid `pid` was killed before deleting.
    fn left_by_killed_run(dir: &Path, pid: u32) {
        let left = dir.join(format!("{DISCARD_PREFIX}{pid}"));
        fs::create_dir(&left).unwrap();
        fs::write(left.join("1-2.mwp"), b"old").unwrap();
    }

    #[test]
    fn a_killed_runs_folder_is_deleted_by_the_next_run() {
        let scratch = tempfile::tempdir().unwrap();
        left_by_killed_run(scratch.path(), 1);
        Discard::new(scratch.path()).delete();
        assert!(names(scratch.path()).is_empty());
    }

    #[test]
    fn a_killed_runs_folder_under_this_runs_pid_is_taken_over() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        left_by_killed_run(dir, std::process::id());
        fs::write(dir.join("peak.svg"), b"old").unwrap();
        let mut discard = Discard::new(dir);
        discard.set_aside(&dir.join("peak.svg")).unwrap();
        discard.delete();
        assert!(names(dir).is_empty());
    }

    #[test]
    fn a_file_that_cannot_be_moved_is_deleted_in_place() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        // The discard folder's name is taken by a file: nothing can be moved into it.
        let taken = dir.join(format!("{DISCARD_PREFIX}{}", std::process::id()));
        fs::write(&taken, b"").unwrap();
        fs::write(dir.join("peak.svg"), b"old").unwrap();
        let mut discard = Discard::new(dir);
        discard.set_aside(&dir.join("peak.svg")).unwrap();
        assert!(!dir.join("peak.svg").exists());
        discard.delete();
        assert!(taken.exists(), "not a folder of this run's: left alone");
    }
}
