//! Report stage, between the report model and its files: keeps the report of a process
//! with very many stacks to a size one can open. `import torch` alone makes about a
//! million distinct stacks, most allocating a few hundred bytes once (C++ static
//! initializers, each a call site of its own); listed whole, they made 2 GB of report
//! files that no flame graph can show apart anyway.
//!
//! Past [`WHOLE_UP_TO`] stacks in a process, a stack that holds at least one part in
//! [`SHARE`] of the process's bytes at the peak, not freed at exit, or allocated stays as it
//! is. The others are merged along their call tree, from the outermost frame inwards: where
//! a branch of small stacks still matters as a whole it is split further, and where it no
//! longer does, its stacks become one entry — their common outer frames under a
//! `[smaller stacks]` frame, with their figures summed and `merged_stacks` saying how many
//! they were. Every figure therefore still adds up to the process's totals, and every
//! frame a flame graph would draw wide enough to read keeps its width.

use std::cmp::Reverse;

use memwarden_abi::UNKNOWN_STACK_ID;
use serde::{Deserialize, Serialize};

use super::json::{FrameKind, FrameReport, ProcessReport, StackReport};
use super::text::group;

/// Processes with at most this many stacks are reported whole.
pub const WHOLE_UP_TO: usize = 100_000;
/// A stack (or a branch of small stacks) matters from one part in this many of a total.
pub const SHARE: u64 = 10_000;
/// The function name of the frame that stands for the inner frames of merged stacks.
pub const SMALLER_STACKS_LABEL: &str = "[smaller stacks]";

/// What pruning did to a process's stacks (`pruned` in report.json; null when whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pruned {
    /// The profile's stacks with a figure: the entries `stacks` would have unmerged.
    pub profile_stacks: u64,
    /// How many of them were merged into entries whose `merged_stacks` is above 1.
    pub merged_stacks: u64,
    /// Those entries.
    pub merged_entries: u64,
    /// A stack was kept whole from one part in this many of a total ([`SHARE`]).
    pub share: u64,
}

/// The summary's note on a pruned process.
pub fn note(pid: u32, pruned: &Pruned) -> String {
    format!(
        "note: pid {pid}: {} of its {} stacks, each under 1/{} of its totals, are merged \
         along the call tree into {} entr{} ({SMALLER_STACKS_LABEL}); --all-stacks lists every \
         one",
        group(pruned.merged_stacks),
        group(pruned.profile_stacks),
        group(pruned.share),
        group(pruned.merged_entries),
        if pruned.merged_entries == 1 {
            "y"
        } else {
            "ies"
        },
    )
}

/// The least bytes, per measure, with which a stack or branch matters.
struct Limits {
    at_peak: u64,
    live: u64,
    allocated: u64,
}

impl Limits {
    fn of(p: &ProcessReport, share: u64) -> Limits {
        let limit = |total: u64| (total / share).max(1);
        Limits {
            at_peak: limit(p.peak_bytes),
            live: limit(p.not_freed_bytes),
            allocated: limit(p.totals.allocated_bytes),
        }
    }

    fn matter(&self, [at_peak, live, allocated]: [u64; 3]) -> bool {
        at_peak >= self.at_peak || live >= self.live || allocated >= self.allocated
    }
}

/// The figures by which a stack matters.
fn weighed(s: &StackReport) -> [u64; 3] {
    [s.at_peak_bytes, s.live_bytes, s.allocated_bytes]
}

/// Merges `p`'s small stacks if it has more than [`WHOLE_UP_TO`], and drops the frames
/// no longer used; leaves it as it is otherwise.
pub fn prune(p: &mut ProcessReport) {
    prune_past(p, WHOLE_UP_TO, SHARE);
}

