//! The report model, built from the analysis and the symbols: its serialization is the
//! `report.json` contract (docs/report-format.md); the other renderers read it too.

use std::sync::{Mutex, PoisonError};

use memwarden_abi::{degraded_reason, flags, UNKNOWN_STACK_ID};
use serde::{Deserialize, Serialize};

use super::errors::ErrorReport;
use super::failures::{CrashReport, FailureReport};
use super::frame_table::FrameTable;
use super::leaks::{LeakCheckReport, LeakReport, LeakSummary};
use super::prune::Pruned;
use super::warm::{Ahead, ProcessAhead, Shown};
use super::{errors, failures, frames, site};
use crate::analysis::{ExitSource, Process, StackFigures, Totals};
use crate::parallel::{map_in_order, spawn_or_run};
use crate::profile::python_version_text;
use crate::python::{Category, NumpyFigures};
pub use crate::symbolize::FrameKind;
use crate::symbolize::Symbolizer;
use crate::Exit;

/// Version of the `report.json` format.
pub const REPORT_FORMAT_VERSION: u32 = 8;

/// Function name given to the single frame of the reserved unknown stack.
pub const UNKNOWN_STACK_LABEL: &str = "[unknown stack]";

/// The whole report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// [`REPORT_FORMAT_VERSION`].
    pub format_version: u32,
    /// The command that was run.
    pub command: Vec<String>,
    /// Every process image, by start time.
    pub processes: Vec<ProcessReport>,
}

/// One process image.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessReport {
    /// Process id.
    pub pid: u32,
    /// Parent process id when tracking started.
    pub ppid: u32,
    /// Its command line.
    pub argv: Vec<String>,
    /// The command line was cut.
    pub argv_truncated: bool,
    /// `{"code": N}`, `{"signal": N}`, or null when unknown.
    pub exit: Option<Exit>,
    /// `"reaped"` (by the CLI), `"recorded"` (by the process), or null.
    pub exit_source: Option<ExitSource>,
    /// The image called exec; `exit` is the final image's.
    pub replaced_by_exec: bool,
    /// Created by fork, starting with its parent's live heap.
    pub forked: bool,
    /// The program defines its own malloc, which bypasses memwarden.
    pub own_malloc: bool,
    /// The stack table filled up; later new stacks count under the unknown stack.
    pub stacks_full: bool,
    /// The module table filled up; later modules cannot be symbolized.
    pub modules_full: bool,
    /// Why tracking stopped early, or null.
    pub degraded: Option<String>,
    /// Allocations made while tracking was off.
    pub untracked_allocations: u64,
    /// ms after the earliest process started.
    pub start_time_ms: f64,
    /// ms the process ran, when it recorded its end.
    pub duration_ms: Option<f64>,
    /// Live heap bytes at the peak.
    pub peak_bytes: u64,
    /// Live blocks at the peak.
    pub peak_blocks: u64,
    /// ms after process start when the peak was reached.
    pub peak_time_ms: f64,
    /// Sums over the stacks.
    pub totals: Totals,
    /// Bytes live at exit.
    pub not_freed_bytes: u64,
    /// Blocks live at exit.
    pub not_freed_blocks: u64,
    /// How often the preload's writers got in each other's way.
    pub contention: Contention,
    /// Allocation failures injected by `--fail` rules (all, or as many as were stored).
    pub injected_failures: Vec<FailureReport>,
    /// Allocation failures injected, stored or not.
    pub injected_failure_count: u64,
    /// The fatal signal the preload caught (only with `--fail`), or null.
    pub crash: Option<CrashReport>,
    /// The guard mode in force: `none`, `header`, `page` or `sampled`.
    pub guard_mode: String,
    /// Heap errors found by guards (all, or as many as were stored).
    pub errors: Vec<ErrorReport>,
    /// Heap errors found, stored or not.
    pub error_count: u64,
    /// The Python runtime found in the process (`3.11.7`), or null.
    #[serde(default)]
    pub python_version: Option<String>,
    /// NumPy array data: sums over the stacks of category `numpy`.
    #[serde(default)]
    pub numpy: NumpyFigures,
    /// The leak check at exit (`--leak-check`), or null when none was asked for.
    #[serde(default)]
    pub leak_check: Option<LeakCheckReport>,
    /// Its findings per (allocation stack, kind), largest first.
    #[serde(default)]
    pub leaks: Vec<LeakReport>,
    /// Bytes and blocks per kind, or null without a leak check.
    #[serde(default)]
    pub leak_summary: Option<LeakSummary>,
    /// The distinct frames of the process's stacks, failures, crash, errors and leaks, each
    /// once; those refer to them by index.
    pub frames: Vec<FrameReport>,
    /// Stacks, by bytes at the peak, then bytes allocated.
    pub stacks: Vec<StackReport>,
    /// How the small stacks of a process with very many were merged, or null when every
    /// stack is listed.
    #[serde(default)]
    pub pruned: Option<Pruned>,
}

