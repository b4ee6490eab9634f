//! The errors of the reading half (store → analysis → report), each shown to the user as
//! one line naming the file and what is wrong with it.

use std::io;
use std::path::PathBuf;

use crate::profile::ProfileError;

/// Why a report could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A profile file is unreadable, corrupt or truncated.
    #[error("{}: {source}", path.display())]
    Profile {
        /// The `*.mwp` file.
        path: PathBuf,
        /// What is wrong with it.
        source: ProfileError,
    },
    /// The output folder does not exist or is not a folder.
    #[error("{}: not a memwarden output folder ({reason})", path.display())]
    NotAnOutputDir {
        /// The folder given.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The output folder holds no profile at all.
    #[error("{}: no profiles (*.mwp) found; did the program run under memwarden?", path.display())]
    NoProfiles {
        /// The `raw` folder searched.
        path: PathBuf,
    },
    /// `run.json` exists but cannot be read or parsed.
    #[error("{}: {reason}", path.display())]
    RunRecord {
        /// The `run.json` file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file or folder could not be read or written.
    #[error("{}: cannot {action}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What was attempted ("read", "write", "list"…).
        action: &'static str,
        /// The system's reason.
        source: io::Error,
    },
}
