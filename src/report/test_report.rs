//! Report models built by hand for the renderers' tests.

use super::json::{Contention, FrameKind, FrameReport, ProcessReport, StackReport};
use crate::analysis::Totals;
use crate::python::{Category, NumpyFigures};

/// A process with no stacks and zero figures.
pub(crate) fn process_report(pid: u32, argv: &[&str]) -> ProcessReport {
    ProcessReport {
        pid,
        ppid: 1,
        argv: argv.iter().map(|a| a.to_string()).collect(),
        argv_truncated: false,
        exit: None,
        exit_source: None,
        replaced_by_exec: false,
        forked: false,
        own_malloc: false,
        stacks_full: false,
        modules_full: false,
        degraded: None,
        untracked_allocations: 0,
        start_time_ms: 0.0,
        duration_ms: None,
        peak_bytes: 0,
        peak_blocks: 0,
        peak_time_ms: 0.0,
        totals: Totals::default(),
        not_freed_bytes: 0,
        not_freed_blocks: 0,
        contention: Contention {
            lock_waits: 0,
            heap_cas_retries: 0,
        },
        injected_failures: Vec::new(),
        injected_failure_count: 0,
        crash: None,
        guard_mode: "none".to_owned(),
        errors: Vec::new(),
        error_count: 0,
        python_version: None,
        numpy: NumpyFigures::default(),
        leak_check: None,
        leaks: Vec::new(),
        leak_summary: None,
        frames: Vec::new(),
        stacks: Vec::new(),
        pruned: None,
    }
}

/// The index of `frame` in `p`'s frame table, entered if it is not there yet.
pub(crate) fn intern(p: &mut ProcessReport, frame: FrameReport) -> u32 {
    match p.frames.iter().position(|f| *f == frame) {
        Some(index) => index as u32,
        None => {
            p.frames.push(frame);
            p.frames.len() as u32 - 1
        }
    }
}

/// The indices of `frames` in `p`'s frame table.
pub(crate) fn intern_all(p: &mut ProcessReport, frames: Vec<FrameReport>) -> Vec<u32> {
    frames.into_iter().map(|f| intern(p, f)).collect()
}

/// A frame with only a function name.
pub(crate) fn function_frame(function: &str) -> FrameReport {
    FrameReport {
        function: Some(function.to_owned()),
        file: None,
        line: None,
        module: None,
        address: Some("0x1000".to_owned()),
        inlined: false,
        kind: FrameKind::Native,
    }
}

/// A Python frame: `file:line (function)`.
pub(crate) fn python_frame(file: &str, line: u32, function: &str) -> FrameReport {
    FrameReport {
        function: Some(function.to_owned()),
        file: Some(file.to_owned()),
        line: Some(line),
        module: None,
        address: None,
        inlined: false,
        kind: FrameKind::Python,
    }
}

/// A stack of `p` of named functions (innermost first, entered in `p`'s frame table) with
/// these bytes at the peak, live at exit and allocated; one block per 8 bytes.
pub(crate) fn stack_report(
    p: &mut ProcessReport,
    id: u32,
    functions: &[&str],
    at_peak: u64,
    live: u64,
    allocated: u64,
) -> StackReport {
    StackReport {
        id,
        site: Some(format!("{id:016x}")),
        category: Category::Native,
        frames: functions
            .iter()
            .map(|f| intern(p, function_frame(f)))
            .collect(),
        at_peak_bytes: at_peak,
        at_peak_blocks: at_peak / 8,
        live_bytes: live,
        live_blocks: live / 8,
        max_live_bytes: at_peak.max(live),
        allocated_bytes: allocated,
        allocations: allocated / 8,
        frees: (allocated - live) / 8,
        merged_stacks: 1,
    }
}
