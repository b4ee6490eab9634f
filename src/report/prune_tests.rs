//! Tests of pruning a process of many stacks: what stays whole, how the rest merge along
//! the call tree, that every sum is kept, and a model that merges one frame at a time.

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;
use crate::python::Category;
use crate::report::leaks::LeakReport;
use crate::report::test_report::{function_frame, intern, process_report, stack_report};

/// A process of `stacks` (each given as innermost-first functions and bytes at the peak,
/// live and allocated), its totals their sums.
fn process(stacks: &[(&[&str], u64, u64, u64)]) -> ProcessReport {
    let mut p = process_report(7, &["prog"]);
    for (id, &(functions, at_peak, live, allocated)) in (1u32..).zip(stacks) {
        let stack = stack_report(&mut p, id, functions, at_peak, live, allocated);
        p.stacks.push(stack);
    }
    p.peak_bytes = p.stacks.iter().map(|s| s.at_peak_bytes).sum();
    p.not_freed_bytes = p.stacks.iter().map(|s| s.live_bytes).sum();
    p.totals.allocated_bytes = p.stacks.iter().map(|s| s.allocated_bytes).sum();
    p
}

/// Each entry as its labels (innermost first), merged count and bytes allocated.
fn entries(p: &ProcessReport) -> Vec<(Vec<String>, u64, u64)> {
    p.stacks
        .iter()
        .map(|s| {
            let labels = p.frames_of(&s.frames).map(FrameReport::label).collect();
            (labels, s.merged_stacks, s.allocated_bytes)
        })
        .collect()
}

fn labels(functions: &[&str]) -> Vec<String> {
    functions.iter().map(|f| f.to_string()).collect()
}

#[test]
fn a_process_within_the_limit_stays_whole() {
    let mut p = process(&[(&["a", "main"], 0, 0, 8), (&["b", "main"], 0, 0, 8)]);
    let before = entries(&p);
    prune_past(&mut p, 2, 100);
    assert_eq!(entries(&p), before);
    assert_eq!(p.pruned, None);
}

#[test]
fn small_stacks_merge_where_their_branch_stops_mattering() {
    // Of 1,000 bytes allocated, one part in 100 is 10 bytes. `big` and `wide` matter on
    // their own; the forty 1-byte stacks under `many` matter together (40 bytes), split
    // into `left` (30, matters) and `right` (10, matters): each branch's thirty or ten
    // leaves, 1 byte each, merge under it. The five under `few` (5 bytes) merge at once,
    // under the frames they all share.
    let mut stacks: Vec<(Vec<String>, u64)> = vec![
        (labels(&["big", "main"]), 900),
        (labels(&["wide", "main"]), 55),
    ];
    for i in 0..30 {
        stacks.push((labels(&[&format!("l{i}"), "left", "many", "main"]), 1));
    }
    for i in 0..10 {
        stacks.push((labels(&[&format!("r{i}"), "right", "many", "main"]), 1));
    }
    for i in 0..5 {
        stacks.push((labels(&[&format!("f{i}"), "few", "main"]), 1));
    }
    let refs: Vec<(Vec<&str>, u64)> = stacks
        .iter()
        .map(|(f, bytes)| (f.iter().map(String::as_str).collect(), *bytes))
        .collect();
    let spec: Vec<(&[&str], u64, u64, u64)> = refs
        .iter()
        .map(|(f, bytes)| (f.as_slice(), 0, 0, *bytes))
        .collect();
    let mut p = process(&spec);
    assert_eq!(p.totals.allocated_bytes, 1_000);
    prune_past(&mut p, 10, 100);

    let marker = SMALLER_STACKS_LABEL;
    let mut got = entries(&p);
    got.sort();
    let mut expected = vec![
        (labels(&["big", "main"]), 1, 900),
        (labels(&["wide", "main"]), 1, 55),
        (labels(&[marker, "left", "many", "main"]), 30, 30),
        (labels(&[marker, "right", "many", "main"]), 10, 10),
        (labels(&[marker, "few", "main"]), 5, 5),
    ];
    expected.sort();
    assert_eq!(got, expected);
    let pruned = p.pruned.expect("pruned");
    assert_eq!(
        (
            pruned.profile_stacks,
            pruned.merged_stacks,
            pruned.merged_entries
        ),
        (47, 45, 3)
    );
    assert_eq!(
        note(7, &pruned),
        "note: pid 7: 45 of its 47 stacks, each under 1/100 of its totals, are merged along \
         the call tree into 3 entries ([smaller stacks]); --all-stacks lists every one"
    );
    // Every figure still adds up; entries are in the report's order (allocated, here).
    let sum: u64 = p.stacks.iter().map(|s| s.allocated_bytes).sum();
    assert_eq!(sum, 1_000);
    assert_eq!(p.stacks[0].allocated_bytes, 900);
    // The merged entries have no call-site key and the smallest id of their stacks.
    let few = p.stacks.iter().find(|s| s.merged_stacks == 5).expect("few");
    assert_eq!((few.site.as_deref(), few.id), (None, 43));
}

