//! The report, last stage of the pipeline: from an output folder's profiles to
//! `report.json`, the collapsed stacks, the flame graphs and the summary text.

pub mod chain;
mod collapsed;
pub mod error_text;
pub mod errors;
pub mod failures;
pub mod flamegraph;
pub mod folded;
mod frame_pool;
mod frame_table;
mod frames;
pub mod json;
mod json_write;
pub mod leak_gate;
pub mod leaks;
pub mod prune;
pub mod read;
mod same_frames;
mod site;
pub mod text;
pub mod warm;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::analysis::analyze;
use crate::parallel::{map_in_order, spawn_or_run};
use crate::profile::{load_dir, OutputDir};
use crate::symbolize::Symbolizer;
use crate::Error;
use collapsed::Collapsed;
use folded::Measure;
use json::Report;
use warm::Ahead;

/// File name of the JSON report inside the output folder.
pub const REPORT_FILE: &str = "report.json";
/// Bytes buffered per report file: a large profile's folded files run to 100 MB, which in
/// the default 8 KiB writes is tens of thousands of system calls.
const WRITE_BUFFER: usize = 1 << 20;
/// The share of a process's peak (one part in this many) from which pymalloc's arenas get
/// a note in the summary.
const ARENAS_NOTE_SHARE: u64 = 10;
/// Symbolization warnings shown in the summary; the rest are counted.
const MAX_WARNINGS_SHOWN: usize = 3;

/// How the report is rendered.
#[derive(Clone, Debug)]
pub struct Options {
    /// Stacks shown per process in the summary.
    pub top: usize,
    /// Bold headings in the summary.
    pub colour: bool,
    /// What the leak gate counts and leaves out.
    pub leak_gate: leak_gate::LeakGate,
    /// Where symbols are kept across runs (`symbolize::disk_cache`), if anywhere.
    pub symbol_cache: Option<PathBuf>,
    /// Every stack listed, however many a process has (no [`prune`]).
    pub all_stacks: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            top: 5,
            colour: false,
            leak_gate: leak_gate::LeakGate::default(),
            symbol_cache: None,
            all_stacks: false,
        }
    }
}

/// What [`generate`] produced.
#[derive(Debug)]
pub struct Generated {
    /// The report (also written as `report.json`).
    pub report: Report,
    /// The summary text, ending with a newline.
    pub summary: String,
    /// Every file written.
    pub files: Vec<PathBuf>,
}

/// Loads `dir`, analyses and symbolizes its profiles, writes every report file into it,
/// and returns the summary.
pub fn generate(dir: &Path, options: &Options) -> Result<Generated, Error> {
    let mut symbolizer = Symbolizer::with_disk_cache(options.symbol_cache.clone());
    generate_loaded(
        dir,
        &mut load_dir(dir)?,
        options,
        &mut symbolizer,
        Ahead::default(),
    )
}

/// [`generate`], for the output folder `dir` loaded already (its profile files are not
/// read again), with a symbolizer that may have symbols loaded already and what the
/// look-ahead made of the stacks ([`warm::symbolize_ahead`]; `Ahead::default()` for
/// nothing). The folder and symbolizer stay the caller's: a caller about to exit may
/// leave them to the kernel rather than free them (see `memwarden run`). Once the report
/// is built, the profiles' frame words are let go of ([`OutputDir::take_frames`]) while the
/// files are written: a frame area `memwarden run` mapped is then unmapped on a thread of
/// its own, and with it, once compaction has replaced its file, the old file freed (about
/// 2 ms for the NumPy benchmark's), rather than when the CLI exits.
pub fn generate_loaded(
    dir: &Path,
    loaded: &mut OutputDir,
    options: &Options,
    symbolizer: &mut Symbolizer,
    ahead: Ahead,
) -> Result<Generated, Error> {
    let reaped = loaded
        .run
        .as_ref()
        .map(|run| run.exits.clone())
        .unwrap_or_default();
    let processes = analyze(&loaded.profiles, &reaped);
    let command = match &loaded.run {
        Some(run) => run.command.clone(),
        None => processes
            .first()
            .map(|p| p.profile.argv.clone())
            .unwrap_or_default(),
    };
    let mut report = json::build(command, &processes, symbolizer, ahead);
    options.leak_gate.mark_suppressed(&mut report);
    if !options.all_stacks {
        report.processes.iter_mut().for_each(prune::prune);
    }
    let cache_writes = symbolizer.disk_cache_writes();
    let frames = loaded.take_frames();
    let files = std::thread::scope(|scope| {
        spawn_or_run(scope, || cache_writes.save());
        spawn_or_run(scope, move || drop(frames));
        write_files(dir, &report)
    })?;

    let mut footer = Vec::new();
    if loaded.run.is_none() {
        footer.push("note: no run.json: exit statuses are those the processes recorded".into());
    }
    // Sorted: the processes' tables, built at the same time, meet the modules in any order.
    let mut warnings = symbolizer.warnings().to_vec();
    warnings.sort();
    for warning in warnings.iter().take(MAX_WARNINGS_SHOWN) {
        footer.push(format!("note: {warning}"));
    }
    if warnings.len() > MAX_WARNINGS_SHOWN {
        let more = warnings.len() - MAX_WARNINGS_SHOWN;
        footer.push(format!("note: … and {more} more modules without symbols"));
    }
    for p in &report.processes {
        if let Some(pruned) = &p.pruned {
            footer.push(prune::note(p.pid, pruned));
        }
    }
    if report.processes.iter().any(arenas_at_peak) {
        footer.push(
            "note: Python objects under 512 bytes are counted by pymalloc arena, not by line; \
             `memwarden run --python-objects` charges each to its line"
                .into(),
        );
    }
    let numpy = report
        .processes
        .iter()
        .any(|p| p.numpy.peak_bytes > 0 || p.numpy.not_freed_bytes > 0);
    let leaks = report.processes.iter().any(|p| p.leak_check.is_some());
    footer.push(format!(
        "memwarden: report written to {}: {REPORT_FILE}, peak.svg, not-freed.svg, allocated.svg{}{} (and .folded)",
        dir.display(),
        if numpy { ", numpy-peak.svg" } else { "" },
        if leaks { ", leaked.svg" } else { "" }
    ));
    let style = text::Style {
        top: options.top,
        colour: options.colour,
        leak_kinds: options.leak_gate.kinds.clone(),
    };
    let summary = text::summary(&report, &style, &footer);
    Ok(Generated {
        report,
        summary,
        files,
    })
}

