//! Report stage: the short summary the CLI prints on stderr after the run — per process
//! its exit, peak, NumPy array data, top stacks at the peak, totals, leaks, injected
//! failures, crash, flags and guard mode, then its heap errors (`error_text`).

use std::collections::HashMap;
use std::fmt::Write;

use super::error_text::{guard_line, total_line, write_errors};
use super::json::{FrameKind, FrameReport, ProcessReport, Report};
use crate::word_map::WordMap;

/// Processes shown in full; more are summed up in one line (report.json has them all).
pub const MAX_PROCESSES_SHOWN: usize = 12;
/// Frames shown per stack in the summary.
const CHAIN_FRAMES: usize = 3;
/// Longest frame label shown in the summary, in characters.
const MAX_LABEL: usize = 70;
/// Between the frames of a chain, innermost first.
const CHAIN_SEPARATOR: &str = " <- ";
/// A chain with no frame to show.
const NO_FRAMES: &str = "(no frames)";

/// Functions that only pass an allocation through; the summary shows their callers.
const ALLOCATOR_FUNCTIONS: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "free_sized",
    "free_aligned_sized",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "__libc_malloc",
    "__libc_calloc",
    "__libc_realloc",
    "__libc_memalign",
    "__rust_alloc",
    "__rust_alloc_zeroed",
    "__rust_realloc",
    "__rdl_alloc",
    "__rdl_alloc_zeroed",
    "__rdl_realloc",
    "__rg_alloc",
    "__rg_alloc_zeroed",
    "__rg_realloc",
];
/// Name prefixes of allocator plumbing (C++ and Rust standard libraries).
const ALLOCATOR_PREFIXES: &[&str] = &[
    "operator new",
    "operator delete",
    "alloc::",
    "<alloc::",
    "core::alloc::",
    "std::alloc::",
    "<std::alloc::",
    "__gnu_cxx::new_allocator",
    "__gnu_cxx::__new_allocator",
    "std::__new_allocator",
    "std::allocator",
    "std::allocator_traits",
    "hashbrown::raw::",
    "<hashbrown::",
];

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
            .map(|f| shorten(&f.label()))
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

/// The `count` largest figures at the peak, each with the chain of frames the summary
/// prints for it. Stacks that print the same chain are one entry: recorded stacks differ in
/// frames the chain does not show (a caller further out, the instructions of one Python
/// line, two return addresses in one function), and printed apart they would read as the
/// same line twice, each with part of its bytes.
fn top_at_peak(p: &ProcessReport, count: usize) -> Vec<(u64, String)> {
    let mut printed = PrintedFrames::new(p);
    let mut entries: Vec<(u64, ChainKey)> = Vec::new();
    let mut index: HashMap<ChainKey, usize> = HashMap::new();
    for stack in p.stacks.iter().filter(|s| s.at_peak_bytes > 0) {
        let key = printed.chain_key(&stack.frames);
        match index.get(&key) {
            Some(&i) => entries[i].0 = entries[i].0.saturating_add(stack.at_peak_bytes),
            None => {
                index.insert(key, entries.len());
                entries.push((stack.at_peak_bytes, key));
            }
        }
    }
    // Stable: equal figures keep the order of report.json's stacks.
    entries.sort_by_key(|&(bytes, _)| std::cmp::Reverse(bytes));
    entries.truncate(count);
    entries
        .into_iter()
        .map(|(bytes, key)| (bytes, printed.text(&key)))
        .collect()
}

/// A chain as the summary prints it: the ids [`PrintedFrames`] gives its labels, innermost
/// first.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ChainKey {
    labels: [u32; CHAIN_FRAMES],
    len: u8,
}

/// One id per distinct printed label of a process's frames, made as frames are met: each
/// label is formatted once, however many stacks show its frame.
struct PrintedFrames<'p> {
    process: &'p ProcessReport,
    /// Each frame's label id, `u32::MAX` until met.
    label_of_frame: Vec<u32>,
    /// The first frame met with each label id.
    frame_of_label: Vec<u32>,
    by_text: WordMap<String, u32>,
}

