//! Tests of the analysis: the peak rule against a model of the writer, exec inference,
//! exit precedence, stack order and totals.

use std::collections::BTreeMap;

use memwarden_abi::StackRecord;
use proptest::prelude::*;

use super::*;
use crate::profile::synthetic::{stack_record, ProfileBuilder};

/// The writer's accounting as `memwarden-abi` describes it, plus the ground truth: the
/// per-stack live bytes and blocks at the first moment the heap reached its maximum.
struct Writer {
    live: u64,
    peak: u64,
    stacks: Vec<StackRecord>,
    blocks: Vec<(usize, u64)>,
    max_live: u64,
    truth: Vec<(i64, i64)>,
}

impl Writer {
    fn new(stack_count: usize) -> Self {
        Writer {
            live: 0,
            peak: 0,
            stacks: vec![stack_record(); stack_count],
            blocks: Vec::new(),
            max_live: 0,
            truth: vec![(0, 0); stack_count],
        }
    }

    /// A stack touched after a commit first saves its (unchanged) live figures.
    fn touch(&mut self, s: usize) {
        let r = &mut self.stacks[s];
        if r.snap_peak != self.peak {
            (r.snap_bytes, r.snap_blocks, r.snap_peak) = (r.live_bytes, r.live_blocks, self.peak);
        }
    }

    fn alloc(&mut self, s: usize, size: u64) {
        self.touch(s);
        let r = &mut self.stacks[s];
        r.live_bytes += size as i64;
        r.live_blocks += 1;
        r.max_live_bytes = r.max_live_bytes.max(r.live_bytes);
        r.allocated_bytes += size;
        r.allocations += 1;
        self.blocks.push((s, size));
        self.live += size;
        if self.live > self.max_live {
            self.max_live = self.live;
            self.truth = self
                .stacks
                .iter()
                .map(|r| (r.live_bytes, r.live_blocks))
                .collect();
        }
    }

    /// A free starting while live > peak first commits the peak.
    fn free(&mut self, pick: usize) {
        if self.blocks.is_empty() {
            return;
        }
        let (s, size) = self.blocks.swap_remove(pick % self.blocks.len());
        if self.live > self.peak {
            self.peak = self.live;
        }
        self.touch(s);
        let r = &mut self.stacks[s];
        r.live_bytes -= size as i64;
        r.live_blocks -= 1;
        r.frees += 1;
        self.live -= size;
    }

    fn profile(&self) -> Profile {
        let mut builder = ProfileBuilder::new(7).heap(self.live, self.peak);
        builder.unknown_stack = self.stacks[0];
        for (i, record) in self.stacks.iter().enumerate().skip(1) {
            builder = builder.stack(&[0x1000 + i as u64, 0x2000], *record);
        }
        builder.build_profile()
    }
}

#[derive(Clone, Debug)]
enum Event {
    Alloc { stack: usize, size: u64 },
    Free { pick: usize },
}

fn events(stack_count: usize) -> impl Strategy<Value = Vec<Event>> {
    let event = prop_oneof![
        (0..stack_count, 1u64..5000).prop_map(|(stack, size)| Event::Alloc { stack, size }),
        any::<usize>().prop_map(|pick| Event::Free { pick }),
    ];
    proptest::collection::vec(event, 0..300)
}

proptest! {
    #[test]
    fn stacks_at_peak_add_up_to_the_exact_peak(events in events(6)) {
        let mut writer = Writer::new(6);
        for event in &events {
            match *event {
                Event::Alloc { stack, size } => writer.alloc(stack, size),
                Event::Free { pick } => writer.free(pick),
            }
        }
        let profile = writer.profile();
        let (peak, stacks) = process_peak(&profile);
        prop_assert_eq!(peak.bytes, writer.max_live);
        let sum: u64 = stacks.iter().map(|s| s.at_peak_bytes).sum();
        prop_assert_eq!(sum, peak.bytes);
        for s in &stacks {
            let (bytes, blocks) = writer.truth[s.stack.id as usize];
            prop_assert_eq!(s.at_peak_bytes, bytes as u64, "stack {}", s.stack.id);
            prop_assert_eq!(s.at_peak_blocks, blocks as u64, "stack {}", s.stack.id);
        }
        let truth_blocks: i64 = writer.truth.iter().map(|t| t.1).sum();
        prop_assert_eq!(peak.blocks, truth_blocks as u64);
        let analysed = analyze(std::slice::from_ref(&profile), &BTreeMap::new());
        prop_assert_eq!(analysed[0].not_freed_bytes, writer.live);
    }
}

#[test]
fn peak_still_rising_at_the_end_is_now_and_uses_the_rise_time() {
    let mut writer = Writer::new(3);
    writer.alloc(1, 100);
    writer.free(0);
    writer.alloc(2, 30);
    writer.alloc(1, 80);
    let mut profile = writer.profile();
    (profile.peak_time_ns, profile.rise_time_ns) = (5_000_000, 9_000_000);
    assert_eq!(
        (profile.live_bytes, profile.committed_peak_bytes),
        (110, 100)
    );
    let (peak, stacks) = process_peak(&profile);
    assert_eq!(
        peak,
        Peak {
            bytes: 110,
            blocks: 2,
            time_ns: 9_000_000
        }
    );
    let at_peak: Vec<_> = stacks
        .iter()
        .map(|s| (s.stack.id, s.at_peak_bytes))
        .collect();
    assert_eq!(at_peak, [(0, 0), (1, 80), (2, 30)]);
}

