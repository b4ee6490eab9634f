//! Property tests of the reader against corrupt and truncated files: valid synthetic
//! profiles with bits flipped, bytes overwritten, fields set to extreme values, the layout
//! rewritten and the file cut, each read, analysed and reported; an error is fine, a panic
//! is not. `PROPTEST_CASES=20000` searches longer.

use std::collections::BTreeMap;
use std::mem::offset_of;

use memwarden_abi::python::{category, python_frame, CodeRecord, NUMPY_DATA};
use memwarden_abi::{
    error_kind, failed_function, guard_mode, leak_kind, ErrorRecord, FailureRecord, Header, Layout,
    LeakRecord, ModuleRecord, StackRecord, MODULE_MAIN, MODULE_VDSO,
};
use proptest::prelude::*;
use proptest::test_runner::Config;

use super::plain::layout_fields;
use super::synthetic::{leak_record, stack_record, ProfileBuilder, SyntheticCode, SyntheticModule};
use super::{read_profile, Profile};
use crate::analysis::analyze;
use crate::report::folded::Measure;
use crate::report::{generate, json, text, write_files, Options};
use crate::symbolize::Symbolizer;
use crate::Exit;

fn figures(live: i64, allocated: u64, peak: u64) -> StackRecord {
    let mut r = stack_record();
    (r.live_bytes, r.live_blocks, r.max_live_bytes) = (live, 2, live);
    (r.snap_bytes, r.snap_blocks, r.snap_peak) = (live / 2, 1, peak);
    (r.allocated_bytes, r.allocations, r.frees) = (allocated, 3, 1);
    r
}

/// Native stacks in two modules (one the main executable, one the vDSO), a command line,
/// an exit and a crash.
fn native() -> ProfileBuilder {
    let mut builder = ProfileBuilder::new(100)
        .argv(&["./prog", "--flag"])
        .exit(Some(Exit::Signal(11)))
        .start_ns(1_000)
        .heap(48, 80)
        .module(SyntheticModule {
            build_id: vec![1, 2, 3, 4],
            ..SyntheticModule::at("/no/libz.so.1", 0x7f00_0000_1000, 0)
        })
        .module(SyntheticModule::at(
            "/no/prog",
            0x5555_0000_0000,
            MODULE_MAIN,
        ))
        .module(SyntheticModule::at("[vdso]", 0x7fff_0000_0000, MODULE_VDSO))
        .stack(&[0x5555_0000_0234, 0x5555_0000_0200], figures(32, 64, 80))
        .stack(&[0x7f00_0000_1500, 0x5555_0000_0100], figures(16, 16, 80))
        .stack(&[0x7fff_0000_0010, 0x1234], figures(0, 8, 0))
        .crash(11, &[0x5555_0000_0230, 0x5555_0000_0200]);
    builder.header.peak_time_ns = 500;
    builder.header.end_time_ns = 900;
    builder.unknown_stack.allocations = 4;
    builder
}

fn code(name: &str, line_table: Vec<u8>) -> SyntheticCode {
    SyntheticCode {
        filename: format!("/no/{name}.py"),
        name: name.into(),
        qualname: format!("Maker.{name}"),
        first_line: 4,
        line_table,
    }
}

/// Python code records (with and without a line table) and stacks mixing Python frames,
/// native frames and the NumPy marker.
fn python() -> ProfileBuilder {
    let mut numpy = figures(64, 64, 64);
    numpy.category = category::NUMPY;
    ProfileBuilder::new(200)
        .python_version(0x030b_07f0)
        .heap(64, 64)
        .module(SyntheticModule::at("/no/python3", 0x40_0000, MODULE_MAIN))
        .python_code(code("make", vec![0x80 | (10 << 3), 0, 0, 0xd8, 2, 0x90, 4]))
        .python_code(code("<module>", vec![]))
        .python_code(code("helper", vec![0x80 | (15 << 3) | 2, 4, 0x81, 0x82, 6]))
        .stack(
            &[
                NUMPY_DATA,
                0x40_0100,
                python_frame(0, 3, false),
                python_frame(1, 9, true),
            ],
            numpy,
        )
        .stack(
            &[python_frame(2, 40, false), python_frame(0, 2, false)],
            figures(8, 24, 64),
        )
}

fn failure(seq: u64, stack: u32, function: u32) -> FailureRecord {
    let size = 100 * seq;
    FailureRecord {
        seq,
        size,
        stack,
        function,
        ..Default::default()
    }
}