#[test]
fn a_stack_that_matters_at_the_peak_or_at_exit_stays_whole() {
    // Nothing allocated matters alone, but one stack holds the peak and one the exit.
    let mut p = process(&[
        (&["peak", "main"], 100, 0, 1),
        (&["exit", "main"], 0, 100, 1),
        (&["x", "main"], 0, 0, 1),
        (&["y", "main"], 0, 0, 1),
    ]);
    p.totals.allocated_bytes = 400;
    prune_past(&mut p, 1, 100);
    let mut got = entries(&p);
    got.sort();
    let marker = SMALLER_STACKS_LABEL;
    assert_eq!(
        got,
        vec![
            (labels(&[marker, "main"]), 2, 2),
            (labels(&["exit", "main"]), 1, 1),
            (labels(&["peak", "main"]), 1, 1),
        ]
    );
}

#[test]
fn numpy_data_and_other_memory_never_share_an_entry() {
    let mut p = process(&[
        (&["big", "main"], 0, 0, 1_000),
        (&["a", "main"], 0, 0, 1),
        (&["b", "main"], 0, 0, 1),
        (&["c", "main"], 0, 0, 1),
        (&["d", "main"], 0, 0, 1),
    ]);
    p.stacks[1].category = Category::Numpy;
    p.stacks[2].category = Category::Numpy;
    prune_past(&mut p, 1, 100);
    let merged: Vec<(Category, u64)> = p
        .stacks
        .iter()
        .filter(|s| s.merged_stacks > 1)
        .map(|s| (s.category, s.merged_stacks))
        .collect();
    assert_eq!(merged.len(), 2);
    assert!(merged.contains(&(Category::Numpy, 2)));
    assert!(merged.contains(&(Category::Native, 2)));
}

#[test]
fn frames_no_stack_uses_are_dropped_and_every_reference_follows() {
    let mut p = process(&[
        (&["big", "main"], 0, 0, 1_000),
        (&["gone1", "main"], 0, 0, 1),
        (&["gone2", "main"], 0, 0, 1),
    ]);
    // A leak uses a frame that only a merged stack had, and one of its own.
    let frames = vec![
        intern(&mut p, function_frame("gone2")),
        intern(&mut p, function_frame("leaky")),
    ];
    p.leaks.push(LeakReport {
        kind: "definite".to_owned(),
        bytes: 1,
        blocks: 1,
        stack_id: 3,
        frames,
        id: "0".to_owned(),
        suppressed: false,
    });
    prune_past(&mut p, 1, 100);
    let mut names: Vec<String> = p.frames.iter().map(FrameReport::label).collect();
    names.sort();
    let marker = SMALLER_STACKS_LABEL;
    assert_eq!(names, [marker, "big", "gone2", "leaky", "main"]);
    let leak: Vec<String> = p
        .frames_of(&p.leaks[0].frames)
        .map(FrameReport::label)
        .collect();
    assert_eq!(leak, ["gone2", "leaky"]);
}

/// The sums of every figure of `p`'s stacks, per category.
fn sums(p: &ProcessReport) -> Vec<(Category, [u64; 9])> {
    let mut sums: Vec<(Category, [u64; 9])> = Vec::new();
    for s in &p.stacks {
        let figures = [
            s.at_peak_bytes,
            s.at_peak_blocks,
            s.live_bytes,
            s.live_blocks,
            s.max_live_bytes,
            s.allocated_bytes,
            s.allocations,
            s.frees,
            s.merged_stacks,
        ];
        match sums
            .iter_mut()
            .find(|(category, _)| *category == s.category)
        {
            Some((_, total)) => total.iter_mut().zip(figures).for_each(|(t, f)| *t += f),
            None => sums.push((s.category, figures)),
        }
    }
    sums.sort_by_key(|(category, _)| *category);
    sums
}

