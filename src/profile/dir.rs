//! The store as a folder: finds `DIR/raw/*.mwp`, reads every profile and the CLI's
//! `run.json`, and hands them together to the analysis.

use std::fs;
use std::path::{Path, PathBuf};

use memwarden_abi::{PROFILE_EXTENSION, RAW_DIR};

use super::{read_finished_profile_file, read_profile_file, FrameWords, Profile};
use crate::parallel::map_in_order;
use crate::run_record::{RunRecord, RUN_RECORD_FILE};
use crate::Error;

/// Everything an output folder holds about a run.
#[derive(Debug)]
pub struct OutputDir {
    /// The folder.
    pub dir: PathBuf,
    /// Every profile, in file-name order.
    pub profiles: Vec<Profile>,
    /// The CLI's `run.json`, if the folder has one (it does not when the preload was
    /// used without the CLI).
    pub run: Option<RunRecord>,
}

impl OutputDir {
    /// Takes every stack's frame words out of the profiles (each stack keeps its record),
    /// so that dropping them lets go of the frame areas.
    pub fn take_frames(&mut self) -> Vec<FrameWords> {
        self.profiles
            .iter_mut()
            .flat_map(|profile| profile.stacks.iter_mut())
            .map(|stack| std::mem::take(&mut stack.frames))
            .collect()
    }
}

/// The profile files in `dir/raw`, sorted by name.
pub fn profile_paths(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let raw = dir.join(RAW_DIR);
    let entries = fs::read_dir(&raw).map_err(|source| Error::Io {
        path: raw.clone(),
        action: "list",
        source,
    })?;
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io {
            path: raw.clone(),
            action: "list",
            source,
        })?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == PROFILE_EXTENSION) {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

/// Loads an output folder: all its profiles (any unreadable one is an error) and `run.json`.
pub fn load_dir(dir: &Path) -> Result<OutputDir, Error> {
    load_dir_with(dir, read_profile_file)
}

/// [`load_dir`] for a folder whose profiles are all finished: no process writes them any
/// more, nor does anyone cut them short while they are loaded (`memwarden run`'s, once it
/// has reaped every process). Their frame areas are mapped rather than read
/// ([`super::FinishedFile`]).
pub fn load_finished_dir(dir: &Path) -> Result<OutputDir, Error> {
    load_dir_with(dir, read_finished_profile_file)
}

/// Loads an output folder, each profile read by `read`.
fn load_dir_with(
    dir: &Path,
    read: impl Fn(&Path) -> Result<Profile, Error> + Sync,
) -> Result<OutputDir, Error> {
    if !dir.is_dir() {
        let reason = if dir.exists() {
            "not a folder"
        } else {
            "no such folder"
        };
        return Err(Error::NotAnOutputDir {
            path: dir.to_owned(),
            reason: reason.into(),
        });
    }
    let raw = dir.join(RAW_DIR);
    if !raw.is_dir() {
        return Err(Error::NotAnOutputDir {
            path: dir.to_owned(),
            reason: format!("it has no {RAW_DIR}/ folder"),
        });
    }
    let paths = profile_paths(dir)?;
    if paths.is_empty() {
        return Err(Error::NoProfiles { path: raw });
    }
    let profiles = map_in_order(&paths, |path| read(path))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let run_path = dir.join(RUN_RECORD_FILE);
    let run = if run_path.exists() {
        Some(RunRecord::read(&run_path)?)
    } else {
        None
    };
    Ok(OutputDir {
        dir: dir.to_owned(),
        profiles,
        run,
    })
}