fn heap_error(kind: u32, stack: u32, alloc_stack: u32, free_stack: u32) -> ErrorRecord {
    ErrorRecord {
        kind,
        stack,
        alloc_stack,
        free_stack,
        block_size: 100,
        ..Default::default()
    }
}

/// The leak records of the faults profile.
fn leaks() -> [LeakRecord; 2] {
    [
        leak_record(1, leak_kind::DEFINITE, 1, 77),
        leak_record(2, leak_kind::INDIRECT, 4, 128),
    ]
}

/// Injected failures, heap errors and leak records.
fn faults() -> Vec<u8> {
    let builder = ProfileBuilder::new(300)
        .guard_mode(guard_mode::HEADER)
        .heap(100, 200)
        .stack(&[0x1000, 0x2000], figures(77, 100, 200))
        .stack(&[0x3000], figures(128, 128, 200))
        .failure(failure(1, 1, failed_function::MALLOC))
        .failure(failure(2, 0, failed_function::OPERATOR_NEW))
        .error(heap_error(error_kind::HEAP_BUFFER_OVERFLOW, 1, 2, 0))
        .error(heap_error(error_kind::DOUBLE_FREE, 2, 1, 2));
    leaks()
        .into_iter()
        .fold(builder, ProfileBuilder::leak)
        .build()
}

/// The valid profiles the corruptions start from.
fn originals() -> Vec<Vec<u8>> {
    vec![native().build(), python().build(), faults()]
}

fn poke(bytes: &mut [u8], at: usize, value: &[u8]) {
    if let Some(place) = at
        .checked_add(value.len())
        .and_then(|end| bytes.get_mut(at..end))
    {
        place.copy_from_slice(value);
    }
}

fn header_of(bytes: &[u8]) -> Option<Header> {
    super::plain::read_plain::<Header>(bytes, 0)
}

/// The byte ranges worth corrupting: the header's fields and every region in use (as far
/// as the file goes).
fn hot_ranges(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut ranges = vec![(0, offset_of!(Header, argv) + 64)];
    let Some(h) = header_of(bytes) else {
        return ranges;
    };
    let l = h.layout;
    let region = |start: u64, count: u64, size: usize| {
        (
            start,
            start.saturating_add(count.saturating_mul(size as u64)),
        )
    };
    let regions = [
        region(l.modules_offset, h.module_count, size_of::<ModuleRecord>()),
        region(l.stacks_offset, h.stack_count, size_of::<StackRecord>()),
        region(l.frames_offset, h.frame_words_used, 8),
        region(
            l.failures_offset,
            h.failure_count,
            size_of::<FailureRecord>(),
        ),
        region(l.errors_offset, h.error_count, size_of::<ErrorRecord>()),
        region(l.codes_offset, h.code_count, size_of::<CodeRecord>()),
        region(l.blob_offset, h.blob_used, 1),
        region(l.leaks_offset, h.leak_record_count, size_of::<LeakRecord>()),
    ];
    let len = bytes.len() as u64;
    for (start, end) in regions {
        let end = end.min(len);
        if start < end {
            ranges.push((start as usize, end as usize));
        }
    }
    ranges
}

/// Values that break assumptions: the edges of every width, and sizes around the file's.
fn extreme(choice: u8, len: usize, random: u64) -> u64 {
    let len = len as u64;
    match choice % 12 {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => u64::MAX / 2,
        4 => u64::from(u32::MAX),
        5 => 1 << 32,
        6 => len,
        7 => len + 1,
        8 => len / 8,
        9 => random % 1024,
        10 => u64::from(u16::MAX),
        _ => random,
    }
}

/// One way to damage a file. `(range, at)` picks a position in one of the hot ranges.
#[derive(Clone, Debug)]
enum Corruption {
    /// Flip bit `.2` of the byte at `(range, at)`.
    Flip(usize, usize, u8),
    /// Overwrite bytes from `(range, at)` with these.
    Overwrite(usize, usize, Vec<u8>),
    /// Write an extreme value (`.3` chooses which, `.4` is random), as 8 bytes if `.2`,
    /// else 4, at `(range, at)` aligned.
    Word(usize, usize, bool, u8, u64),
    /// Rewrite the layout for other capacities (consistently when they fit).
    Relayout([u64; 8]),
    /// Cut the file to this share (per 65536) of its length, or to an absolute length.
    Truncate(u16, Option<usize>),
}

