//! Report stage, fault injection: the allocation failures `--fail` rules injected into a
//! process and the crash the preload caught, each with its symbolized stack.

use memwarden_abi::{failed_function, FailureRecord, UNKNOWN_STACK_ID};
use serde::{Deserialize, Serialize};

use super::frame_table::FrameTable;
use super::frames::{shown_crash_frames, shown_frames};
use super::site::site_hex;

/// One allocation that a `--fail` rule made fail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailureReport {
    /// 1 for the process's first injected failure, 2 for the second…
    pub seq: u64,
    /// The call's number among the calls its rule considered (1-based).
    pub call: u64,
    /// The function that failed: `malloc`, `calloc`, …, `operator new`, `mmap`.
    pub function: String,
    /// Requested bytes (for mmap: the length).
    pub size: u64,
    /// The `--fail` rule that fired: 1 for the first on the command line.
    pub rule: u32,
    /// ms after the process started.
    pub time_ms: f64,
    /// The calling stack's id in the profile (0: not stored).
    pub stack_id: u32,
    /// The calling stack's call-site key, as `--fail site=` takes it; null if unknown.
    pub site: Option<String>,
    /// The calling stack, innermost first, shown like the stacks' frames: indices into the
    /// process's `frames`.
    pub frames: Vec<u32>,
    /// The process it happened in.
    pub pid: u32,
}

/// The fatal signal a process received and where, as the preload caught it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashReport {
    /// The signal number.
    pub signal: u32,
    /// Innermost first, the first the faulting instruction: indices into the process's
    /// `frames`.
    pub frames: Vec<u32>,
}

/// The process's stored failures, in order.
pub(crate) fn failures(table: &mut FrameTable) -> Vec<FailureReport> {
    let profile = table.profile();
    profile.failures.iter().map(|f| failure(f, table)).collect()
}

fn failure(f: &FailureRecord, table: &mut FrameTable) -> FailureReport {
    let profile = table.profile();
    let stack = profile.stack(f.stack).filter(|s| s.id != UNKNOWN_STACK_ID);
    let (site, frames) = match stack {
        Some(stack) => (
            Some(site_hex(profile, &stack.frames)),
            shown_frames(table, &stack.frames),
        ),
        None => (None, vec![table.unknown_stack()]),
    };
    FailureReport {
        seq: f.seq,
        call: f.call,
        function: failed_function::name(f.function).to_owned(),
        size: f.size,
        rule: f.rule.saturating_add(1),
        time_ms: super::json::ms(f.time_ns),
        stack_id: f.stack,
        site,
        frames,
        pid: profile.pid,
    }
}

/// The crash, if the preload caught one.
pub(crate) fn crash(table: &mut FrameTable) -> Option<CrashReport> {
    let crash = table.profile().crash.as_ref()?;
    Some(CrashReport {
        signal: crash.signal,
        frames: shown_crash_frames(table, &crash.frames),
    })
}
