//! Report stage, leak part: the leak check's records turned into report entries — each
//! (stack, kind) with its bytes, blocks and symbolized frames, largest first — the summary
//! per kind, and the sanitizer-style text CI logs grep for.

use std::fmt::Write;

use memwarden_abi::{leak_kind, UNKNOWN_STACK_ID};
use memwarden_faults::Fnv1a;
use serde::{Deserialize, Serialize};

use super::frame_table::FrameTable;
use super::frames::shown_frames;
use super::json::{FrameReport, ProcessReport};
use crate::profile::leak_view_name;

/// Every leak kind, in the order reports list them.
pub const KINDS: [u32; 4] = [
    leak_kind::DEFINITE,
    leak_kind::INDIRECT,
    leak_kind::POSSIBLE,
    leak_kind::REACHABLE,
];

/// The kinds a gate counts unless told otherwise.
pub const DEFAULT_GATE_KINDS: [u32; 2] = [leak_kind::DEFINITE, leak_kind::INDIRECT];

/// The kind code of a name (`definite`, `indirect`, `possible`, `reachable`).
pub fn kind_code(name: &str) -> Option<u32> {
    KINDS.into_iter().find(|&k| leak_kind::name(k) == name)
}

/// How the leak check went in one process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LeakCheckReport {
    /// `done`; `skipped` (it could not run: a guard mode, no memory for it); `not_run` (the
    /// process ended without running exit handlers: `_exit`, a signal; or it still runs).
    pub status: String,
    /// `memcheck` or `lsan`.
    pub view: String,
    /// Bytes of memory read.
    pub scanned_bytes: u64,
    /// ms the check took.
    pub scan_ms: f64,
    /// Other threads stopped during the check.
    pub threads_stopped: u32,
    /// Threads that did not answer the stop signal.
    pub threads_missed: u32,
    /// Records found but not stored (the profile's room filled up).
    pub records_not_stored: u64,
}

/// One (allocation stack, kind) of a process's leak check.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LeakReport {
    /// `definite`, `indirect`, `possible` or `reachable`.
    pub kind: String,
    /// Requested bytes of its blocks.
    pub bytes: u64,
    /// Its blocks.
    pub blocks: u64,
    /// The id of the allocation stack (as in `stacks`).
    pub stack_id: u32,
    /// Its frames, innermost first, shown as every stack's are: indices into the process's
    /// `frames`.
    pub frames: Vec<u32>,
    /// A stable id from the kind and the symbolized frames (not addresses), for baselines.
    pub id: String,
    /// Whether a suppression or the baseline takes it out of the gate.
    #[serde(default)]
    pub suppressed: bool,
}

/// Bytes and blocks of one kind.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KindTotal {
    /// Requested bytes.
    pub bytes: u64,
    /// Blocks.
    pub blocks: u64,
}

/// Totals per kind.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LeakSummary {
    /// Nothing points to them.
    pub definite: KindTotal,
    /// Pointed to only from lost blocks.
    pub indirect: KindTotal,
    /// Reached only through interior pointers.
    pub possible: KindTotal,
    /// Reached from a root by start pointers.
    pub reachable: KindTotal,
}

impl LeakSummary {
    fn of(leaks: &[LeakReport]) -> LeakSummary {
        let mut summary = LeakSummary::default();
        for leak in leaks {
            let total = match leak.kind.as_str() {
                "definite" => &mut summary.definite,
                "indirect" => &mut summary.indirect,
                "possible" => &mut summary.possible,
                _ => &mut summary.reachable,
            };
            total.bytes = total.bytes.saturating_add(leak.bytes);
            total.blocks = total.blocks.saturating_add(leak.blocks);
        }
        summary
    }
}

/// The leak check's report for `profile`: `(check, leaks largest first, summary)`; all
/// empty when no check was asked for.
pub(crate) fn leaks(
    table: &mut FrameTable,
) -> (
    Option<LeakCheckReport>,
    Vec<LeakReport>,
    Option<LeakSummary>,
) {
    let profile = table.profile();
    let check = &profile.leaks;
    let status = match check.status {
        memwarden_abi::leak_status::DONE => "done",
        memwarden_abi::leak_status::SKIPPED => "skipped",
        memwarden_abi::leak_status::PENDING => "not_run",
        _ => return (None, Vec::new(), None),
    };
    let mut records = check.records.clone();
    records.sort_by_key(|r| (std::cmp::Reverse(r.bytes), r.kind, r.stack));
    let leaks: Vec<LeakReport> = records
        .iter()
        .map(|r| {
            let frames = match profile.stack(r.stack).filter(|s| s.id != UNKNOWN_STACK_ID) {
                Some(stack) => shown_frames(table, &stack.frames),
                None => vec![table.unknown_stack()],
            };
            let id = leak_id(
                leak_kind::name(r.kind),
                frames.iter().map(|&index| table.frame(index)),
            );
            LeakReport {
                kind: leak_kind::name(r.kind).to_owned(),
                bytes: r.bytes,
                blocks: r.blocks,
                stack_id: r.stack,
                id,
                frames,
                suppressed: false,
            }
        })
        .collect();
    let report = LeakCheckReport {
        status: status.to_owned(),
        view: leak_view_name(check.view).to_owned(),
        scanned_bytes: check.scanned_bytes,
        scan_ms: super::json::ms(check.scan_ns),
        threads_stopped: check.threads_stopped,
        threads_missed: check.threads_missed,
        records_not_stored: check
            .record_count
            .saturating_sub(check.records.len() as u64),
    };
    let summary = LeakSummary::of(&leaks);
    (Some(report), leaks, Some(summary))
}

