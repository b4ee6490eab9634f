//! Report stage: the short summary the CLI prints on stderr after the run — per process
//! its exit, peak, NumPy array data, top stacks at the peak, totals, leaks, injected
//! failures, crash, flags and guard mode, then its heap errors (`error_text`).

use std::fmt::Write;

use super::chain::{chain_of, shortened, top_at_peak, CHAIN_FRAMES};
use super::error_text::{guard_line, total_line, write_errors};
use super::json::{ProcessReport, Report};

/// Processes shown in full; more are summed up in one line (report.json has them all).
pub const MAX_PROCESSES_SHOWN: usize = 12;
/// How the summary is drawn.
pub struct Style {
    /// Stacks shown per process.
    pub top: usize,
    /// Bold headings (only on a terminal).
    pub colour: bool,
    /// Leak kinds the text shows and sums (`memwarden_abi::leak_kind` codes).
    pub leak_kinds: Vec<u32>,
}

/// The summary of `report`; `footer` lines (where files were written, notes) end it.
pub fn summary(report: &Report, style: &Style, footer: &[String]) -> String {
    let mut out = String::new();
    let processes = &report.processes;
    let _ = writeln!(
        out,
        "memwarden: {} ({} process{})",
        report.command.join(" "),
        processes.len(),
        if processes.len() == 1 { "" } else { "es" }
    );
    let mut shown: Vec<&ProcessReport> = processes.iter().collect();
    if shown.len() > MAX_PROCESSES_SHOWN {
        // Processes with heap errors first: their errors are shown with them.
        shown.sort_by_key(|p| std::cmp::Reverse((p.error_count > 0, p.peak_bytes)));
        shown.truncate(MAX_PROCESSES_SHOWN);
        shown.sort_by(|a, b| a.start_time_ms.total_cmp(&b.start_time_ms));
    }
    for process in &shown {
        write_process(&mut out, process, style);
        write_errors(&mut out, process);
        super::leaks::write_leaks(&mut out, process, &style.leak_kinds);
    }
    if shown.len() < processes.len() {
        let _ = writeln!(
            out,
            "… {} more processes with smaller peaks (see report.json)",
            processes.len() - shown.len()
        );
    }
    if processes.len() > 1 {
        write_totals(&mut out, processes);
    }
    for line in footer {
        let _ = writeln!(out, "{line}");
    }
    if let Some(line) = total_line(processes) {
        let _ = writeln!(out, "{line}");
    }
    out
}

fn write_process(out: &mut String, p: &ProcessReport, style: &Style) {
    let heading = format!("pid {}: {}", p.pid, p.argv.join(" "));
    if style.colour {
        let _ = writeln!(out, "\x1b[1m{heading}\x1b[0m");
    } else {
        let _ = writeln!(out, "{heading}");
    }
    let exit = match (p.exit, p.replaced_by_exec) {
        (Some(exit), true) => format!("replaced by exec (final image: {exit})"),
        (None, true) => "replaced by exec".to_owned(),
        (Some(exit), false) => exit.to_string(),
        (None, false) => "unknown (still running, or killed before it could record it)".to_owned(),
    };
    let _ = writeln!(out, "  exit         {exit}");
    let _ = writeln!(
        out,
        "  peak heap    {} in {}, at {:.1} ms",
        bytes(p.peak_bytes),
        how_many(p.peak_blocks, "block"),
        p.peak_time_ms
    );
    if p.numpy.peak_bytes > 0 || p.numpy.not_freed_bytes > 0 {
        let _ = writeln!(
            out,
            "  numpy        {} of array data at the peak in {}; {} not freed",
            bytes(p.numpy.peak_bytes),
            how_many(p.numpy.peak_blocks, "array"),
            bytes(p.numpy.not_freed_bytes)
        );
    }
    for (i, (at_peak, chain)) in top_at_peak(p, style.top).into_iter().enumerate() {
        let share = at_peak as f64 * 100.0 / p.peak_bytes.max(1) as f64;
        let _ = writeln!(
            out,
            "  {:<12} {:>10} {:>5.1}%  {}",
            if i == 0 { "at the peak" } else { "" },
            human(at_peak),
            share,
            chain
        );
    }
    let t = &p.totals;
    let _ = writeln!(
        out,
        "  allocated    {} in {}, {}",
        bytes(t.allocated_bytes),
        how_many(t.allocations, "allocation"),
        how_many(t.frees, "free")
    );
    let _ = writeln!(
        out,
        "  not freed    {} in {} at {}",
        bytes(p.not_freed_bytes),
        how_many(p.not_freed_blocks, "block"),
        if p.replaced_by_exec { "exec" } else { "exit" }
    );
    if let Some(guard) = guard_line(p) {
        let _ = writeln!(out, "  guard        {guard}");
    }
    if p.injected_failure_count > 0 {
        let _ = writeln!(out, "  injected     {}", injected(p));
    }
    if let Some(first) = p.injected_failures.iter().min_by_key(|f| f.seq) {
        let _ = writeln!(
            out,
            "  first failed {} of {} at {}",
            first.function,
            bytes(first.size),
            chain_of(&p.resolve(&first.frames), CHAIN_FRAMES)
        );
    }
    if let Some(crash) = &p.crash {
        let signal = i32::try_from(crash.signal)
            .ok()
            .and_then(crate::exit::signal_name)
            .map_or_else(|| format!("signal {}", crash.signal), str::to_owned);
        let place: Vec<String> = p
            .frames_of(&crash.frames)
            .take(CHAIN_FRAMES)
            .map(|f| shortened(f.label()))
            .collect();
        let place = if place.is_empty() {
            "an unknown place".to_owned()
        } else {
            place.join(" <- ")
        };
        let _ = writeln!(out, "  crashed      {signal} at {place}");
    }
    let flags = flags(p);
    if !flags.is_empty() {
        let _ = writeln!(out, "  flags        {}", flags.join("; "));
    }
}