fn corruption() -> impl Strategy<Value = Corruption> {
    let capacity = prop_oneof![
        0u64..40,
        Just(u64::MAX),
        Just(u64::MAX / 64),
        Just(1 << 32),
        any::<u64>(),
    ];
    let spot = || (any::<usize>(), any::<usize>());
    prop_oneof![
        4 => (spot(), 0u8..8).prop_map(|((range, at), bit)| Corruption::Flip(range, at, bit)),
        2 => (spot(), prop::collection::vec(any::<u8>(), 1..32))
            .prop_map(|((range, at), new)| Corruption::Overwrite(range, at, new)),
        4 => (spot(), any::<bool>(), any::<u8>(), any::<u64>()).prop_map(
            |((range, at), wide, value, random)| Corruption::Word(range, at, wide, value, random)
        ),
        1 => prop::array::uniform8(capacity).prop_map(Corruption::Relayout),
        1 => (any::<u16>(), prop::option::weighted(0.2, 0usize..9000))
            .prop_map(|(share, absolute)| Corruption::Truncate(share, absolute)),
    ]
}

/// A position in one of the hot ranges of `bytes`.
fn hot(bytes: &[u8], range: usize, at: usize) -> usize {
    let ranges = hot_ranges(bytes);
    let (start, end) = ranges[range % ranges.len()];
    start + at % (end - start)
}

fn apply(bytes: &mut Vec<u8>, corruption: &Corruption) {
    match corruption {
        Corruption::Flip(range, at, bit) => {
            let at = hot(bytes, *range, *at);
            if let Some(byte) = bytes.get_mut(at) {
                *byte ^= 1 << bit;
            }
        }
        Corruption::Overwrite(range, at, new) => {
            let at = hot(bytes, *range, *at);
            poke(bytes, at, new);
        }
        Corruption::Word(range, at, wide, value, random) => {
            let at = hot(bytes, *range, *at) & !3;
            let value = extreme(*value, bytes.len(), *random);
            if *wide {
                poke(bytes, at & !7, &value.to_le_bytes());
            } else {
                poke(bytes, at, &(value as u32).to_le_bytes());
            }
        }
        Corruption::Relayout(c) => {
            let Some(current) = header_of(bytes).map(|h| h.layout) else {
                return;
            };
            let layout = Layout::new(c[0], c[1], c[2], c[3], c[4], c[5], c[6])
                .and_then(|l| l.with_leak_capacity(c[7]))
                .unwrap_or(Layout {
                    module_capacity: c[0],
                    stack_capacity: c[1],
                    frame_capacity: c[2],
                    failure_capacity: c[3],
                    error_capacity: c[4],
                    code_capacity: c[5],
                    blob_capacity: c[6],
                    leak_capacity: c[7],
                    ..current
                });
            for (offset, value) in layout_fields(&layout) {
                poke(
                    bytes,
                    offset_of!(Header, layout) + offset,
                    &value.to_le_bytes(),
                );
            }
        }
        Corruption::Truncate(share, absolute) => {
            let len = absolute.unwrap_or(bytes.len() * usize::from(*share) / 65536);
            bytes.truncate(len);
        }
    }
}

/// Reads `bytes` as `memwarden report` reads a profile file and, if they load, analyses
/// and reports them alone and next to `other` (same pid, another image).
fn read_and_report(bytes: &[u8], other: &Profile) {
    let Ok(profile) = read_profile(bytes) else {
        return;
    };
    let profiles = [profile, other.clone()];
    for profiles in [&profiles[..1], &profiles[..]] {
        let processes = analyze(profiles, &BTreeMap::new());
        let command = profiles[0].argv.clone();
        let mut report = json::build(
            command,
            &processes,
            &mut Symbolizer::new(),
            Default::default(),
        );
        let options = Options::default();
        options.leak_gate.mark_suppressed(&mut report);
        let _ = options.leak_gate.verdict(&report);
        let dir = tempfile::tempdir().expect("a temporary folder");
        let _ = write_files(dir.path(), &report);
        let style = text::Style {
            top: 5,
            colour: false,
            leak_kinds: options.leak_gate.kinds.clone(),
        };
        let _ = text::summary(&report, &style, &[]);
        let _ = serde_json::to_string(&report);
    }
}

