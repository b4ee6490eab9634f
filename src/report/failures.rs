//! Report stage, fault injection: the allocation failures `--fail` rules injected into a
//! process and the crash the preload caught, each with its symbolized stack.

use memwarden_abi::{failed_function, FailureRecord, UNKNOWN_STACK_ID};
use serde::{Deserialize, Serialize};

use super::frames::{shown_crash_frames, shown_frames};
use super::json::{unknown_stack_frames, FrameReport};
use super::site::site_hex;
use crate::profile::Profile;
use crate::symbolize::Symbolizer;

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
    /// The calling stack, innermost first, shown like the stacks' frames.
    pub frames: Vec<FrameReport>,
    /// The process it happened in.
    pub pid: u32,
}

/// The fatal signal a process received and where, as the preload caught it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashReport {
    /// The signal number.
    pub signal: u32,
    /// Innermost first; the first is the faulting instruction.
    pub frames: Vec<FrameReport>,
}

/// The process's stored failures, in order.
pub(crate) fn failures(profile: &Profile, symbolizer: &mut Symbolizer) -> Vec<FailureReport> {
    profile
        .failures
        .iter()
        .map(|f| failure(profile, f, symbolizer))
        .collect()
}

fn failure(profile: &Profile, f: &FailureRecord, symbolizer: &mut Symbolizer) -> FailureReport {
    let stack = profile.stack(f.stack).filter(|s| s.id != UNKNOWN_STACK_ID);
    let (site, frames) = match stack {
        Some(stack) => (
            Some(site_hex(profile, &stack.frames)),
            shown_frames(profile, &stack.frames, symbolizer),
        ),
        None => (None, unknown_stack_frames()),
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
pub(crate) fn crash(profile: &Profile, symbolizer: &mut Symbolizer) -> Option<CrashReport> {
    let crash = profile.crash.as_ref()?;
    Some(CrashReport {
        signal: crash.signal,
        frames: shown_crash_frames(profile, &crash.frames, symbolizer),
    })
}