/// The preload's contention counters.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Contention {
    /// Waits on a locked stack record or address-map shard.
    pub lock_waits: u64,
    /// Lost races of the heap compare-and-swap.
    pub heap_cas_retries: u64,
}

/// One call stack.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StackReport {
    /// Stack id in its profile (0: the unknown stack).
    pub id: u32,
    /// The call-site key (16 hex digits), as `--fail site=` takes it; null for stack 0.
    pub site: Option<String>,
    /// What its blocks are: `numpy` array data, `python` interpreter objects, `native`.
    #[serde(default)]
    pub category: Category,
    /// Indices into the process's `frames`, innermost first, one per inline level.
    pub frames: Vec<u32>,
    /// Bytes live at the process's peak.
    pub at_peak_bytes: u64,
    /// Blocks live at the process's peak.
    pub at_peak_blocks: u64,
    /// Bytes live at exit.
    pub live_bytes: u64,
    /// Blocks live at exit.
    pub live_blocks: u64,
    /// Highest live bytes this stack ever had.
    pub max_live_bytes: u64,
    /// Bytes ever allocated.
    pub allocated_bytes: u64,
    /// Allocations ever made.
    pub allocations: u64,
    /// Blocks freed.
    pub frees: u64,
    /// How many of the profile's stacks this entry stands for: 1, or more for an entry
    /// merging small stacks of a process with very many (`prune`), whose first frame is
    /// then `[smaller stacks]` and whose figures are their sums.
    #[serde(default = "one")]
    pub merged_stacks: u64,
}

fn one() -> u64 {
    1
}

/// One frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FrameReport {
    /// Demangled function name; for a Python frame, the code's qualified name.
    pub function: Option<String>,
    /// Source file; for a Python frame, the code's file name as Python knew it.
    pub file: Option<String>,
    /// Source line; for a Python frame, the line executing.
    pub line: Option<u32>,
    /// Path of the module (`[vdso]` for the vDSO); null for a Python frame.
    pub module: Option<String>,
    /// The return address as recorded, `0x…`; null for a Python frame.
    pub address: Option<String>,
    /// Inlined into the next frame.
    pub inlined: bool,
    /// `native`, `python`, `arena` or `elided`.
    #[serde(default)]
    pub kind: FrameKind,
}

impl ProcessReport {
    /// The frames of the process's table that `indices` name, in order (an index past the
    /// table's end, which memwarden never writes, is skipped).
    pub fn frames_of<'a>(&'a self, indices: &'a [u32]) -> impl Iterator<Item = &'a FrameReport> {
        indices
            .iter()
            .filter_map(|&index| self.frames.get(index as usize))
    }

    /// [`ProcessReport::frames_of`], collected.
    pub fn resolve<'a>(&'a self, indices: &'a [u32]) -> Vec<&'a FrameReport> {
        self.frames_of(indices).collect()
    }
}

/// The label of a Python frame whose code is unknown (not yet published when the run ended).
pub const UNKNOWN_PYTHON_FRAME_LABEL: &str = "[unknown Python frame]";

impl FrameReport {
    /// `function (file:line)`, `function [module]`, or `0x… [module]`, with file and
    /// module shown by their file names; a Python frame reads `file:line (function)`.
    pub fn label(&self) -> String {
        match self.kind {
            FrameKind::Python => return self.python_label(),
            FrameKind::Arena | FrameKind::Elided => {
                return self.function.clone().unwrap_or_default()
            }
            FrameKind::Native => {}
        }
        let file = self.file.as_deref().map(file_name);
        let module = self.module.as_deref().map(file_name);
        let head = match (&self.function, &self.address) {
            (Some(function), _) => function.clone(),
            (None, Some(address)) => address.clone(),
            (None, None) => "?".to_owned(),
        };
        match (file, self.line, module) {
            (Some(file), Some(line), _) if self.function.is_some() => {
                format!("{head} ({file}:{line})")
            }
            (Some(file), None, _) if self.function.is_some() => format!("{head} ({file})"),
            (_, _, Some(module)) => format!("{head} [{module}]"),
            _ => head,
        }
    }
}