/// `3 allocation failures (rule 1: 2, rule 2: 1)`, counted by rule over the stored
/// failures, with how many more were injected than stored.
fn injected(p: &ProcessReport) -> String {
    let mut by_rule = std::collections::BTreeMap::<u32, u64>::new();
    for failure in &p.injected_failures {
        *by_rule.entry(failure.rule).or_default() += 1;
    }
    let mut parts: Vec<String> = by_rule
        .iter()
        .map(|(rule, n)| format!("rule {rule}: {}", group(*n)))
        .collect();
    let stored = p.injected_failures.len() as u64;
    if p.injected_failure_count > stored {
        parts.push(format!(
            "{} more not stored",
            group(p.injected_failure_count - stored)
        ));
    }
    let count = p.injected_failure_count;
    format!(
        "{} allocation failure{} ({})",
        group(count),
        if count == 1 { "" } else { "s" },
        parts.join(", ")
    )
}

fn write_totals(out: &mut String, processes: &[ProcessReport]) {
    let sum = |f: fn(&ProcessReport) -> u64| processes.iter().map(f).fold(0, u64::saturating_add);
    let _ = writeln!(
        out,
        "all processes: allocated {} in {}, {}; not freed at exit {}",
        bytes(sum(|p| p.totals.allocated_bytes)),
        how_many(sum(|p| p.totals.allocations), "allocation"),
        how_many(sum(|p| p.totals.frees), "free"),
        bytes(sum(|p| p.not_freed_bytes))
    );
}

fn flags(p: &ProcessReport) -> Vec<String> {
    let mut flags = Vec::new();
    if let Some(reason) = &p.degraded {
        let why = match reason.as_str() {
            "file_grow_failed" => "the profile file could not grow (disk full?)",
            "address_map_full" => "out of memory for the address map",
            "counter_overflow" => "a byte count overflowed (corrupt size or wild free)",
            "own_memory_exhausted" => "no memory left for memwarden's own use",
            other => other,
        };
        flags.push(format!(
            "DEGRADED: tracking stopped early ({why}); {} untracked",
            how_many(p.untracked_allocations, "allocation")
        ));
    }
    if p.own_malloc {
        flags.push("own malloc: the program defines malloc, its calls are not seen".into());
    }
    if p.stacks_full {
        flags.push("stack table full: later new stacks count as [unknown stack]".into());
    }
    if p.modules_full {
        flags.push("module table full: some frames cannot be symbolized".into());
    }
    if p.forked {
        flags.push("forked: started with its parent's heap".into());
    }
    flags
}

/// `1.5 MiB (1,572,864 bytes)`, or `512 bytes` (`1 byte`) below one KiB.
pub fn bytes(n: u64) -> String {
    if n == 1 {
        "1 byte".to_owned()
    } else if n < 1024 {
        format!("{n} bytes")
    } else {
        format!("{} ({} bytes)", human(n), group(n))
    }
}

/// Binary units with one decimal: `512 B`, `1.5 KiB`, `110.0 MiB`.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `1 block`, `2 blocks`, `1,024 blocks`: a count and its noun, plural but for one.
pub fn how_many(n: u64, noun: &str) -> String {
    format!("{} {noun}{}", group(n), if n == 1 { "" } else { "s" })
}

/// Thousands separated by commas: `1,572,864`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;
