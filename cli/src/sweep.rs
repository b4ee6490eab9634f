//! `memwarden sweep`: a thin orchestration over `memwarden run`. One discovery run finds
//! the allocation call sites; then one run per site (in parallel, each with a timeout)
//! fails that site's first allocation; each run is judged, and the result is written as
//! `DIR/sweep.json` and summed up on stderr.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use memwarden::report::REPORT_FILE;

use crate::sweep_args::SweepArgs;
use crate::sweep_outcome::{judge, Ended, Outcome};
use crate::sweep_progress::Progress;
use crate::sweep_report::{discover_sites, run_facts, Site};
use crate::sweep_result::{Discovery, SiteResult, SweepResult, SWEEP_FILE};
use crate::sweep_runner::{catch_interrupts, run_once, Finished, RunError, RunRequest};
use crate::{io_reason, sweep_summary, target_check};

/// The discovery run's folder, inside the output folder.
const DISCOVERY_DIR: &str = "discovery";
/// The folder of the fault-injection runs, inside the output folder.
const RUNS_DIR: &str = "runs";
/// Which calls a site's rule fails: every kind, so that a C++ `new` site (whose malloc
/// the preload counts as `new`) fails too; the site key alone picks the call.
const FAIL_RULE_CALLS: &str = "calls=all";
/// Digits of a run folder's number, at least.
const RUN_NUMBER_WIDTH: usize = 3;

/// Why the sweep could not give its result.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// Refused before anything ran (bad target, unusable output folder).
    #[error("{0}")]
    Refused(String),
    /// Something went wrong on the way (no discovery report, a run that could not be made).
    #[error("{0}")]
    Failed(String),
    /// Ctrl-C or a termination signal: the runs in progress were killed.
    #[error("sweep interrupted; the runs in progress were killed")]
    Interrupted,
}

impl SweepError {
    /// The exit status of `memwarden sweep` for this error.
    pub fn status(&self) -> u8 {
        match self {
            SweepError::Refused(_) => 2,
            SweepError::Failed(_) => 1,
            SweepError::Interrupted => 130,
        }
    }
}

impl From<RunError> for SweepError {
    fn from(error: RunError) -> SweepError {
        match error {
            RunError::Interrupted => SweepError::Interrupted,
            other => SweepError::Failed(other.to_string()),
        }
    }
}

/// Sweeps; `Ok(true)` when no site crashed or hung. `terminal`: stderr is a TTY.
pub fn sweep(args: &SweepArgs, terminal: bool) -> Result<bool, SweepError> {
    let program = target_check::resolve(&args.command[0]).map_err(SweepError::Refused)?;
    target_check::check(&program).map_err(SweepError::Refused)?;
    let exe = std::env::current_exe()
        .map_err(|e| SweepError::Failed(format!("cannot find memwarden itself: {e}")))?;
    let out_dir = prepare(&args.output)?;
    let shown_dir = args.output.to_string_lossy().into_owned();
    catch_interrupts();
    let progress = Progress::new(terminal);

    progress.discovering();
    let discovered = discover(&exe, &out_dir, args, &shown_dir);
    if discovered.is_err() {
        progress.clear();
    }
    let (sites, discovery) = discovered?;
    let chosen = &sites[..sites.len().min(args.max_runs)];
    let plan = Plan {
        exe: &exe,
        out_dir: &out_dir,
        args,
        width: RUN_NUMBER_WIDTH.max(chosen.len().to_string().len()),
    };
    let results = run_sites(&plan, chosen, &progress);
    progress.clear();
    let results = results?;

    let command = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let timeout_secs = args.timeout.as_secs();
    let result = SweepResult::new(command, discovery, sites.len(), timeout_secs, results);
    write_result(&out_dir.join(SWEEP_FILE), &result)?;
    let _ = std::io::stderr().write_all(sweep_summary::summary(&result, &shown_dir).as_bytes());
    Ok(result.passed())
}

/// Creates the output folder and removes what an earlier sweep left there (its result,
/// its discovery and numbered run folders), so nothing stale is read or shown.
fn prepare(dir: &Path) -> Result<PathBuf, SweepError> {
    let shown = dir.display();
    fs::create_dir_all(dir).map_err(|e| {
        SweepError::Refused(format!(
            "cannot create output folder {shown}: {}",
            io_reason(&e)
        ))
    })?;
    let dir = dir
        .canonicalize()
        .map_err(|e| SweepError::Refused(format!("output folder {shown}: {}", io_reason(&e))))?;
    let mut stale = vec![dir.join(SWEEP_FILE), dir.join(DISCOVERY_DIR)];
    if let Ok(entries) = fs::read_dir(dir.join(RUNS_DIR)) {
        stale.extend(entries.flatten().map(|e| e.path()).filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        }));
    }
    for path in stale {
        let removed = if path.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(SweepError::Refused(format!(
                    "cannot remove {} of an earlier sweep: {}",
                    path.display(),
                    io_reason(&e)
                )))
            }
            _ => {}
        }
    }
    Ok(dir)
}

