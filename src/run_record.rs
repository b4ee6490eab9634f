//! The CLI's account of a run, `DIR/run.json`: what it started and how every process it
//! reaped ended. Written by `memwarden run`, read with the profiles by the analysis.
//!
//! ```json
//! {
//!   "format_version": 1,
//!   "memwarden_version": "0.1.0",
//!   "command": ["make", "-j2"],
//!   "program": "/usr/bin/make",
//!   "started_unix_ms": 1763772000123,
//!   "root_pid": 4242,
//!   "complete": true,
//!   "exits": {"4242": {"code": 0}, "4250": {"signal": 9}}
//! }
//! ```
//! `exits` maps every pid the CLI reaped (its child and, as a subreaper, every orphaned
//! descendant) to its wait status. `complete` is false while the run is in progress, or if
//! the CLI itself was killed.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Exit};

/// File name of the run record inside the output folder.
pub const RUN_RECORD_FILE: &str = "run.json";
/// Version of the `run.json` format.
pub const RUN_RECORD_VERSION: u32 = 1;

/// The contents of `run.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// [`RUN_RECORD_VERSION`].
    pub format_version: u32,
    /// Version of the memwarden that ran the command.
    pub memwarden_version: String,
    /// The command as given (lossy UTF-8).
    pub command: Vec<String>,
    /// The executable the command resolved to.
    pub program: Option<String>,
    /// Wall-clock time the run started, ms since the Unix epoch.
    pub started_unix_ms: u64,
    /// Pid of the direct child, once started.
    pub root_pid: Option<u32>,
    /// Whether every process was reaped and the record is final.
    pub complete: bool,
    /// Reaped pid → how it ended.
    pub exits: BTreeMap<u32, Exit>,
}

impl RunRecord {
    /// A record for a run of `command` that has not started yet.
    pub fn new(command: Vec<String>, program: Option<String>, started_unix_ms: u64) -> Self {
        RunRecord {
            format_version: RUN_RECORD_VERSION,
            memwarden_version: env!("CARGO_PKG_VERSION").to_owned(),
            command,
            program,
            started_unix_ms,
            root_pid: None,
            complete: false,
            exits: BTreeMap::new(),
        }
    }

    /// The root process's end, if it was reaped.
    pub fn root_exit(&self) -> Option<Exit> {
        self.exits.get(&self.root_pid?).copied()
    }

    /// Reads and checks `path`.
    pub fn read(path: &Path) -> Result<RunRecord, Error> {
        let bad = |reason: String| Error::RunRecord {
            path: path.to_owned(),
            reason,
        };
        let text = fs::read_to_string(path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let record: RunRecord =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a valid run record: {e}")))?;
        if record.format_version != RUN_RECORD_VERSION {
            return Err(bad(format!(
                "run record format version {}, this memwarden reads version {RUN_RECORD_VERSION}",
                record.format_version
            )));
        }
        Ok(record)
    }

    /// Writes the record to `path`, replacing any earlier one atomically.
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        let io_error = |source| Error::Io {
            path: path.to_owned(),
            action: "write",
            source,
        };
        let mut text = serde_json::to_string_pretty(self).map_err(|e| io_error(e.into()))?;
        text.push('\n');
        let partial = path.with_extension("json.partial");
        fs::write(&partial, text).map_err(io_error)?;
        fs::rename(&partial, path).map_err(io_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_a_file_with_pid_keys() {
        let dir = std::env::temp_dir().join(format!("mw-run-record-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(RUN_RECORD_FILE);
        let mut record = RunRecord::new(vec!["ls".into(), "-l".into()], None, 1234);
        record.root_pid = Some(42);
        record.exits.insert(42, Exit::Code(2));
        record.exits.insert(43, Exit::Signal(9));
        record.write(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#""42": {"#), "{text}");
        let back = RunRecord::read(&path).unwrap();
        assert_eq!(back, record);
        assert_eq!(back.root_exit(), Some(Exit::Code(2)));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_other_versions_and_garbage_in_one_line() {
        let dir = std::env::temp_dir().join(format!("mw-run-record-bad-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(RUN_RECORD_FILE);
        let mut record = RunRecord::new(vec![], None, 0);
        record.format_version = 7;
        record.write(&path).unwrap();
        let err = RunRecord::read(&path).unwrap_err().to_string();
        assert!(err.ends_with("run record format version 7, this memwarden reads version 1"));
        fs::write(&path, "{").unwrap();
        let err = RunRecord::read(&path).unwrap_err().to_string();
        assert!(err.contains("not a valid run record"), "{err}");
        assert!(!err.contains('\n'));
        fs::remove_dir_all(&dir).unwrap();
    }
}
