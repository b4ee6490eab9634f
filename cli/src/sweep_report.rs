//! The sweep's reading of `report.json` (the files `memwarden run` writes): the allocation
//! call sites of the discovery run, and what one fault-injection run did — whether the
//! failure was injected, how the root process ended, which process crashed and where.
//! Only the fields the sweep needs are read; others are ignored.

use std::collections::HashSet;

use memwarden::report::json::{FrameReport, UNKNOWN_STACK_LABEL};
use memwarden::Exit;
use serde::Deserialize;

/// Signals that mean the program itself failed (the ones the preload records a crash
/// stack for), as opposed to a signal sent to it.
const CRASH_SIGNALS: [i32; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGABRT,
    libc::SIGTRAP,
];

/// A `report.json` the sweep cannot use.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Not JSON, or not shaped like a report.
    #[error("unreadable report.json: {0}")]
    Json(#[from] serde_json::Error),
    /// Allocating stacks exist but none has a call-site key.
    #[error("report.json has allocations but no call-site keys (`site`)")]
    NoSiteKeys,
}

/// One distinct allocation call site, as discovery found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// The stack's `site` key (hex), as `--fail site=` takes it.
    pub key: String,
    /// The stack's frames in the discovery run, innermost first.
    pub frames: Vec<FrameReport>,
}

/// What a fault-injection run's report says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunFacts {
    /// The first injected failure, if any was injected.
    pub injected: Option<Injected>,
    /// How the root process (the first in the report) ended, if known.
    pub root_exit: Option<Exit>,
    /// The process that crashed, if one did.
    pub crash: Option<Crash>,
}

/// An injected allocation failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Injected {
    /// The function that failed (`malloc`, `calloc`…), when the report names it.
    pub function: Option<String>,
    /// The failed call's stack, when the report gives it.
    pub frames: Option<Vec<FrameReport>>,
}

/// A process killed by a signal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crash {
    /// Its pid.
    pub pid: u32,
    /// The signal.
    pub signal: i32,
    /// Where it crashed, innermost first, when the preload recorded it.
    pub frames: Option<Vec<FrameReport>>,
}

#[derive(Deserialize)]
struct ReportDoc {
    processes: Vec<ProcessDoc>,
}

#[derive(Deserialize)]
struct ProcessDoc {
    pid: u32,
    exit: Option<Exit>,
    #[serde(default)]
    stacks: Vec<StackDoc>,
    #[serde(default)]
    injected_failures: Vec<FailureDoc>,
    #[serde(default)]
    crash: Option<CrashDoc>,
}

#[derive(Deserialize)]
struct StackDoc {
    id: u32,
    frames: Vec<FrameReport>,
    allocations: u64,
    #[serde(default)]
    site: Option<String>,
}

#[derive(Deserialize)]
struct FailureDoc {
    #[serde(default)]
    function: Option<String>,
    #[serde(default)]
    frames: Option<Vec<FrameReport>>,
}

#[derive(Deserialize)]
struct CrashDoc {
    #[serde(default)]
    signal: Option<i32>,
    #[serde(default)]
    frames: Option<Vec<FrameReport>>,
}

/// A report.json with every frame index (format 5) replaced by the frame it names.
fn parse(json: &str) -> Result<ReportDoc, ReportError> {
    let mut report: serde_json::Value = serde_json::from_str(json)?;
    memwarden::report::read::inline_frames(&mut report);
    Ok(serde_json::from_value(report)?)
}

/// The distinct call sites of a discovery report: every stack with allocations, in
/// process order then stack id, each key once (its first occurrence gives the frames).
pub fn discover_sites(json: &str) -> Result<Vec<Site>, ReportError> {
    let report = parse(json)?;
    let mut allocating = 0usize;
    let mut seen = HashSet::new();
    let mut sites = Vec::new();
    for process in report.processes {
        let mut stacks: Vec<StackDoc> = process
            .stacks
            .into_iter()
            .filter(|s| s.allocations > 0)
            .collect();
        allocating += stacks.len();
        stacks.sort_by_key(|s| s.id);
        for stack in stacks {
            let Some(key) = stack.site.filter(|k| !k.is_empty()) else {
                continue;
            };
            if seen.insert(key.clone()) {
                sites.push(Site {
                    key,
                    frames: stack.frames,
                });
            }
        }
    }
    if sites.is_empty() && allocating > 0 {
        return Err(ReportError::NoSiteKeys);
    }
    Ok(sites)
}

/// What the report of a fault-injection run says happened.
pub fn run_facts(json: &str) -> Result<RunFacts, ReportError> {
    let report = parse(json)?;
    let root_exit = report.processes.first().and_then(|p| p.exit);
    let crash = report
        .processes
        .iter()
        .enumerate()
        .find_map(|(index, p)| crash_of(p, index == 0));
    let first_failure = report
        .processes
        .iter()
        .flat_map(|p| &p.injected_failures)
        .next();
    let injected = first_failure.map(|f| Injected {
        function: f.function.clone(),
        frames: f.frames.clone().filter(|frames| !is_unknown_stack(frames)),
    });
    Ok(RunFacts {
        injected,
        root_exit,
        crash,
    })
}

/// An empty stack, or the placeholder of a stack that was not stored.
fn is_unknown_stack(frames: &[FrameReport]) -> bool {
    match frames {
        [] => true,
        [only] => only.function.as_deref() == Some(UNKNOWN_STACK_LABEL),
        _ => false,
    }
}

/// The process's crash: an exit by a crash signal (by any signal for the root, whose
/// status is the run's), or an unknown exit after the preload recorded a crash (a forked
/// child reaped by its own parent). A process that exited with a code survived whatever
/// it caught.
fn crash_of(process: &ProcessDoc, is_root: bool) -> Option<Crash> {
    let recorded = process.crash.as_ref();
    let recorded_signal = recorded.and_then(|c| c.signal).filter(|&s| s > 0);
    let signal = match process.exit {
        Some(Exit::Signal(signal)) if is_root || CRASH_SIGNALS.contains(&signal) => signal,
        None => recorded_signal?,
        _ => return None,
    };
    Some(Crash {
        pid: process.pid,
        signal,
        frames: recorded
            .and_then(|c| c.frames.clone())
            .filter(|f| !is_unknown_stack(f)),
    })
}

#[cfg(test)]
#[path = "sweep_report_tests.rs"]
mod tests;