/// Whether pymalloc's arenas held a tenth or more of `process`'s peak: enough for a note
/// on how to see their objects by line.
fn arenas_at_peak(process: &json::ProcessReport) -> bool {
    let in_arenas: u64 = process
        .stacks
        .iter()
        // The arenas' frame is the only frame of their stack: one look per stack, not
        // one per frame of every stack.
        .filter(|stack| {
            stack.frames.first().is_some_and(|&f| {
                process
                    .frames
                    .get(f as usize)
                    .is_some_and(|frame| frame.kind == crate::symbolize::FrameKind::Arena)
            })
        })
        .map(|stack| stack.at_peak_bytes)
        .sum();
    in_arenas > 0 && in_arenas >= process.peak_bytes / ARENAS_NOTE_SHARE
}

/// Writes `report.json` and, per measure, `<measure>.folded` and `<measure>.svg` (the
/// NumPy one too when there is no NumPy data: it then says so). report.json is written on a
/// thread of its own while the collapsed lines are made; then the folded files and graphs,
/// which do not depend on one another, are shared among a thread per core, the largest
/// first. (Writing one thread per measure left a core idle while the largest measure
/// finished; a thread per file made ten threads, each with a fresh malloc arena, on two
/// cores.)
pub fn write_files(dir: &Path, report: &Report) -> Result<Vec<PathBuf>, Error> {
    let json_path = dir.join(REPORT_FILE);
    let processes = report.processes.len();
    let subtitle = format!(
        "{} ({} process{}), in bytes",
        report.command.join(" "),
        processes,
        if processes == 1 { "" } else { "es" }
    );
    std::thread::scope(|scope| {
        let json = spawn_or_run(scope, || {
            write_file(&json_path, |out| {
                json_write::write_report(&mut *out, report)?;
                out.write_all(b"\n")
            })
            .map(|()| json_path.clone())
        });
        let collapsed = Collapsed::new(report);
        // The measures' files in the order they are written: the allocated measure's
        // first, as every stack allocated, so its folded file and graph are the largest,
        // and started among the last they left one core idle while they finished.
        let mut order: Vec<(Measure, bool)> = Measure::ALL
            .into_iter()
            .flat_map(|measure| [(measure, false), (measure, true)])
            .collect();
        order.sort_by_key(|&(measure, _)| measure != Measure::Allocated);
        let written = map_in_order(&order, |&(measure, graph)| match graph {
            false => write_folded(dir, &collapsed, measure),
            true => write_graph(dir, &collapsed, measure, &subtitle),
        });
        let mut files = vec![json.join()?];
        for file in written {
            files.push(file?);
        }
        Ok(files)
    })
}

/// Writes `<measure>.folded`; returns its path.
fn write_folded(dir: &Path, collapsed: &Collapsed, measure: Measure) -> Result<PathBuf, Error> {
    let path = dir.join(measure.folded_file());
    write_file(&path, |out| collapsed.write(measure, out))?;
    Ok(path)
}

/// Writes `<measure>.svg`; returns its path.
fn write_graph(
    dir: &Path,
    collapsed: &Collapsed,
    measure: Measure,
    subtitle: &str,
) -> Result<PathBuf, Error> {
    let path = dir.join(measure.svg_file());
    let lines = collapsed.flame_lines(measure);
    let svg = flamegraph::svg(&lines, measure, subtitle).map_err(|source| Error::Io {
        path: path.clone(),
        action: "draw",
        source,
    })?;
    write_file(&path, |out| out.write_all(&svg))?;
    Ok(path)
}

fn write_file(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), Error> {
    let io_error = |source| Error::Io {
        path: path.to_owned(),
        action: "write",
        source,
    };
    // An earlier report's file is removed, not truncated: ext4 writes a file truncated to
    // zero out to disk when it is closed (its guard for programs that rewrite files in
    // place), which made regenerating a report wait for the old one's writeback.
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(e)),
        _ => {}
    }
    let mut out = BufWriter::with_capacity(WRITE_BUFFER, File::create(path).map_err(io_error)?);
    fill(&mut out).map_err(io_error)?;
    out.flush().map_err(io_error)
}

#[cfg(test)]
pub(crate) mod test_report;

#[cfg(test)]
#[path = "generate_tests.rs"]
mod generate_tests;

#[cfg(test)]
#[path = "python_report_tests.rs"]
mod python_report_tests;