impl<'p> PrintedFrames<'p> {
    fn new(process: &'p ProcessReport) -> Self {
        PrintedFrames {
            process,
            label_of_frame: vec![u32::MAX; process.frames.len()],
            frame_of_label: Vec::new(),
            by_text: WordMap::default(),
        }
    }

    /// The key of the chain [`chain_of`] prints for a stack of `frames` (indices into the
    /// frame table; those missing from it are passed over, as `resolve` does).
    fn chain_key(&mut self, frames: &[u32]) -> ChainKey {
        let table = &self.process.frames;
        let present = || {
            frames
                .iter()
                .filter_map(|&i| table.get(i as usize).map(|f| (i, f)))
        };
        let start = chain_start(present().map(|(_, f)| f));
        let mut key = ChainKey {
            labels: [0; CHAIN_FRAMES],
            len: 0,
        };
        for (slot, (index, _)) in key.labels.iter_mut().zip(present().skip(start)) {
            *slot = self.label_id(index as usize);
            key.len += 1;
        }
        key
    }

    fn label_id(&mut self, frame: usize) -> u32 {
        if self.label_of_frame[frame] == u32::MAX {
            let next = self.frame_of_label.len() as u32;
            let text = shorten(&self.process.frames[frame].label());
            let id = *self.by_text.entry(text).or_insert(next);
            if id == next {
                self.frame_of_label.push(frame as u32);
            }
            self.label_of_frame[frame] = id;
        }
        self.label_of_frame[frame]
    }

    /// The chain's text, as [`chain_of`] writes it.
    fn text(&self, key: &ChainKey) -> String {
        let labels = &key.labels[..usize::from(key.len)];
        if labels.is_empty() {
            return NO_FRAMES.to_owned();
        }
        let frames = &self.process.frames;
        let texts: Vec<String> = labels
            .iter()
            .map(|&id| shorten(&frames[self.frame_of_label[id as usize] as usize].label()))
            .collect();
        texts.join(CHAIN_SEPARATOR)
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

/// Whether a frame only passes the allocation through.
fn is_allocator_frame(frame: &FrameReport) -> bool {
    let Some(function) = frame.function.as_deref() else {
        return false;
    };
    ALLOCATOR_FUNCTIONS.contains(&function)
        || ALLOCATOR_PREFIXES.iter().any(|p| function.starts_with(p))
}

/// The innermost few frames that are not allocator plumbing, innermost first.
pub fn chain(frames: &[FrameReport]) -> String {
    chain_of(&frames.iter().collect::<Vec<_>>(), CHAIN_FRAMES)
}

/// Like [`chain`], with at most `count` frames. A stack with Python frames starts at the
/// innermost one: the Python line that allocated says more than the C code beneath it.
pub(crate) fn chain_of(frames: &[&FrameReport], count: usize) -> String {
    let first_meaningful = chain_start(frames.iter().copied());
    let labels: Vec<String> = frames[first_meaningful..]
        .iter()
        .take(count)
        .map(|f| shorten(&f.label()))
        .collect();
    if labels.is_empty() {
        NO_FRAMES.to_owned()
    } else {
        labels.join(CHAIN_SEPARATOR)
    }
}

/// Where a chain starts among `frames` (innermost first): at the first Python frame, or
/// else at the first that is not allocator plumbing, or else at the first.
fn chain_start<'a>(frames: impl Iterator<Item = &'a FrameReport> + Clone) -> usize {
    frames
        .clone()
        .position(|f| f.kind == FrameKind::Python)
        .or_else(|| frames.clone().position(|f| !is_allocator_frame(f)))
        .unwrap_or(0)
}

pub(crate) fn shorten(label: &str) -> String {
    match label.char_indices().nth(MAX_LABEL) {
        Some((cut, _)) => format!("{}…", &label[..cut]),
        None => label.to_owned(),
    }
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
