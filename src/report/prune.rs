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
use std::ops::Range;

use memwarden_abi::UNKNOWN_STACK_ID;
use serde::{Deserialize, Serialize};

use super::json::{FrameKind, FrameReport, ProcessReport, StackReport};
use super::text::group;
use crate::python::Category;

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
    let (mut kept, small): (Vec<StackReport>, Vec<StackReport>) = std::mem::take(&mut p.stacks)
        .into_iter()
        .partition(|s| s.id == UNKNOWN_STACK_ID || limits.matter(weighed(s)));
    let marker = p.frames.len() as u32;
    p.frames.push(smaller_stacks_frame());
    let mut tree = Tree::new(&small, &limits, marker);
    // No entry mixes NumPy data with other memory: each category is a tree of its own.
    let mut by_category: Vec<(Category, u32)> =
        (0u32..).zip(&small).map(|(i, s)| (s.category, i)).collect();
    by_category.sort_unstable();
    let mut order: Vec<u32> = by_category.iter().map(|&(_, i)| i).collect();
    let mut start = 0;
    for category in by_category.chunk_by(|a, b| a.0 == b.0) {
        let end = start + category.len();
        tree.split(&mut order[start..end], 0);
        start = end;
    }
    let merged = tree.merged;
    let merged_entries = merged.len() as u64;
    let merged_stacks = merged.iter().map(|s| s.merged_stacks).sum();
    kept.extend(tree.whole.iter().map(|&i| small[i as usize].clone()));
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

/// The call tree of a category's small stacks, walked from their outermost frames. A
/// branch is the stacks (indices into `stacks`, in a slice of their own) that share its
/// outer frames; each is sorted by its next frame only when it is split, so that the long
/// runs of frames a whole branch shares are compared once per stack, not once per
/// comparison of a sort.
struct Tree<'a> {
    stacks: &'a [StackReport],
    limits: &'a Limits,
    marker: u32,
    /// Stacks kept as they are (by index).
    whole: Vec<u32>,
    /// The entries of merged stacks.
    merged: Vec<StackReport>,
}

impl<'a> Tree<'a> {
    fn new(stacks: &'a [StackReport], limits: &'a Limits, marker: u32) -> Self {
        Tree {
            stacks,
            limits,
            marker,
            whole: Vec::new(),
            merged: Vec::new(),
        }
    }

    /// The frame `depth` places in from the outermost of stack `i`, if it is that long.
    fn frame_at(&self, i: u32, depth: usize) -> Option<u32> {
        let frames = &self.stacks[i as usize].frames;
        frames.len().checked_sub(depth + 1).map(|at| frames[at])
    }

    /// How many outer frames all of `branch` share, knowing they share `known`.
    fn shared_depth(&self, branch: &[u32], known: usize) -> usize {
        let Some((&first, others)) = branch.split_first() else {
            return known;
        };
        let first = &self.stacks[first as usize].frames;
        let mut shared = first.len();
        for &other in others {
            let other = &self.stacks[other as usize].frames;
            let outermost_first = first.iter().rev().zip(other.iter().rev());
            shared = known
                + outermost_first
                    .take(shared)
                    .skip(known)
                    .take_while(|(a, b)| a == b)
                    .count();
        }
        shared
    }

    fn weight(&self, branch: &[u32]) -> [u64; 3] {
        branch.iter().fold([0u64; 3], |mut sum, &i| {
            for (total, figure) in sum.iter_mut().zip(weighed(&self.stacks[i as usize])) {
                *total = total.saturating_add(figure);
            }
            sum
        })
    }

    /// Stacks `branch`, which share their `depth` outermost frames: splits them by their
    /// next frame, walks each part that matters and merges the rest into one entry.
    fn split(&mut self, branch: &mut [u32], depth: usize) {
        // Shorter stacks first, as their frames from the outermost sort. Each stack's next
        // frame is read once, not at every comparison: it is a cache miss.
        let mut keyed: Vec<(u64, u32)> = branch
            .iter()
            .map(|&i| (self.frame_at(i, depth).map_or(0, |f| u64::from(f) + 1), i))
            .collect();
        keyed.sort_unstable();
        for (slot, &(_, i)) in branch.iter_mut().zip(&keyed) {
            *slot = i;
        }
        let mut small = Vec::new();
        let mut at = 0;
        for run in keyed.chunk_by(|a, b| a.0 == b.0) {
            let range = at..at + run.len();
            at = range.end;
            let part = &mut branch[range.clone()];
            if run[0].0 == 0 {
                // Stacks no longer than the shared frames are those frames.
                self.whole.extend_from_slice(part);
            } else if part.len() > 1 && self.limits.matter(self.weight(part)) {
                // Every frame the whole part shares is skipped at once: one such frame
                // at a time would split it into the same single part again.
                let shared = self.shared_depth(part, depth + 1);
                self.split(part, shared);
            } else {
                small.push(range);
            }
        }
        match small.as_slice() {
            [] => {}
            [only] if only.len() == 1 => self.whole.push(branch[only.start]),
            _ => {
                let entry = self.merge(branch, &small, depth);
                self.merged.push(entry);
            }
        }
    }

    /// One entry for the stacks of `parts` (ranges of `branch`): the outer frames they all
    /// share (`depth`, or more when they are one part) under the marker, and their figures
    /// summed.
    fn merge(&self, branch: &[u32], parts: &[Range<usize>], depth: usize) -> StackReport {
        let shared = match parts {
            [part] => self.shared_depth(&branch[part.clone()], depth),
            _ => depth,
        };
        let first = &self.stacks[branch[parts[0].start] as usize];
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
        let members = parts.iter().flat_map(|part| &branch[part.clone()]);
        for s in members.map(|&i| &self.stacks[i as usize]) {
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