impl FrameReport {
    /// `script.py:5 (make)`, `script.py (make)` without a line.
    fn python_label(&self) -> String {
        let file = self.file.as_deref().map(file_name);
        let function = self.function.as_deref().unwrap_or("?");
        match (file, self.line) {
            (Some(file), Some(line)) => format!("{file}:{line} ({function})"),
            (Some(file), None) => format!("{file} ({function})"),
            (None, _) => UNKNOWN_PYTHON_FRAME_LABEL.to_owned(),
        }
    }
}

/// The last component of a path.
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Builds the report of analysed `processes` of a run of `command`, taking up what the
/// look-ahead made of their stacks (`ahead`; `Ahead::default()` for nothing).
pub fn build(
    command: Vec<String>,
    processes: &[Process],
    symbolizer: &mut Symbolizer,
    mut ahead: Ahead,
) -> Report {
    // Lent to the processes' tables, built at the same time, and given back.
    let shared = Mutex::new(std::mem::take(symbolizer));
    let processes: Vec<(&Process, Mutex<Option<ProcessAhead>>)> = processes
        .iter()
        .map(|p| (p, Mutex::new(ahead.take(p.profile))))
        .collect();
    let processes = map_in_order(&processes, |(p, made)| {
        let made = made.lock().unwrap_or_else(PoisonError::into_inner).take();
        process(p, &shared, made)
    });
    *symbolizer = shared.into_inner().unwrap_or_else(PoisonError::into_inner);
    Report {
        format_version: REPORT_FORMAT_VERSION,
        command,
        processes,
    }
}

/// ns as ms, with µs precision.
pub(crate) fn ms(ns: u64) -> f64 {
    (ns / 1_000) as f64 / 1_000.0
}

fn process(
    p: &Process,
    symbolizer: &Mutex<Symbolizer>,
    made: Option<ProcessAhead>,
) -> ProcessReport {
    let profile = p.profile;
    // Stacks first: the table lists frames in the order the stacks (by peak) first use them.
    let (mut table, shown_ahead) = match made {
        Some(made) => (
            FrameTable::taking_up(profile, symbolizer, made.pool, made.same),
            made.shown,
        ),
        None => (FrameTable::new(profile, symbolizer), Shown::default()),
    };
    let stacks: Vec<StackReport> = std::thread::scope(|scope| {
        // The site keys hash every frame byte by byte (about 90 ms for 77,000 stacks of 40
        // frames): those the look-ahead did not find are done on another core while the
        // frames are shown.
        let sites = spawn_or_run(scope, || site::site_keys(profile, &p.stacks, &shown_ahead));
        let stacks: Vec<StackReport> = p
            .stacks
            .iter()
            .map(|s| stack(s, &mut table, shown_ahead.of(s.id)))
            .collect();
        stacks
            .into_iter()
            .zip(sites.join())
            .map(|(stack, site)| StackReport { site, ..stack })
            .collect()
    });
    let injected_failures = failures::failures(&mut table);
    let crash = failures::crash(&mut table);
    let errors = errors::errors(&mut table);
    let (leak_check, leaks, leak_summary) = super::leaks::leaks(&mut table);
    ProcessReport {
        pid: profile.pid,
        ppid: profile.ppid,
        argv: profile.argv.clone(),
        argv_truncated: profile.has_flag(flags::ARGV_TRUNCATED),
        exit: p.exit,
        exit_source: p.exit_source,
        replaced_by_exec: p.replaced_by_exec,
        forked: profile.forked(),
        own_malloc: profile.has_flag(flags::OWN_MALLOC),
        stacks_full: profile.has_flag(flags::STACKS_FULL),
        modules_full: profile.has_flag(flags::MODULES_FULL),
        degraded: degraded(profile.degraded_reason, profile.has_flag(flags::DEGRADED)),
        untracked_allocations: profile.untracked_allocations,
        start_time_ms: ms(p.start_offset_ns),
        duration_ms: (profile.end_time_ns != 0).then(|| ms(profile.end_time_ns)),
        peak_bytes: p.peak.bytes,
        peak_blocks: p.peak.blocks,
        peak_time_ms: ms(p.peak.time_ns),
        totals: p.totals,
        not_freed_bytes: p.not_freed_bytes,
        not_freed_blocks: p.not_freed_blocks,
        contention: Contention {
            lock_waits: profile.lock_waits,
            heap_cas_retries: profile.heap_cas_retries,
        },
        injected_failures,
        injected_failure_count: profile.failure_count,
        crash,
        guard_mode: crate::profile::guard_mode_name(profile.guard_mode).to_owned(),
        errors,
        error_count: profile.error_count,
        python_version: python_version_text(profile.python_version),
        numpy: p.numpy,
        leak_check,
        leaks,
        leak_summary,
        frames: table.into_frames(),
        stacks,
        pruned: None,
    }
}

