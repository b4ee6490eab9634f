//! The hand-written report.json against serde's serialization of the same report: the
//! same bytes, for every field and every kind of string.

use proptest::prelude::*;

use super::*;
use crate::analysis::ExitSource;
use crate::python::Category;
use crate::report::json::{FrameKind, REPORT_FORMAT_VERSION};
use crate::report::leaks::LeakSummary;
use crate::report::prune::Pruned;
use crate::report::test_report::{process_report, python_frame, stack_report};
use crate::Exit;

fn hand_written(report: &Report) -> String {
    let mut out = Vec::new();
    write_report(&mut out, report).unwrap();
    String::from_utf8(out).unwrap()
}

fn assert_same_as_serde(report: &Report) {
    assert_eq!(hand_written(report), serde_json::to_string(report).unwrap());
}

fn report_of(processes: Vec<ProcessReport>) -> Report {
    Report {
        format_version: REPORT_FORMAT_VERSION,
        command: vec!["prog".into(), "a \"quoted\" arg".into()],
        processes,
    }
}

/// A process with every optional field filled and frames of every kind.
fn full_process() -> ProcessReport {
    let mut p = process_report(100, &["prog", "tab\there"]);
    p.exit = Some(Exit::Signal(9));
    p.exit_source = Some(ExitSource::Reaped);
    p.degraded = Some("file_grow_failed".into());
    p.start_time_ms = 1.5;
    p.duration_ms = Some(2500.125);
    p.peak_time_ms = 0.001;
    p.python_version = Some("3.11.7".into());
    p.leak_summary = Some(LeakSummary::default());
    p.pruned = Some(Pruned {
        profile_stacks: 200_000,
        merged_stacks: 190_000,
        merged_entries: 1_200,
        share: 10_000,
    });
    let mut numpy = stack_report(&mut p, 7, &["PyDataMem_UserNEW", "main"], 4096, 0, u64::MAX);
    numpy.category = Category::Numpy;
    numpy.site = None;
    numpy.merged_stacks = 3;
    let mut python = stack_report(&mut p, 8, &[], 64, 64, 64);
    python.category = Category::Python;
    python.frames = vec![super::super::test_report::intern(
        &mut p,
        python_frame("/src/script \"q\".py", 12, "<module>"),
    )];
    p.frames.push(FrameReport {
        function: Some("[pymalloc arenas]".into()),
        file: None,
        line: None,
        module: None,
        address: None,
        inlined: true,
        kind: FrameKind::Arena,
    });
    p.frames.push(FrameReport {
        function: Some("back\\slash \u{1} é".into()),
        file: Some("/src/a.c".into()),
        line: Some(u32::MAX),
        module: Some("/lib/libc.so.6".into()),
        address: Some("0xdeadbeef".into()),
        inlined: false,
        kind: FrameKind::Elided,
    });
    p.stacks = vec![numpy, python];
    p
}

#[test]
fn names_are_those_serde_writes() {
    for category in [Category::Native, Category::Python, Category::Numpy] {
        let serde = serde_json::to_string(&category).unwrap();
        assert_eq!(serde, format!("\"{}\"", category.name()));
    }
    for kind in [
        FrameKind::Native,
        FrameKind::Python,
        FrameKind::Arena,
        FrameKind::Elided,
    ] {
        let serde = serde_json::to_string(&kind).unwrap();
        assert_eq!(serde, format!("\"{}\"", kind.name()));
    }
}

#[test]
fn an_empty_report_and_an_empty_process_are_written_as_serde_writes_them() {
    assert_same_as_serde(&report_of(Vec::new()));
    assert_same_as_serde(&report_of(vec![process_report(1, &[])]));
}

#[test]
fn every_field_is_written_as_serde_writes_it() {
    let report = report_of(vec![full_process(), process_report(101, &["child"])]);
    assert_same_as_serde(&report);
    // And reads back as the report it was.
    let read: Report = serde_json::from_str(&hand_written(&report)).unwrap();
    assert_eq!(read.processes[0].frames, report.processes[0].frames);
    assert_eq!(read.processes[0].stacks.len(), 2);
}

#[test]
fn arrays_longer_than_a_batch_are_written_whole() {
    let mut p = process_report(100, &["prog"]);
    let names: Vec<String> = (0..3000).map(|i| format!("function_{i}")).collect();
    let functions: Vec<&str> = names.iter().map(String::as_str).collect();
    p.stacks = (0..400u32)
        .map(|id| {
            let from = (id as usize * 7) % 2900;
            stack_report(&mut p, id, &functions[from..from + 60], 8, 0, 16)
        })
        .collect();
    let text = hand_written(&report_of(vec![p.clone()]));
    assert!(text.len() > 4 * BATCH);
    assert_same_as_serde(&report_of(vec![p]));
}

proptest! {
    #[test]
    fn any_frame_text_and_figures_are_written_as_serde_writes_them(
        function in proptest::option::of(any::<String>()),
        file in proptest::option::of("[ -~\\t\\n\u{0}-\u{1f}é\u{2028}]{0,40}"),
        line in proptest::option::of(any::<u32>()),
        figures in proptest::array::uniform8(any::<u64>()),
        frames in proptest::collection::vec(any::<u32>(), 0..50),
        inlined in any::<bool>(),
    ) {
        let mut p = process_report(1, &["prog"]);
        p.frames.push(FrameReport {
            function,
            file,
            line,
            module: None,
            address: Some("0x1".into()),
            inlined,
            kind: FrameKind::Native,
        });
        let mut stack = stack_report(&mut p, 1, &["f"], 0, 0, 0);
        stack.frames = frames;
        [
            stack.at_peak_bytes,
            stack.at_peak_blocks,
            stack.live_bytes,
            stack.live_blocks,
            stack.max_live_bytes,
            stack.allocated_bytes,
            stack.allocations,
            stack.frees,
        ] = figures;
        p.stacks.push(stack);
        let report = report_of(vec![p]);
        prop_assert_eq!(hand_written(&report), serde_json::to_string(&report).unwrap());
    }
}