/// [`prune`], from more than `whole_up_to` stacks, keeping those of one part in `share`.
fn prune_past(p: &mut ProcessReport, whole_up_to: usize, share: u64) {
    if p.stacks.len() <= whole_up_to {
        return;
    }
    let limits = Limits::of(p, share);
    let profile_stacks = p.stacks.len() as u64;
    let (mut kept, mut small): (Vec<StackReport>, Vec<StackReport>) = std::mem::take(&mut p.stacks)
        .into_iter()
        .partition(|s| s.id == UNKNOWN_STACK_ID || limits.matter(weighed(s)));
    // Sorted by category (no entry mixes NumPy data with other memory), then by frames
    // from the outermost: each branch of the call tree is then a run.
    small.sort_unstable_by(|a, b| {
        (a.category)
            .cmp(&b.category)
            .then_with(|| a.frames.iter().rev().cmp(b.frames.iter().rev()))
    });
    let marker = p.frames.len() as u32;
    p.frames.push(smaller_stacks_frame());
    let mut tree = Tree::new(&small, &limits, marker);
    let mut start = 0;
    while start < small.len() {
        let category = small[start].category;
        let end = start + small[start..].partition_point(|s| s.category == category);
        tree.walk(start, end, 0);
        start = end;
    }
    let merged = tree.merged;
    let merged_entries = merged.len() as u64;
    let merged_stacks = merged.iter().map(|s| s.merged_stacks).sum();
    kept.extend(tree.whole.iter().map(|&i| small[i].clone()));
    kept.extend(merged);
    kept.sort_by_cached_key(|s| (Reverse(s.at_peak_bytes), Reverse(s.allocated_bytes), s.id));
    p.stacks = kept;
    p.pruned = Some(Pruned {
        profile_stacks,
        merged_stacks,
        merged_entries,
        share,
    });
    compact_frames(p);
}

/// The call tree of a category's small stacks, sorted from their outermost frames.
struct Tree<'a> {
    stacks: &'a [StackReport],
    limits: &'a Limits,
    marker: u32,
    /// Running sums of each stack's weighed figures, so that a branch is weighed at once.
    sums: Vec<[u64; 3]>,
    /// Stacks kept as they are (by index).
    whole: Vec<usize>,
    /// The entries of merged stacks.
    merged: Vec<StackReport>,
}

impl<'a> Tree<'a> {
    fn new(stacks: &'a [StackReport], limits: &'a Limits, marker: u32) -> Self {
        let mut sums = Vec::with_capacity(stacks.len() + 1);
        let mut sum = [0u64; 3];
        sums.push(sum);
        for s in stacks {
            for (total, figure) in sum.iter_mut().zip(weighed(s)) {
                *total = total.saturating_add(figure);
            }
            sums.push(sum);
        }
        Tree {
            stacks,
            limits,
            marker,
            sums,
            whole: Vec::new(),
            merged: Vec::new(),
        }
    }

    /// The frame `depth` places in from the outermost of stack `i`, if it is that long.
    fn frame_at(&self, i: usize, depth: usize) -> Option<u32> {
        let frames = &self.stacks[i].frames;
        frames.len().checked_sub(depth + 1).map(|at| frames[at])
    }

    /// How many outer frames stacks `a` and `b` share, knowing they share `known`. In a
    /// sorted branch, the first and last stacks share what all of them share.
    fn shared_depth(&self, a: usize, b: usize, known: usize) -> usize {
        let mut depth = known;
        while self.frame_at(a, depth).is_some()
            && self.frame_at(a, depth) == self.frame_at(b, depth)
        {
            depth += 1;
        }
        depth
    }

    fn weight(&self, start: usize, end: usize) -> [u64; 3] {
        let (a, b) = (self.sums[start], self.sums[end]);
        [b[0] - a[0], b[1] - a[1], b[2] - a[2]]
    }

    /// Stacks `start..end`, which share their `depth` outermost frames and matter together:
    /// splits them by their next frame, walks each branch that still matters and merges
    /// the rest into one entry.
    fn walk(&mut self, start: usize, end: usize, depth: usize) {
        let mut small = Vec::new();
        let mut at = start;
        while at < end {
            let frame = self.frame_at(at, depth);
            let mut branch_end = at + 1;
            while branch_end < end && self.frame_at(branch_end, depth) == frame {
                branch_end += 1;
            }
            // Stacks no longer than the shared frames (sorted first) are those frames.
            if frame.is_none() {
                self.whole.extend(at..branch_end);
            } else if branch_end - at > 1 && self.limits.matter(self.weight(at, branch_end)) {
                self.walk(at, branch_end, depth + 1);
            } else {
                small.push(at..branch_end);
            }
            at = branch_end;
        }
        match small.as_slice() {
            [] => {}
            [only] if only.len() == 1 => self.whole.push(only.start),
            _ => {
                let entry = self.merge(&small, depth);
                self.merged.push(entry);
            }
        }
    }

