//! The sweep's result: every site's outcome, ordered crashes first, counted by outcome,
//! and serialized as `sweep.json` (the contract CI reads, in docs/fault-injection.md).

use memwarden::report::json::FrameReport;
use memwarden::Exit;
use serde::Serialize;

use crate::sweep_outcome::Outcome;

/// Version of the `sweep.json` format.
pub const SWEEP_FORMAT_VERSION: u32 = 1;
/// File name of the result inside the output folder.
pub const SWEEP_FILE: &str = "sweep.json";

/// What happened when one site's allocation failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteResult {
    /// The call-site key (hex), as `--fail site=` takes it.
    pub site: String,
    /// What the program did.
    pub outcome: Outcome,
    /// `{"signal": N}` for a crash, the root's `{"code": N}` otherwise; null for a hang.
    pub exit: Option<Exit>,
    /// The function whose call failed (`malloc`, `calloc`…), when known.
    pub function: Option<String>,
    /// The failed allocation's stack, innermost first.
    pub frames: Vec<FrameReport>,
    /// Where the program crashed, innermost first; null when not a crash or not recorded.
    pub crash_frames: Option<Vec<FrameReport>>,
    /// The run's `memwarden run` output folder, relative to the sweep's folder.
    pub run_dir: String,
    /// Wall time of the run in milliseconds.
    pub duration_ms: u64,
    /// The site's place in discovery order (ties within an outcome keep it).
    #[serde(skip)]
    pub order: usize,
}

/// The discovery run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Discovery {
    /// How the root process ended, when known.
    pub exit: Option<Exit>,
    /// Its output folder, relative to the sweep's folder.
    pub run_dir: String,
}

/// Sites by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Killed by a signal.
    pub crashed: usize,
    /// Timed out.
    pub hung: usize,
    /// Exited by itself.
    pub handled: usize,
    /// Nothing injected.
    #[serde(rename = "not reached")]
    pub not_reached: usize,
}

impl Counts {
    /// The count of one outcome.
    pub fn of(&self, outcome: Outcome) -> usize {
        match outcome {
            Outcome::Crashed => self.crashed,
            Outcome::Hung => self.hung,
            Outcome::Handled => self.handled,
            Outcome::NotReached => self.not_reached,
        }
    }

    fn add(&mut self, outcome: Outcome) {
        let slot = match outcome {
            Outcome::Crashed => &mut self.crashed,
            Outcome::Hung => &mut self.hung,
            Outcome::Handled => &mut self.handled,
            Outcome::NotReached => &mut self.not_reached,
        };
        *slot += 1;
    }
}

/// The whole result: `sweep.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SweepResult {
    /// [`SWEEP_FORMAT_VERSION`].
    pub format_version: u32,
    /// The command swept.
    pub command: Vec<String>,
    /// The discovery run.
    pub discovery: Discovery,
    /// Distinct allocation call sites discovery found.
    pub sites_total: usize,
    /// Fault-injection runs made (one per site, at most `--max-runs`).
    pub runs: usize,
    /// Sites left untried because of `--max-runs`.
    pub sites_not_run: usize,
    /// The per-run timeout.
    pub timeout_secs: u64,
    /// Results by outcome.
    pub counts: Counts,
    /// One per run: crashed, then hung, then handled, then not reached; discovery
    /// order within each.
    pub results: Vec<SiteResult>,
}

impl SweepResult {
    /// Orders and counts `results`.
    pub fn new(
        command: Vec<String>,
        discovery: Discovery,
        sites_total: usize,
        timeout_secs: u64,
        mut results: Vec<SiteResult>,
    ) -> SweepResult {
        results.sort_by_key(|r| (r.outcome, r.order));
        let mut counts = Counts::default();
        for result in &results {
            counts.add(result.outcome);
        }
        SweepResult {
            format_version: SWEEP_FORMAT_VERSION,
            command,
            discovery,
            sites_total,
            runs: results.len(),
            sites_not_run: sites_total.saturating_sub(results.len()),
            timeout_secs,
            counts,
            results,
        }
    }

    /// The CI gate: no site crashed or hung.
    pub fn passed(&self) -> bool {
        self.counts.crashed == 0 && self.counts.hung == 0
    }

    /// `sweep.json`'s text, ending with a newline.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        Ok(text)
    }
}

#[cfg(test)]
#[path = "sweep_result_tests.rs"]
mod tests;