/// The leaks of `p` the gate counts: of a counted kind and not suppressed.
pub fn counted<'a>(p: &'a ProcessReport, kinds: &'a [u32]) -> impl Iterator<Item = &'a LeakReport> {
    p.leaks
        .iter()
        .filter(move |l| !l.suppressed && kind_code(&l.kind).is_some_and(|k| kinds.contains(&k)))
}

/// The sanitizer-style text of `p`'s counted leaks: direct first, then indirect, then the
/// others, each largest first, then its `SUMMARY:` line. Empty without a leak check.
pub fn write_leaks(out: &mut String, p: &ProcessReport, kinds: &[u32]) {
    let Some(check) = &p.leak_check else {
        return;
    };
    match check.status.as_str() {
        "done" => {}
        "not_run" if p.replaced_by_exec => return,
        "not_run" => {
            let _ = writeln!(
                out,
                "memwarden: pid {}: no leak check: the process ended without exit handlers (_exit or a signal)",
                p.pid
            );
            return;
        }
        other => {
            let _ = writeln!(out, "memwarden: pid {}: leak check {other}", p.pid);
            return;
        }
    }
    let (mut bytes, mut blocks) = (0u64, 0u64);
    for kind in KINDS {
        for leak in counted(p, kinds).filter(|l| kind_code(&l.kind) == Some(kind)) {
            let title = match kind {
                leak_kind::DEFINITE => "Direct leak",
                leak_kind::INDIRECT => "Indirect leak",
                leak_kind::POSSIBLE => "Possible leak",
                _ => "Still reachable",
            };
            let _ = writeln!(
                out,
                "{title} of {} byte(s) in {} object(s) allocated from:",
                leak.bytes, leak.blocks
            );
            for (index, frame) in p.frames_of(&leak.frames).enumerate() {
                let _ = writeln!(out, "    #{index} {}", frame_text(frame));
            }
            let _ = writeln!(out);
            bytes = leak.bytes.saturating_add(bytes);
            blocks = leak.blocks.saturating_add(blocks);
        }
    }
    if bytes > 0 || blocks > 0 {
        let _ = writeln!(
            out,
            "SUMMARY: memwarden: {bytes} byte(s) leaked in {blocks} allocation(s)."
        );
    } else {
        let _ = writeln!(out, "{}", clean_line(p, kinds));
    }
    if check.threads_missed > 0 {
        // Their registers were not roots: a block only a register held would show as lost.
        let (threads, whose) = match check.threads_missed {
            1 => ("1 thread".to_owned(), "its"),
            n => (format!("{n} threads"), "their"),
        };
        let _ = writeln!(
            out,
            "memwarden: pid {}: leak check: {threads} could not be stopped; {whose} stack was scanned, not {whose} registers",
            p.pid
        );
    }
}

/// The line of a check that found no leak the gate counts, so that a clean run says it was
/// checked, with what the check found of the kinds not counted.
fn clean_line(p: &ProcessReport, kinds: &[u32]) -> String {
    let counted: Vec<&str> = KINDS
        .into_iter()
        .filter(|k| kinds.contains(k))
        .map(leak_kind::name)
        .collect();
    let kinds_text = match counted.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => "counted".to_owned(),
    };
    let mut line = format!(
        "memwarden: pid {}: leak check: no {kinds_text} leaks",
        p.pid
    );
    let suppressed = p
        .leaks
        .iter()
        .filter(|l| l.suppressed && kind_code(&l.kind).is_some_and(|k| kinds.contains(&k)))
        .count();
    if suppressed > 0 {
        let _ = write!(
            line,
            " ({} suppressed or in the baseline)",
            super::text::how_many(suppressed as u64, "leak")
        );
    }
    let summary = p.leak_summary.unwrap_or_default();
    let others: Vec<String> = [
        (leak_kind::POSSIBLE, "possibly lost", summary.possible),
        (leak_kind::REACHABLE, "still reachable", summary.reachable),
    ]
    .into_iter()
    .filter(|(kind, _, total)| !kinds.contains(kind) && total.blocks > 0)
    .map(|(_, words, total)| {
        format!(
            "{} {words} in {}",
            super::text::bytes(total.bytes),
            super::text::how_many(total.blocks, "block")
        )
    })
    .collect();
    if !others.is_empty() {
        let _ = write!(line, "; not counted: {}", others.join(", "));
    }
    line
}

fn frame_text(frame: &FrameReport) -> String {
    let function = frame.function.as_deref().unwrap_or("??");
    let place = match (&frame.file, frame.line, &frame.module) {
        (Some(file), Some(line), _) => format!("{file}:{line}"),
        (Some(file), None, _) => file.clone(),
        (None, _, Some(module)) => format!("({module})"),
        _ => String::new(),
    };
    let address = frame.address.as_deref().unwrap_or("");
    format!("{address} in {function} {place}").trim().to_owned()
}

/// A stable leak id: FNV-1a over the kind and, per frame, its function (or, without one,
/// its file and line, or its module's file name). Addresses never enter it, so the id
/// survives address-space randomization and rebuilds that keep the code's shape.
pub fn leak_id<'f>(kind: &str, frames: impl IntoIterator<Item = &'f FrameReport>) -> String {
    let mut hash = Fnv1a::new();
    let mut eat = |bytes: &[u8]| {
        hash.eat(bytes);
        hash.eat(b"\x1f");
    };
    eat(kind.as_bytes());
    for frame in frames {
        match (&frame.function, &frame.file, &frame.module) {
            (Some(function), _, _) => eat(function.as_bytes()),
            (None, Some(file), _) => eat(format!("{file}:{}", frame.line.unwrap_or(0)).as_bytes()),
            (None, None, Some(module)) => eat(super::json::file_name(module).as_bytes()),
            _ => eat(b"?"),
        }
    }
    format!("{:016x}", hash.finish())
}