/// The discovery run: the program's call sites, and how it ended.
fn discover(
    exe: &Path,
    out_dir: &Path,
    args: &SweepArgs,
    shown_dir: &str,
) -> Result<(Vec<Site>, Discovery), SweepError> {
    let dir = out_dir.join(DISCOVERY_DIR);
    let shown = format!("{}/{DISCOVERY_DIR}", shown_dir.trim_end_matches('/'));
    let request = RunRequest {
        exe,
        dir: &dir,
        fail: None,
        command: &args.command,
        timeout: args.timeout,
    };
    let finished = run_once(&request)?;
    if let Some(reason) = finished.refused {
        return Err(SweepError::Refused(reason));
    }
    if finished.ended == Ended::TimedOut {
        return Err(SweepError::Failed(format!(
            "the discovery run did not finish within {} s (its output: {shown}/)",
            args.timeout.as_secs()
        )));
    }
    let text = fs::read_to_string(dir.join(REPORT_FILE)).map_err(|e| {
        SweepError::Failed(format!(
            "the discovery run wrote no report ({shown}/{REPORT_FILE}: {}; see {shown}/stderr.txt)",
            io_reason(&e)
        ))
    })?;
    let unusable = |e| {
        SweepError::Failed(format!(
            "the discovery run's report: {e} ({shown}/{REPORT_FILE})"
        ))
    };
    let sites = discover_sites(&text).map_err(unusable)?;
    let facts = run_facts(&text).map_err(unusable)?;
    let discovery = Discovery {
        exit: facts.root_exit,
        run_dir: DISCOVERY_DIR.to_owned(),
    };
    Ok((sites, discovery))
}

/// What every site's run shares.
struct Plan<'a> {
    exe: &'a Path,
    out_dir: &'a Path,
    args: &'a SweepArgs,
    /// Digits of the run folders' numbers.
    width: usize,
}

/// Runs every site on `--jobs` threads; results in the sites' order.
fn run_sites(
    plan: &Plan,
    sites: &[Site],
    progress: &Progress,
) -> Result<Vec<SiteResult>, SweepError> {
    let jobs = plan
        .args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, sites.len().max(1));
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (sender, receiver) = mpsc::channel();
    let mut results = Vec::with_capacity(sites.len());
    let mut first_error = None;
    progress.runs(0, sites.len(), 0, 0);
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let sender = sender.clone();
            let (next, stop) = (&next, &stop);
            scope.spawn(move || loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= sites.len() || stop.load(Ordering::Relaxed) {
                    break;
                }
                let _ = sender.send(run_site(plan, index, &sites[index]));
            });
        }
        drop(sender);
        let (mut crashes, mut hangs) = (0, 0);
        for outcome in receiver {
            match outcome {
                Ok(result) => {
                    crashes += usize::from(result.outcome == Outcome::Crashed);
                    hangs += usize::from(result.outcome == Outcome::Hung);
                    results.push(result);
                    progress.runs(results.len(), sites.len(), crashes, hangs);
                }
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    first_error.get_or_insert(e);
                }
            }
        }
    });
    match first_error {
        Some(e) => Err(e),
        None => {
            results.sort_by_key(|r| r.order);
            Ok(results)
        }
    }
}

/// Fails the first allocation at `site` and judges what the program did.
fn run_site(plan: &Plan, index: usize, site: &Site) -> Result<SiteResult, SweepError> {
    let run_dir = format!("{RUNS_DIR}/{:0width$}", index + 1, width = plan.width);
    let dir = plan.out_dir.join(&run_dir);
    let rule = format!("{FAIL_RULE_CALLS},site={},nth=1", site.key);
    let request = RunRequest {
        exe: plan.exe,
        dir: &dir,
        fail: Some(&rule),
        command: &plan.args.command,
        timeout: plan.args.timeout,
    };
    let Finished {
        ended,
        elapsed,
        refused,
    } = run_once(&request)?;
    if let Some(reason) = refused {
        return Err(SweepError::Failed(format!(
            "memwarden run refused the run failing site {}: {reason}",
            site.key
        )));
    }
    let facts = match ended {
        Ended::TimedOut => None,
        _ => fs::read_to_string(dir.join(REPORT_FILE))
            .ok()
            .and_then(|text| run_facts(&text).ok()),
    };
    let verdict = judge(ended, facts);
    Ok(SiteResult {
        site: site.key.clone(),
        outcome: verdict.outcome,
        exit: verdict.exit,
        function: verdict.function,
        frames: verdict.failed_frames.unwrap_or_else(|| site.frames.clone()),
        crash_frames: verdict.crash_frames,
        run_dir,
        duration_ms: duration_ms(elapsed),
        order: index,
    })
}

fn duration_ms(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

/// Writes `sweep.json` whole or not at all (a temporary file renamed into place).
fn write_result(path: &Path, result: &SweepResult) -> Result<(), SweepError> {
    let failed = |e: &dyn std::fmt::Display| {
        SweepError::Failed(format!("cannot write {}: {e}", path.display()))
    };
    let text = result.to_json().map_err(|e| failed(&e))?;
    let partial = path.with_extension("json.partial");
    fs::write(&partial, text).map_err(|e| failed(&io_reason(&e)))?;
    fs::rename(&partial, path).map_err(|e| failed(&io_reason(&e)))
}
