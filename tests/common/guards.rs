//! The heap-guard part of `report.json` as the tests read it (report format 3): each
//! process's guard mode and heap errors, and the checks the guard tests make on them.

use serde::Deserialize;
use std::path::Path;

use super::failures::{program_function, FaultFrame};
use super::report::basename;
use super::{profile_with, Profiled, RunOptions, Scratch, PROGRAM_PREFIX};

#[derive(Debug, Deserialize)]
pub struct GuardReport {
    pub format_version: u64,
    pub processes: Vec<GuardProcess>,
}

#[derive(Debug, Deserialize)]
pub struct GuardProcess {
    pub pid: u32,
    pub argv: Vec<String>,
    pub guard_mode: String,
    pub error_count: u64,
    pub errors: Vec<HeapError>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct HeapError {
    pub kind: String,
    pub address: String,
    pub block_size: u64,
    pub offset: i64,
    pub stack: Option<Vec<FaultFrame>>,
    pub alloc_stack: Option<Vec<FaultFrame>>,
    pub free_stack: Option<Vec<FaultFrame>>,
    pub time_ms: f64,
    pub pid: u32,
}

/// What a test expects of one of an error's stacks.
#[derive(Clone, Copy, Debug)]
pub enum At<'a> {
    /// Known, and its innermost function of the test program is this one.
    Function(&'a str),
    /// Null in the report.
    Unknown,
    /// Not checked (the contract leaves it open).
    Unchecked,
}

/// The one error a test program with one planted bug must produce.
#[derive(Clone, Copy, Debug)]
pub struct Expected<'a> {
    pub kind: &'a str,
    pub block_size: u64,
    pub offset: i64,
    pub stack: At<'a>,
    pub alloc_stack: At<'a>,
    pub free_stack: At<'a>,
}

impl<'a> Expected<'a> {
    /// A double free of a `block_size`-byte block made in `alloc`, freed first in `first`
    /// and again in `again`.
    pub fn double_free(block_size: u64, alloc: &'a str, first: &'a str, again: &'a str) -> Self {
        Expected {
            kind: "double-free",
            block_size,
            offset: 0,
            stack: At::Function(again),
            alloc_stack: At::Function(alloc),
            free_stack: At::Function(first),
        }
    }

    /// A free, in `function`, of an address that is no block the guard knows.
    pub fn invalid_free(function: &'a str) -> Self {
        Expected {
            kind: "invalid-free",
            block_size: 0,
            offset: 0,
            stack: At::Function(function),
            alloc_stack: At::Unknown,
            free_stack: At::Unknown,
        }
    }
}

impl At<'_> {
    fn matches(&self, frames: &Option<Vec<FaultFrame>>) -> bool {
        match (self, frames) {
            (At::Unchecked, _) => true,
            (At::Unknown, frames) => frames.is_none(),
            (At::Function(f), Some(frames)) => program_function(frames) == Some(*f),
            (At::Function(_), None) => false,
        }
    }
}

impl HeapError {
    /// The innermost test-program function of each stack, for failure messages.
    pub fn functions(&self) -> [Option<&str>; 3] {
        fn of(s: &Option<Vec<FaultFrame>>) -> Option<&str> {
            s.as_deref().and_then(program_function)
        }
        [of(&self.stack), of(&self.alloc_stack), of(&self.free_stack)]
    }

    /// Whether the error is what `e` says.
    pub fn is(&self, e: &Expected) -> bool {
        self.kind == e.kind
            && self.block_size == e.block_size
            && self.offset == e.offset
            && e.stack.matches(&self.stack)
            && e.alloc_stack.matches(&self.alloc_stack)
            && e.free_stack.matches(&self.free_stack)
    }
}

impl GuardReport {
    pub fn load(dir: &Path) -> GuardReport {
        super::report::load_report_json(&dir.join("report.json"))
    }

    /// The one process whose argv[0] names a program the test compiled.
    pub fn program_process(&self) -> &GuardProcess {
        let found: Vec<&GuardProcess> = self
            .processes
            .iter()
            .filter(|p| {
                p.argv
                    .first()
                    .is_some_and(|a| basename(a).starts_with(PROGRAM_PREFIX))
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "expected one test-program process: {self:#?}"
        );
        found[0]
    }
}

/// A finished `memwarden run` with guard options, and the guard part of its report.
pub struct GuardRun {
    pub run: Profiled,
    pub report: GuardReport,
}

/// `memwarden run -o <fresh> OPTIONS -- argv`.
pub fn run_guarded(scratch: &Scratch, options: &[&str], argv: &[&str]) -> GuardRun {
    let run = profile_with(
        scratch,
        argv,
        &RunOptions {
            options,
            ..RunOptions::default()
        },
    );
    let report = GuardReport::load(&run.dir);
    GuardRun { run, report }
}

impl GuardRun {
    pub fn stderr(&self) -> String {
        self.run.outcome.stderr_text()
    }

    pub fn stdout(&self) -> String {
        self.run.outcome.stdout_text()
    }

    /// The run's exit status as a shell sees it (128 + N for signal N).
    pub fn status(&self) -> i32 {
        use std::os::unix::process::ExitStatusExt;
        let status = self.run.outcome.status;
        status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(-1)
    }

    /// The program was stopped by SIGSEGV before it printed anything (`what` says why it
    /// must have been).
    pub fn assert_stopped_by_sigsegv(&self, what: &str) {
        assert_eq!(
            (self.status(), self.stdout()),
            (128 + 11, String::new()),
            "{what}; stderr:\n{}",
            self.stderr()
        );
    }

    /// The test program's process found exactly the one error `e`, in guard mode `mode`.
    pub fn assert_one_error(&self, mode: &str, e: &Expected) {
        let p = self.report.program_process();
        let context = || {
            let summary: Vec<String> = p
                .errors
                .iter()
                .map(|x| {
                    format!(
                        "{} size {} offset {} at {:?}",
                        x.kind,
                        x.block_size,
                        x.offset,
                        x.functions()
                    )
                })
                .collect();
            format!(
                "expected {e:?}\ngot error_count {} in mode {}: {summary:#?}\nstderr:\n{}",
                p.error_count,
                p.guard_mode,
                self.stderr()
            )
        };
        assert_eq!(p.guard_mode, mode, "{}", context());
        assert_eq!((p.error_count, p.errors.len()), (1, 1), "{}", context());
        let error = &p.errors[0];
        assert!(error.is(e), "{}", context());
        assert_eq!(error.pid, p.pid, "{}", context());
        assert!(error.address.starts_with("0x"), "{}", context());
    }

    /// No process of the run found a heap error, and each ran in guard mode `mode`.
    pub fn assert_no_error(&self, mode: &str) {
        for p in &self.report.processes {
            assert_eq!(
                (p.guard_mode.as_str(), p.error_count),
                (mode, 0),
                "pid {} {:?}: {:#?}\nstderr:\n{}",
                p.pid,
                p.argv,
                p.errors,
                self.stderr()
            );
        }
    }
}