    /// One entry for the stacks of `ranges`: the outer frames they all share (`depth`, or
    /// more when they are one branch) under the marker, and their figures summed.
    fn merge(&self, ranges: &[std::ops::Range<usize>], depth: usize) -> StackReport {
        let shared = match ranges {
            [branch] => self.shared_depth(branch.start, branch.end - 1, depth),
            _ => depth,
        };
        let first = &self.stacks[ranges[0].start];
        let mut frames = Vec::with_capacity(shared + 1);
        frames.push(self.marker);
        frames.extend_from_slice(&first.frames[first.frames.len() - shared..]);
        let mut entry = StackReport {
            id: first.id,
            site: None,
            category: first.category,
            frames,
            at_peak_bytes: 0,
            at_peak_blocks: 0,
            live_bytes: 0,
            live_blocks: 0,
            max_live_bytes: 0,
            allocated_bytes: 0,
            allocations: 0,
            frees: 0,
            merged_stacks: 0,
        };
        for s in ranges.iter().flat_map(|range| &self.stacks[range.clone()]) {
            entry.id = entry.id.min(s.id);
            entry.at_peak_bytes += s.at_peak_bytes;
            entry.at_peak_blocks += s.at_peak_blocks;
            entry.live_bytes += s.live_bytes;
            entry.live_blocks += s.live_blocks;
            entry.max_live_bytes += s.max_live_bytes;
            entry.allocated_bytes += s.allocated_bytes;
            entry.allocations += s.allocations;
            entry.frees += s.frees;
            entry.merged_stacks += s.merged_stacks;
        }
        entry
    }
}

fn smaller_stacks_frame() -> FrameReport {
    FrameReport {
        function: Some(SMALLER_STACKS_LABEL.to_owned()),
        file: None,
        line: None,
        module: None,
        address: None,
        inlined: false,
        kind: FrameKind::Elided,
    }
}

/// Every list of frame indices of `p`: its stacks', failures', crash's, errors' and leaks'.
fn frame_lists(p: &mut ProcessReport) -> impl Iterator<Item = &mut Vec<u32>> {
    let stacks = p.stacks.iter_mut().map(|s| &mut s.frames);
    let failures = p.injected_failures.iter_mut().map(|f| &mut f.frames);
    let crash = p.crash.iter_mut().map(|c| &mut c.frames);
    let errors = p.errors.iter_mut().flat_map(|e| {
        [&mut e.stack, &mut e.alloc_stack, &mut e.free_stack]
            .into_iter()
            .flatten()
    });
    let leaks = p.leaks.iter_mut().map(|l| &mut l.frames);
    stacks
        .chain(failures)
        .chain(crash)
        .chain(errors)
        .chain(leaks)
}

/// Drops the frames nothing refers to any more, keeping the others in their order.
fn compact_frames(p: &mut ProcessReport) {
    let mut new_index = vec![u32::MAX; p.frames.len()];
    for list in frame_lists(p) {
        for &frame in list.iter() {
            if let Some(slot) = new_index.get_mut(frame as usize) {
                *slot = 0;
            }
        }
    }
    for (next, slot) in (0u32..).zip(new_index.iter_mut().filter(|slot| **slot == 0)) {
        *slot = next;
    }
    let frames = std::mem::take(&mut p.frames);
    p.frames = frames
        .into_iter()
        .zip(&new_index)
        .filter(|(_, &index)| index != u32::MAX)
        .map(|(frame, _)| frame)
        .collect();
    for list in frame_lists(p) {
        for frame in list.iter_mut() {
            if let Some(&index) = new_index.get(*frame as usize) {
                *frame = index;
            }
        }
    }
}

#[cfg(test)]
#[path = "prune_tests.rs"]
mod tests;
