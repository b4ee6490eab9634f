//! Report stage, heap guards: each heap error in the summary, sanitizer style — a headline,
//! where it happened, the block it concerns with its allocation and free stacks, and a
//! `SUMMARY:` line. The preload prints a raw report of its own when it finds the error;
//! this is the symbolized one, after the run.

use std::fmt::Write;

use super::chain::{chain_of, place_of, shorten};
use super::errors::ErrorReport;
use super::json::{FrameReport, ProcessReport, UNKNOWN_STACK_LABEL};
use super::text::group;

/// Heap errors shown in full per process; report.json has every one stored.
pub const MAX_ERRORS_SHOWN: usize = 10;
/// Frames shown per stack of an error.
const ERROR_FRAMES: usize = 6;
/// Indentation of a stack under the line that introduces it.
const STACK_INDENT: &str = "      ";

/// The process's guard line: its mode and how many heap errors it found; `None` for a
/// process without guards and without errors.
pub(crate) fn guard_line(p: &ProcessReport) -> Option<String> {
    if p.guard_mode == "none" && p.error_count == 0 {
        return None;
    }
    let found = match p.error_count {
        0 => "no heap errors".to_owned(),
        n => format!("{} heap error{}", group(n), plural(n)),
    };
    Some(format!("{} mode, {found}", p.guard_mode))
}

/// Every heap error of `p` shown in full (at most [`MAX_ERRORS_SHOWN`]), then what was
/// left out.
pub(crate) fn write_errors(out: &mut String, p: &ProcessReport) {
    for error in p.errors.iter().take(MAX_ERRORS_SHOWN) {
        write_error(out, p, error);
    }
    let stored = p.errors.len() as u64;
    let shown = stored.min(MAX_ERRORS_SHOWN as u64);
    if stored > shown {
        let n = stored - shown;
        let _ = writeln!(
            out,
            "… {} more heap error{} in pid {} (see report.json)",
            group(n),
            plural(n),
            p.pid
        );
    }
    if p.error_count > stored {
        let n = p.error_count - stored;
        let _ = writeln!(
            out,
            "… {} more heap error{} in pid {}, counted but not stored (the profile's room for them filled up)",
            group(n),
            plural(n),
            p.pid
        );
    }
}

/// The closing line of a summary with heap errors, `None` without any.
pub(crate) fn total_line(processes: &[ProcessReport]) -> Option<String> {
    let total = processes
        .iter()
        .map(|p| p.error_count)
        .fold(0, u64::saturating_add);
    (total > 0).then(|| {
        format!(
            "memwarden: {} heap error{} found",
            group(total),
            plural(total)
        )
    })
}

fn write_error(out: &mut String, p: &ProcessReport, e: &ErrorReport) {
    let (stack, alloc_stack, free_stack) = (
        resolved(p, &e.stack),
        resolved(p, &e.alloc_stack),
        resolved(p, &e.free_stack),
    );
    if e.kind == "invalid-alignment" {
        let _ = writeln!(
            out,
            "ERROR: memwarden: {} (alignment {}) in pid {}",
            e.kind, e.offset, e.pid
        );
    } else {
        let _ = writeln!(
            out,
            "ERROR: memwarden: {} on address {} in pid {}",
            e.kind, e.address, e.pid
        );
    }
    let _ = writeln!(out, "  at  {}", stack_chain(stack.as_deref()));
    for line in location(e, alloc_stack.as_deref(), free_stack.as_deref()) {
        let _ = writeln!(out, "{line}");
    }
    let place = stack
        .as_deref()
        .filter(|frames| !frames.is_empty())
        .map_or_else(|| "an unknown place".to_owned(), place_of);
    let _ = writeln!(out, "SUMMARY: memwarden: {} at {place}", e.kind);
}

/// What the error's address and block are, then the block's allocation and free stacks.
fn location(
    e: &ErrorReport,
    alloc_stack: Option<&[&FrameReport]>,
    free_stack: Option<&[&FrameReport]>,
) -> Vec<String> {
    let mut lines = Vec::new();
    let introduction = match e.kind.as_str() {
        "invalid-alignment" => {
            lines.push(format!(
                "  alignment {} is not one the allocation function accepts",
                e.offset
            ));
            return lines;
        }
        // The page guard's addresses are never handed out twice: a fault on one that no
        // block it holds spans was on a block freed and gone from its quarantine.
        "heap-use-after-free" if !e.block_known() => {
            lines.push(format!(
                "  {} lies in a block freed before and out of quarantine (its size and stacks \
                 are no longer kept; a larger --quarantine keeps them longer)",
                e.address
            ));
            return lines;
        }
        _ if !e.block_known() => {
            lines.push(format!(
                "  {} is in no block memwarden holds (an address it never returned, or a block \
                 freed and out of quarantine)",
                e.address
            ));
            return lines;
        }
        "size-mismatch" => format!(
            "  {} was deallocated as {}, allocated as {} at",
            e.address,
            bytes(e.offset.unsigned_abs()),
            bytes(e.block_size)
        ),
        _ => format!(
            "  {} is located {} the {}-byte block allocated at",
            e.address,
            position(e.offset, e.block_size),
            e.block_size
        ),
    };
    lines.push(introduction);
    lines.push(format!("{STACK_INDENT}{}", stack_chain(alloc_stack)));
    if let Some(freed) = free_stack {
        lines.push("  freed at".to_owned());
        lines.push(format!("{STACK_INDENT}{}", stack_chain(Some(freed))));
    }
    lines
}

/// `4 bytes after`, `1 byte before`, `8 bytes inside`.
fn position(offset: i64, block_size: u64) -> String {
    let (n, side) = if offset < 0 {
        (offset.unsigned_abs(), "before")
    } else if offset.unsigned_abs() >= block_size {
        (offset.unsigned_abs() - block_size, "after")
    } else {
        (offset.unsigned_abs(), "inside")
    };
    format!("{} {side}", bytes(n))
}

fn bytes(n: u64) -> String {
    format!("{} byte{}", group(n), plural(n))
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// An error's stack, its frames looked up in the process's table.
fn resolved<'a>(p: &'a ProcessReport, stack: &'a Option<Vec<u32>>) -> Option<Vec<&'a FrameReport>> {
    stack.as_deref().map(|s| p.resolve(s))
}

fn stack_chain(frames: Option<&[&FrameReport]>) -> String {
    match frames {
        Some(frames) if !frames.is_empty() => chain_of(frames, ERROR_FRAMES),
        _ => shorten(UNKNOWN_STACK_LABEL),
    }
}

#[cfg(test)]
#[path = "error_text_tests.rs"]
mod tests;