#[test]
fn committed_peak_uses_snapshots_and_the_peak_time() {
    let mut writer = Writer::new(3);
    writer.alloc(1, 100);
    writer.alloc(2, 50);
    writer.free(0); // commits 150, frees stack 1's block
    writer.alloc(2, 20);
    let mut profile = writer.profile();
    (profile.peak_time_ns, profile.rise_time_ns) = (5_000_000, 9_000_000);
    let (peak, stacks) = process_peak(&profile);
    assert_eq!(
        peak,
        Peak {
            bytes: 150,
            blocks: 2,
            time_ns: 5_000_000
        }
    );
    let figures: Vec<_> = stacks
        .iter()
        .map(|s| (s.stack.id, s.at_peak_bytes, s.live_bytes))
        .collect();
    assert_eq!(figures, [(0, 0, 0), (1, 100, 0), (2, 50, 70)]);
}

fn image(pid: u32, start_ns: u64, exit: Option<Exit>) -> Profile {
    ProfileBuilder::new(pid)
        .start_ns(start_ns)
        .exit(exit)
        .build_profile()
}

#[test]
fn exec_images_are_ordered_and_share_the_final_exit() {
    let profiles = [
        image(10, 2_000, Some(Exit::Code(3))), // after exec
        image(11, 1_500, None),
        image(10, 1_000, None), // before exec
    ];
    let reaped = BTreeMap::from([(11, Exit::Signal(9))]);
    let processes = analyze(&profiles, &reaped);
    let seen: Vec<_> = processes
        .iter()
        .map(|p| {
            (
                p.profile.pid,
                p.start_offset_ns,
                p.replaced_by_exec,
                p.exit,
                p.exit_source,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (10, 0, true, Some(Exit::Code(3)), Some(ExitSource::Recorded)),
            (
                11,
                500,
                false,
                Some(Exit::Signal(9)),
                Some(ExitSource::Reaped)
            ),
            (
                10,
                1_000,
                false,
                Some(Exit::Code(3)),
                Some(ExitSource::Recorded)
            ),
        ]
    );
}

#[test]
fn reaped_status_wins_over_the_recorded_one() {
    let profiles = [image(10, 1, None), image(10, 2, Some(Exit::Code(0)))];
    let reaped = BTreeMap::from([(10, Exit::Signal(9))]);
    let processes = analyze(&profiles, &reaped);
    for p in &processes {
        assert_eq!(
            (p.exit, p.exit_source),
            (Some(Exit::Signal(9)), Some(ExitSource::Reaped))
        );
    }
    assert!(processes[0].replaced_by_exec);
    assert!(!processes[1].replaced_by_exec);
}

#[test]
fn unknown_exit_without_a_later_image_stays_unknown() {
    let profiles = [image(10, 1, None)];
    let processes = analyze(&profiles, &BTreeMap::new());
    assert_eq!((processes[0].exit, processes[0].exit_source), (None, None));
    assert!(!processes[0].replaced_by_exec);
}

#[test]
fn an_earlier_image_that_recorded_its_end_is_a_reused_pid_not_an_exec() {
    let profiles = [image(10, 1, Some(Exit::Code(1))), image(10, 2, None)];
    let reaped = BTreeMap::from([(10, Exit::Code(0))]);
    let processes = analyze(&profiles, &reaped);
    assert!(!processes[0].replaced_by_exec);
    assert_eq!(processes[0].exit, Some(Exit::Code(1)));
    assert_eq!(processes[1].exit, Some(Exit::Code(0)));
}

#[test]
fn stacks_are_sorted_filtered_and_totalled() {
    let stack = |live: i64, allocated: u64, allocations: u64, frees: u64| {
        let mut r = stack_record();
        (r.live_bytes, r.live_blocks) = (live, allocations.saturating_sub(frees) as i64);
        (r.allocated_bytes, r.allocations, r.frees) = (allocated, allocations, frees);
        r
    };
    let profile = ProfileBuilder::new(1)
        .heap(300, 0)
        .stack(&[1], stack(100, 100, 1, 0))
        .stack(&[2], stack(0, 500, 5, 5))
        .stack(&[3], stack(200, 200, 2, 0))
        .stack(&[4], stack(0, 0, 0, 0))
        .stack(&[5], stack(0, 900, 9, 9))
        .build_profile();
    let p = &analyze(std::slice::from_ref(&profile), &BTreeMap::new())[0];
    let ids: Vec<_> = p.stacks.iter().map(|s| s.stack.id).collect();
    // By bytes at the peak (live > committed: live figures), then bytes allocated; the
    // empty stack 4 and the empty unknown stack 0 are left out.
    assert_eq!(ids, [3, 1, 5, 2]);
    assert_eq!(
        p.totals,
        Totals {
            allocated_bytes: 1700,
            allocations: 17,
            frees: 14
        }
    );
    assert_eq!((p.not_freed_bytes, p.not_freed_blocks), (300, 3));
    assert_eq!((p.peak.bytes, p.peak.blocks), (300, 3));
}

#[test]
fn negative_live_figures_are_clamped() {
    let mut r = stack_record();
    (r.live_bytes, r.live_blocks, r.frees) = (-64, -1, 1);
    let profile = ProfileBuilder::new(1).stack(&[1], r).build_profile();
    let p = &analyze(std::slice::from_ref(&profile), &BTreeMap::new())[0];
    assert_eq!((p.stacks[0].live_bytes, p.stacks[0].live_blocks), (0, 0));
    assert_eq!(p.not_freed_bytes, 0);
}
