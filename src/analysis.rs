//! Analysis, between the store and the report: the figures at the peak, exec inference,
//! how each process ended, and the order processes are shown in. Pure functions of the
//! profiles and the reaped statuses; nothing here reads files or symbols.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};

use memwarden_abi::{at_peak, peak_bytes};
use serde::{Deserialize, Serialize};

use crate::parallel::map_in_order;
use crate::profile::{Profile, Stack};
use crate::python::{Categories, Category, NumpyFigures};
use crate::Exit;

/// Where a process's exit status comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExitSource {
    /// The CLI reaped the process (authoritative, covers SIGKILL).
    Reaped,
    /// The process recorded it in its profile.
    Recorded,
}

/// The process's heap at its peak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peak {
    /// Live bytes at the peak.
    pub bytes: u64,
    /// Live blocks at the peak (sum over stacks).
    pub blocks: u64,
    /// ns after process start when it was reached.
    pub time_ns: u64,
}

/// One stack's figures.
#[derive(Clone, Copy, Debug)]
pub struct StackFigures<'p> {
    /// The stack.
    pub stack: &'p Stack,
    /// Its id, copied: the report visits stacks by peak, not in the profile's order, and
    /// reading the id through `stack` missed the cache at each visit.
    pub id: u32,
    /// Bytes live at the process's peak.
    pub at_peak_bytes: u64,
    /// Blocks live at the process's peak.
    pub at_peak_blocks: u64,
    /// Bytes live at the end (not freed at exit).
    pub live_bytes: u64,
    /// Blocks live at the end.
    pub live_blocks: u64,
    /// Highest live bytes this stack ever had.
    pub max_live_bytes: u64,
    /// Bytes ever allocated.
    pub allocated_bytes: u64,
    /// Allocations ever made.
    pub allocations: u64,
    /// Blocks freed.
    pub frees: u64,
    /// What its blocks are (set by [`process_peak`]; `native` from [`StackFigures::new`]).
    pub category: Category,
}

impl<'p> StackFigures<'p> {
    /// The figures of `stack` in a process whose final heap pair is `(live, peak)`.
    pub fn new(stack: &'p Stack, live: u64, peak: u64) -> Self {
        let r = &stack.record;
        let (at_peak_bytes, at_peak_blocks) = at_peak(r, live, peak);
        StackFigures {
            stack,
            id: stack.id,
            at_peak_bytes,
            at_peak_blocks,
            live_bytes: r.live_bytes.max(0) as u64,
            live_blocks: r.live_blocks.max(0) as u64,
            max_live_bytes: r.max_live_bytes.max(0) as u64,
            allocated_bytes: r.allocated_bytes,
            allocations: r.allocations,
            frees: r.frees,
            category: Category::Native,
        }
    }

    fn is_empty(&self) -> bool {
        [
            self.at_peak_bytes,
            self.at_peak_blocks,
            self.live_bytes,
            self.live_blocks,
            self.allocated_bytes,
            self.allocations,
            self.frees,
        ]
        .iter()
        .all(|&n| n == 0)
    }
}

/// Sums over a process's stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Σ allocated_bytes.
    pub allocated_bytes: u64,
    /// Σ allocations.
    pub allocations: u64,
    /// Σ frees.
    pub frees: u64,
}

/// One process image, analysed.
#[derive(Clone, Debug)]
pub struct Process<'p> {
    /// Its profile.
    pub profile: &'p Profile,
    /// How it ended; for an image replaced by exec, how its pid's final image ended.
    pub exit: Option<Exit>,
    /// Where `exit` comes from.
    pub exit_source: Option<ExitSource>,
    /// It called exec: a later image of the same pid exists and this one recorded no end.
    pub replaced_by_exec: bool,
    /// ns between the earliest process's start and this one's.
    pub start_offset_ns: u64,
    /// Its peak.
    pub peak: Peak,
    /// Σ live bytes at the end.
    pub not_freed_bytes: u64,
    /// Σ live blocks at the end.
    pub not_freed_blocks: u64,
    /// Sums over its stacks.
    pub totals: Totals,
    /// Its NumPy array data: sums over its `numpy` stacks.
    pub numpy: NumpyFigures,
    /// Stacks with any non-zero figure, by bytes at the peak then bytes allocated.
    pub stacks: Vec<StackFigures<'p>>,
}