/// Original `original` with `corruptions` applied.
fn corrupted(original: usize, corruptions: &[Corruption]) -> Vec<u8> {
    let mut bytes = originals().swap_remove(original);
    for corruption in corruptions {
        apply(&mut bytes, corruption);
    }
    bytes
}

fn check(original: usize, corruptions: &[Corruption]) {
    let other = read_profile(&native().build()[..]).expect("the originals are valid");
    read_and_report(&corrupted(original, corruptions), &other);
}

/// Writes `bytes` as the one profile of an output folder and runs `memwarden report` on it.
fn report_folder(bytes: &[u8]) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let raw = dir.path().join(memwarden_abi::RAW_DIR);
    std::fs::create_dir(&raw).expect("mkdir raw");
    std::fs::write(raw.join("100.mwp"), bytes).expect("write the profile");
    let _ = generate(dir.path(), &Options::default());
}

proptest! {
    #![proptest_config(Config {
        cases: Config::default().cases.max(256),
        failure_persistence: None,
        ..Config::default()
    })]

    #[test]
    fn one_corruption_never_panics(original in 0usize..3, corruption in corruption()) {
        check(original, &[corruption]);
    }

    #[test]
    fn several_corruptions_never_panic(
        original in 0usize..3,
        corruptions in prop::collection::vec(corruption(), 2..12),
    ) {
        check(original, &corruptions);
    }
}

proptest! {
    #![proptest_config(Config {
        cases: Config::default().cases.max(256) / 8,
        failure_persistence: None,
        ..Config::default()
    })]

    #[test]
    fn the_report_command_never_panics(
        original in 0usize..3,
        corruptions in prop::collection::vec(corruption(), 1..6),
    ) {
        report_folder(&corrupted(original, &corruptions));
    }
}

#[test]
fn the_originals_read_and_report() {
    for bytes in originals() {
        let profile = read_profile(&bytes[..]).unwrap();
        assert!(profile.stacks.len() >= 3);
        read_and_report(&bytes, &profile);
    }
    let faults = read_profile(&faults()[..]).unwrap();
    assert_eq!(faults.leaks.records, leaks());
    assert_eq!((faults.failures.len(), faults.errors.len()), (2, 2));
    let python = read_profile(&python().build()[..]).unwrap();
    assert_eq!(python.python_codes.len(), 3);
}

/// Figures that add up past `u64::MAX` (two stacks and two leaks of the largest sizes):
/// the analysis's sums, the leak totals and inferno's total for the flame graphs
/// overflowed (a panic where overflow is checked); they saturate now, and the graphs are
/// drawn scaled down.
#[test]
fn figures_that_add_up_past_u64_max_saturate() {
    let mut numpy = figures(i64::MAX, u64::MAX, 0);
    (numpy.allocations, numpy.frees, numpy.live_blocks) = (u64::MAX, u64::MAX, i64::MAX);
    numpy.category = category::NUMPY;
    let bytes = [1, 2, 3]
        .map(|stack| leak_record(stack, leak_kind::DEFINITE, u64::MAX, u64::MAX))
        .into_iter()
        .fold(
            ProfileBuilder::new(1)
                .heap(u64::MAX, 0)
                .stack(&[NUMPY_DATA, 0x1000], numpy)
                .stack(&[NUMPY_DATA, 0x2000], numpy)
                .stack(&[NUMPY_DATA, 0x3000], numpy),
            ProfileBuilder::leak,
        )
        .build();
    let profile = read_profile(&bytes[..]).unwrap();
    read_and_report(&bytes, &profile);
    let profiles = [profile.clone(), profile];
    let processes = analyze(&profiles, &BTreeMap::new());
    let totals = processes[0].totals;
    assert_eq!(totals.allocated_bytes, u64::MAX);
    assert_eq!(totals.allocations, u64::MAX);
    assert_eq!(totals.frees, u64::MAX);
    assert_eq!(processes[0].not_freed_bytes, u64::MAX);
    assert_eq!(processes[0].numpy.peak_bytes, u64::MAX);
    let report = json::build(
        vec![],
        &processes,
        &mut Symbolizer::new(),
        Default::default(),
    );
    let verdict = Options::default().leak_gate.verdict(&report);
    assert_eq!((verdict.bytes, verdict.blocks), (u64::MAX, u64::MAX));
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &report).unwrap();
    let svg = std::fs::read_to_string(dir.path().join(Measure::Allocated.svg_file())).unwrap();
    assert!(svg.contains("<svg"), "{svg}");
}