/// The stable name of a degraded reason, or null when tracking did not stop.
fn degraded(reason: u32, flagged: bool) -> Option<String> {
    let name = match reason {
        degraded_reason::NONE if !flagged => return None,
        degraded_reason::NONE => "unknown".to_owned(),
        degraded_reason::FILE_GROW_FAILED => "file_grow_failed".to_owned(),
        degraded_reason::ADDRESS_MAP_FULL => "address_map_full".to_owned(),
        degraded_reason::COUNTER_OVERFLOW => "counter_overflow".to_owned(),
        degraded_reason::OWN_MEMORY_EXHAUSTED => "own_memory_exhausted".to_owned(),
        other => format!("reason_{other}"),
    };
    Some(name)
}

/// The single frame shown for the reserved unknown stack.
pub(crate) fn unknown_stack_frame() -> FrameReport {
    FrameReport {
        function: Some(UNKNOWN_STACK_LABEL.to_owned()),
        file: None,
        line: None,
        module: None,
        address: None,
        inlined: false,
        kind: FrameKind::Native,
    }
}

/// The report of stack `s`, its `site` left for [`site::site_keys`]; `ahead`, its pool
/// frames if the look-ahead picked them.
fn stack(s: &StackFigures, table: &mut FrameTable, ahead: Option<&[u32]>) -> StackReport {
    let frames = if s.id == UNKNOWN_STACK_ID {
        vec![table.unknown_stack()]
    } else if let Some(pool_frames) = ahead {
        table.show(pool_frames)
    } else {
        frames::shown_frames(table, &s.stack.frames)
    };
    StackReport {
        id: s.id,
        site: None,
        category: s.category,
        frames,
        at_peak_bytes: s.at_peak_bytes,
        at_peak_blocks: s.at_peak_blocks,
        live_bytes: s.live_bytes,
        live_blocks: s.live_blocks,
        max_live_bytes: s.max_live_bytes,
        allocated_bytes: s.allocated_bytes,
        allocations: s.allocations,
        frees: s.frees,
        merged_stacks: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(
        function: Option<&str>,
        file: Option<&str>,
        line: Option<u32>,
        module: Option<&str>,
    ) -> FrameReport {
        FrameReport {
            function: function.map(Into::into),
            file: file.map(Into::into),
            line,
            module: module.map(Into::into),
            address: Some("0x1234".into()),
            inlined: false,
            kind: FrameKind::Native,
        }
    }

    #[test]
    fn labels_prefer_source_then_module_then_address() {
        let full = frame(Some("main"), Some("/src/a.c"), Some(7), Some("a.out"));
        assert_eq!(full.label(), "main (a.c:7)");
        assert_eq!(
            frame(Some("f"), Some("/src/a.c"), None, None).label(),
            "f (a.c)"
        );
        assert_eq!(
            frame(Some("malloc"), None, None, Some("/lib/libc.so.6")).label(),
            "malloc [libc.so.6]"
        );
        assert_eq!(
            frame(None, None, None, Some("libc.so.6")).label(),
            "0x1234 [libc.so.6]"
        );
        assert_eq!(frame(None, None, None, None).label(), "0x1234");
    }

    #[test]
    fn degraded_reasons_have_stable_names() {
        assert_eq!(degraded(degraded_reason::NONE, false), None);
        assert_eq!(
            degraded(degraded_reason::NONE, true).as_deref(),
            Some("unknown")
        );
        assert_eq!(
            degraded(degraded_reason::FILE_GROW_FAILED, true).as_deref(),
            Some("file_grow_failed")
        );
        assert_eq!(degraded(99, false).as_deref(), Some("reason_99"));
    }
}