/// The process's peak and each stack's share of it, by the rule in `memwarden-abi`.
pub fn process_peak<'p>(profile: &'p Profile) -> (Peak, Vec<StackFigures<'p>>) {
    let (live, committed) = (profile.live_bytes, profile.committed_peak_bytes);
    let mut categories = Categories::new(profile);
    let stacks: Vec<_> = profile
        .stacks
        .iter()
        .map(|s| StackFigures {
            category: categories.of(s),
            ..StackFigures::new(s, live, committed)
        })
        .collect();
    let time_ns = if live > committed {
        profile.rise_time_ns
    } else {
        profile.peak_time_ns
    };
    let peak = Peak {
        bytes: peak_bytes(live, committed),
        blocks: sum(stacks.iter().map(|s| s.at_peak_blocks)),
        time_ns,
    };
    (peak, stacks)
}

/// Analyses every profile of a run. `reaped` holds the statuses the CLI reaped (empty
/// without `run.json`). Processes come out ordered by start time, then pid.
pub fn analyze<'p>(profiles: &'p [Profile], reaped: &BTreeMap<u32, Exit>) -> Vec<Process<'p>> {
    let mut order: Vec<&Profile> = profiles.iter().collect();
    order.sort_by_key(|p| (p.start_monotonic_ns, p.pid));
    let earliest = order.first().map_or(0, |p| p.start_monotonic_ns);

    // The last image of each pid in start order; earlier images that recorded no end were
    // replaced by exec and share its end.
    let mut last_image: HashMap<u32, &Profile> = HashMap::new();
    for &p in &order {
        last_image.insert(p.pid, p);
    }
    let final_exit = |p: &Profile| match reaped.get(&p.pid) {
        Some(&exit) => (Some(exit), Some(ExitSource::Reaped)),
        None => (
            p.recorded_exit,
            p.recorded_exit.map(|_| ExitSource::Recorded),
        ),
    };

    map_in_order(&order, |&profile| {
        let last = last_image.get(&profile.pid).copied().unwrap_or(profile);
        let is_last = std::ptr::eq(last, profile);
        let replaced_by_exec = !is_last && profile.recorded_exit.is_none();
        let (exit, exit_source) = if is_last || replaced_by_exec {
            final_exit(last)
        } else {
            // An earlier, unrelated process with a reused pid: its own record.
            (profile.recorded_exit, Some(ExitSource::Recorded))
        };
        let (peak, mut stacks) = process_peak(profile);
        stacks.retain(|s| !s.is_empty());
        // Largest at the peak first, then most allocated, then by id. The keys are
        // taken once, and sorted with the positions they came from: the figures
        // themselves are ten words each, too many to move at every swap.
        stacks.sort_by_cached_key(|s| (Reverse(s.at_peak_bytes), Reverse(s.allocated_bytes), s.id));
        let totals = Totals {
            allocated_bytes: sum(stacks.iter().map(|s| s.allocated_bytes)),
            allocations: sum(stacks.iter().map(|s| s.allocations)),
            frees: sum(stacks.iter().map(|s| s.frees)),
        };
        let numpy = numpy_figures(&stacks);
        Process {
            profile,
            exit,
            exit_source,
            replaced_by_exec,
            start_offset_ns: profile.start_monotonic_ns.saturating_sub(earliest),
            peak,
            not_freed_bytes: sum(stacks.iter().map(|s| s.live_bytes)),
            not_freed_blocks: sum(stacks.iter().map(|s| s.live_blocks)),
            totals,
            numpy,
            stacks,
        }
    })
}

/// The sum of `values`, saturated: the figures of a corrupt file can add up past `u64::MAX`.
fn sum(values: impl Iterator<Item = u64>) -> u64 {
    values.fold(0, u64::saturating_add)
}

/// The NumPy array figures: sums over the `numpy` stacks.
pub fn numpy_figures(stacks: &[StackFigures]) -> NumpyFigures {
    let numpy = || stacks.iter().filter(|s| s.category == Category::Numpy);
    NumpyFigures {
        peak_bytes: sum(numpy().map(|s| s.at_peak_bytes)),
        peak_blocks: sum(numpy().map(|s| s.at_peak_blocks)),
        not_freed_bytes: sum(numpy().map(|s| s.live_bytes)),
        not_freed_blocks: sum(numpy().map(|s| s.live_blocks)),
    }
}

#[cfg(test)]
#[path = "analysis_tests.rs"]
mod tests;