/// One generated stack: its path of choices from the outermost frame, its bytes at the
/// peak, live and freed, and whether it is NumPy data.
type GeneratedStack = (Vec<u8>, (u64, u64, u64), bool);

/// Up to `count` generated stacks, each of up to `levels` levels of three choices, each
/// figure below `figure` (bytes freed at least 1).
fn generated_stacks(
    levels: usize,
    figure: u64,
    count: usize,
) -> impl Strategy<Value = Vec<GeneratedStack>> {
    prop::collection::vec(
        (
            prop::collection::vec(0u8..3, 1..levels),
            (0u64..figure, 0u64..figure, 1u64..figure),
            any::<bool>(),
        ),
        1..count,
    )
}

/// The process of generated `stacks`: choice `c` at level `l` is frame `fl_c`.
fn generated_process(stacks: &[GeneratedStack]) -> ProcessReport {
    let names: Vec<Vec<String>> = stacks
        .iter()
        .map(|(path, _, _)| {
            // Innermost first: the path's last choice is the innermost frame.
            let levels = path.iter().enumerate().rev();
            levels.map(|(level, c)| format!("f{level}_{c}")).collect()
        })
        .collect();
    let refs: Vec<Vec<&str>> = names
        .iter()
        .map(|frames| frames.iter().map(String::as_str).collect())
        .collect();
    let spec: Vec<(&[&str], u64, u64, u64)> = refs
        .iter()
        .zip(stacks)
        .map(|(frames, (_, (peak, live, freed), _))| {
            (frames.as_slice(), *peak, *live, *live + *freed)
        })
        .collect();
    let mut p = process(&spec);
    for (stack, (_, _, numpy)) in p.stacks.iter_mut().zip(stacks) {
        if *numpy {
            stack.category = Category::Numpy;
        }
    }
    p
}

proptest! {
    /// Whatever the stacks and the share: every figure's sum stays (per category), a stack
    /// that matters alone stays as it was, merged entries and only they start with the
    /// marker, and the frame table holds each frame some list uses, once.
    #[test]
    fn pruning_keeps_every_sum_and_every_stack_that_matters(
        stacks in generated_stacks(6, 50, 60),
        share in 2u64..50,
    ) {
        let mut p = generated_process(&stacks);
        let before = sums(&p);
        let limits = Limits::of(&p, share);
        let mattering: Vec<(u32, Vec<String>)> = p
            .stacks
            .iter()
            .filter(|s| limits.matter(weighed(s)))
            .map(|s| (s.id, p.frames_of(&s.frames).map(FrameReport::label).collect()))
            .collect();

        prune_past(&mut p, 0, share);

        prop_assert_eq!(sums(&p), before);
        for (id, labels) in &mattering {
            let kept = p.stacks.iter().find(|s| s.id == *id && s.merged_stacks == 1);
            let kept = kept.map(|s| p.frames_of(&s.frames).map(FrameReport::label).collect::<Vec<_>>());
            prop_assert_eq!(kept.as_ref(), Some(labels));
        }
        for s in &p.stacks {
            let first = p.frames_of(&s.frames).next().map(FrameReport::label);
            let marked = first.as_deref() == Some(SMALLER_STACKS_LABEL);
            prop_assert_eq!(marked, s.merged_stacks > 1);
            prop_assert!(!marked || s.site.is_none());
        }
        let used: HashSet<u32> = p.stacks.iter().flat_map(|s| s.frames.iter().copied()).collect();
        prop_assert_eq!(used.len(), p.frames.len());
        prop_assert!(used.iter().all(|&f| (f as usize) < p.frames.len()));
        let distinct: HashSet<String> = p.frames.iter().map(FrameReport::label).collect();
        prop_assert_eq!(distinct.len(), p.frames.len());
        let order: Vec<_> = p
            .stacks
            .iter()
            .map(|s| (Reverse(s.at_peak_bytes), Reverse(s.allocated_bytes), s.id))
            .collect();
        prop_assert!(order.windows(2).all(|pair| pair[0] <= pair[1]));
    }
}

/// One entry as the model below gives it: its id, labels (innermost first), how many
/// stacks it holds and the bytes they allocated.
type ModelEntry = (u32, Vec<String>, u64, u64);

/// The reference the walk is held to: the small stacks fully sorted from their outermost
/// frames, and their call tree walked one frame at a time.
fn model(p: &ProcessReport, share: u64) -> Vec<ModelEntry> {
    let limits = Limits::of(p, share);
    let labels_of = |frames: &[u32]| p.frames_of(frames).map(FrameReport::label).collect();
    let (kept, mut small): (Vec<&StackReport>, Vec<&StackReport>) =
        p.stacks.iter().partition(|s| limits.matter(weighed(s)));
    let mut entries: Vec<ModelEntry> = kept
        .iter()
        .map(|s| (s.id, labels_of(&s.frames), 1, s.allocated_bytes))
        .collect();
    small.sort_by(|a, b| {
        (a.category)
            .cmp(&b.category)
            .then_with(|| a.frames.iter().rev().cmp(b.frames.iter().rev()))
    });
    for category in small.chunk_by(|a, b| a.category == b.category) {
        model_walk(category, 0, &limits, &mut |stacks, shared| {
            let first = stacks[0];
            let mut labels: Vec<String> = labels_of(&first.frames[first.frames.len() - shared..]);
            if stacks.len() > 1 {
                labels.insert(0, SMALLER_STACKS_LABEL.to_owned());
            }
            let id = stacks.iter().map(|s| s.id).min().unwrap_or(0);
            let count = stacks.len() as u64;
            let allocated = stacks.iter().map(|s| s.allocated_bytes).sum();
            entries.push((id, labels, count, allocated));
        });
    }
    entries.sort();
    entries
}

/// The model's walk of sorted `stacks` sharing `depth` outer frames; `emit` gets each
/// entry's stacks and how many outer frames it shows.
fn model_walk(
    stacks: &[&StackReport],
    depth: usize,
    limits: &Limits,
    emit: &mut dyn FnMut(&[&StackReport], usize),
) {
    let frame_at = |s: &StackReport, depth: usize| {
        s.frames.len().checked_sub(depth + 1).map(|at| s.frames[at])
    };
    let mut small: Vec<&[&StackReport]> = Vec::new();
    for part in stacks.chunk_by(|a, b| frame_at(a, depth) == frame_at(b, depth)) {
        let weight = part.iter().fold([0u64; 3], |sum, s| {
            let w = weighed(s);
            [sum[0] + w[0], sum[1] + w[1], sum[2] + w[2]]
        });
        if frame_at(part[0], depth).is_none() {
            part.iter().for_each(|s| emit(&[s], s.frames.len()));
        } else if part.len() > 1 && limits.matter(weight) {
            model_walk(part, depth + 1, limits, emit);
        } else {
            small.push(part);
        }
    }
    match small.as_slice() {
        [] => {}
        [only] if only.len() == 1 => emit(only, only[0].frames.len()),
        [only] => {
            let (first, last) = (only[0], only[only.len() - 1]);
            let shared = (depth..)
                .take_while(|&d| {
                    frame_at(first, d).is_some() && frame_at(first, d) == frame_at(last, d)
                })
                .count()
                + depth;
            emit(only, shared);
        }
        parts => emit(&parts.concat(), depth),
    }
}

proptest! {
    /// The walk merges exactly the stacks the model merges, under the same frames: it
    /// sorts each branch by its next frame only, and skips at once the frames a branch
    /// shares, where the model sorts every stack whole and steps one frame at a time.
    #[test]
    fn pruning_merges_as_a_walk_one_frame_at_a_time_does(
        stacks in generated_stacks(8, 20, 80),
        share in 2u64..60,
    ) {
        let mut p = generated_process(&stacks);
        let expected = model(&p, share);

        prune_past(&mut p, 0, share);

        let mut got: Vec<ModelEntry> = p
            .stacks
            .iter()
            .map(|s| {
                let labels = p.frames_of(&s.frames).map(FrameReport::label).collect();
                (s.id, labels, s.merged_stacks, s.allocated_bytes)
            })
            .collect();
        got.sort();
        prop_assert_eq!(got, expected);
    }
}
