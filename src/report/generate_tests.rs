//! Tests of the whole reading half on a synthetic output folder: profiles and run.json
//! in, report.json, collapsed stacks, SVGs and summary out; bad folders refused.

use std::fs;
use std::path::Path;

use super::*;
use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticModule};
use crate::report::read::parse_with_frames_inlined;
use crate::run_record::{RunRecord, RUN_RECORD_FILE};
use crate::Exit;

/// Two images of pid 100 (before and after exec) and a child, pid 101, that leaked.
fn write_run(dir: &Path) {
    let raw = dir.join("raw");
    fs::create_dir_all(&raw).unwrap();
    let before_exec = ProfileBuilder::new(100)
        .argv(&["sh", "-c", "prog a"])
        .start_ns(0);

    let mut big = stack_record();
    (big.live_bytes, big.live_blocks) = (16, 1);
    (big.snap_bytes, big.snap_blocks, big.snap_peak) = (4000, 2, 4096);
    (
        big.max_live_bytes,
        big.allocated_bytes,
        big.allocations,
        big.frees,
    ) = (4000, 4016, 3, 2);
    let mut small = stack_record();
    (small.snap_bytes, small.snap_blocks, small.snap_peak) = (96, 1, 4096);
    (
        small.max_live_bytes,
        small.allocated_bytes,
        small.allocations,
        small.frees,
    ) = (96, 96, 1, 1);
    let mut after_exec = ProfileBuilder::new(100)
        .argv(&["prog", "a"])
        .start_ns(2_500_000)
        .heap(16, 4096)
        .stack(&[0x5000], big)
        .stack(&[0x6000, 0x7000], small);
    after_exec.header.peak_time_ns = 1_500_000;

    let mut leak = stack_record();
    (leak.live_bytes, leak.live_blocks, leak.max_live_bytes) = (64, 1, 64);
    (leak.allocated_bytes, leak.allocations) = (64, 1);
    let child = ProfileBuilder::new(101)
        .argv(&["prog", "child"])
        .start_ns(3_000_000)
        .heap(64, 0)
        .exit(Some(Exit::Code(1)))
        .module(SyntheticModule {
            path: "/opt/mw/libmemwarden.so".into(),
            start: 0x9000,
            end: 0xa000,
            ..SyntheticModule::default()
        })
        // The profiler's own frame (its wrapper around main) is left out of the report.
        .stack(&[0x8000, 0x9100], leak);

    fs::write(raw.join("100-1.mwp"), before_exec.build()).unwrap();
    fs::write(raw.join("100-2.mwp"), after_exec.build()).unwrap();
    fs::write(raw.join("101.mwp"), child.build()).unwrap();
    let mut run = RunRecord::new(vec!["sh".into(), "-c".into(), "prog a".into()], None, 0);
    run.root_pid = Some(100);
    run.complete = true;
    run.exits.insert(100, Exit::Signal(9));
    run.write(&dir.join(RUN_RECORD_FILE)).unwrap();
}

#[test]
fn a_folder_becomes_a_report_files_and_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let done = generate(dir.path(), &Options::default()).unwrap();
    assert_eq!(done.files.len(), 11);
    for name in [
        "report.json",
        "peak.svg",
        "peak.folded",
        "not-freed.svg",
        "allocated.folded",
        "numpy-peak.svg",
        "numpy-peak.folded",
        "leaked.svg",
        "leaked.folded",
    ] {
        assert!(dir.path().join(name).is_file(), "{name}");
    }

    let json: serde_json::Value =
        parse_with_frames_inlined(&fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(json["format_version"], 8);
    assert_eq!(json["command"], serde_json::json!(["sh", "-c", "prog a"]));
    let processes = json["processes"].as_array().unwrap();
    let summary: Vec<_> = processes
        .iter()
        .map(|p| {
            (
                p["pid"].clone(),
                p["replaced_by_exec"].clone(),
                p["exit"].clone(),
                p["exit_source"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                100.into(),
                true.into(),
                serde_json::json!({"signal": 9}),
                "reaped".into()
            ),
            (
                100.into(),
                false.into(),
                serde_json::json!({"signal": 9}),
                "reaped".into()
            ),
            (
                101.into(),
                false.into(),
                serde_json::json!({"code": 1}),
                "recorded".into()
            ),
        ]
    );
    let prog = &processes[1];
    assert_eq!(prog["start_time_ms"], 2.5);
    assert_eq!(prog["peak_bytes"], 4096);
    assert_eq!(prog["peak_blocks"], 3);
    assert_eq!(prog["peak_time_ms"], 1.5);
    assert_eq!(prog["not_freed_bytes"], 16);
    assert_eq!(
        prog["totals"],
        serde_json::json!({"allocated_bytes": 4112, "allocations": 4, "frees": 3})
    );
    assert_eq!(prog["stacks"][0]["at_peak_bytes"], 4000);
    assert_eq!(
        prog["stacks"][1]["frames"],
        serde_json::json!([
            {"function": null, "file": null, "line": null, "module": null, "address": "0x6000", "inlined": false, "kind": "native"},
            {"function": null, "file": null, "line": null, "module": null, "address": "0x7000", "inlined": false, "kind": "native"},
        ])
    );
    assert_eq!(processes[0]["stacks"], serde_json::json!([]));

    let peak = fs::read_to_string(dir.path().join("peak.folded")).unwrap();
    assert_eq!(peak, "pid 100: prog a;0x5000 4000\npid 100: prog a;0x7000;0x6000 96\npid 101: prog child;0x8000 64\n");
    let not_freed = fs::read_to_string(dir.path().join("not-freed.folded")).unwrap();
    assert_eq!(
        not_freed,
        "pid 100: prog a;0x5000 16\npid 101: prog child;0x8000 64\n"
    );
    let svg = fs::read_to_string(dir.path().join("not-freed.svg")).unwrap();
    assert!(svg.contains("0x8000 (64 bytes"), "{svg}");

    assert!(done
        .summary
        .starts_with("memwarden: sh -c prog a (3 processes)\n"));
    assert!(done.summary.contains("pid 100: prog a\n  exit         killed by signal 9 (SIGKILL)\n  peak heap    4.0 KiB (4,096 bytes) in 3 blocks, at 1.5 ms\n"));
    assert!(done
        .summary
        .contains("  at the peak     3.9 KiB  97.7%  0x5000\n"));
    assert!(done.summary.trim_end().ends_with("(and .folded)"));
}

#[test]
fn an_empty_measure_still_gets_an_svg_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("raw")).unwrap();
    fs::write(
        dir.path().join("raw/1.mwp"),
        ProfileBuilder::new(1).argv(&["true"]).build(),
    )
    .unwrap();
    let done = generate(dir.path(), &Options::default()).unwrap();
    assert!(done.summary.contains("note: no run.json"));
    assert_eq!(done.report.command, ["true"]);
    let svg = fs::read_to_string(dir.path().join("not-freed.svg")).unwrap();
    assert!(svg.contains("Every byte was freed before exit"));
    assert_eq!(
        fs::read_to_string(dir.path().join("peak.folded")).unwrap(),
        ""
    );
}

#[test]
fn bad_folders_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let message = |path: &Path| generate(path, &Options::default()).unwrap_err().to_string();
    assert_eq!(
        message(&missing),
        format!(
            "{}: not a memwarden output folder (no such folder)",
            missing.display()
        )
    );
    assert_eq!(
        message(dir.path()),
        format!(
            "{}: not a memwarden output folder (it has no raw/ folder)",
            dir.path().display()
        )
    );
    let raw = dir.path().join("raw");
    fs::create_dir(&raw).unwrap();
    assert_eq!(
        message(dir.path()),
        format!(
            "{}: no profiles (*.mwp) found; did the program run under memwarden?",
            raw.display()
        )
    );
    fs::write(raw.join("1.mwp"), ProfileBuilder::new(1).build()).unwrap();
    let corrupt = raw.join("2.mwp");
    fs::write(&corrupt, vec![0xffu8; 9000]).unwrap();
    let text = message(dir.path());
    assert!(
        text.starts_with(&format!("{}: not a memwarden profile", corrupt.display())),
        "{text}"
    );
    fs::remove_file(&corrupt).unwrap();
    fs::write(dir.path().join(RUN_RECORD_FILE), "[]").unwrap();
    assert!(message(dir.path()).contains("run.json: not a valid run record"));
}

#[test]
fn injected_failures_and_the_crash_are_reported_with_their_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw");
    fs::create_dir_all(&raw).unwrap();
    let mut held = stack_record();
    (
        held.live_bytes,
        held.live_blocks,
        held.allocated_bytes,
        held.allocations,
    ) = (8, 1, 8, 1);
    let failure = |seq, stack, function, rule| memwarden_abi::FailureRecord {
        seq,
        call: 3,
        size: 1 << 20,
        time_ns: 2_500_000,
        stack,
        function,
        rule,
        reserved: 0,
    };
    let mut builder = ProfileBuilder::new(300)
        .argv(&["prog"])
        .heap(8, 0)
        .module(SyntheticModule {
            path: "/t/prog".into(),
            base: 0x4000,
            start: 0x5000,
            end: 0x6000,
            ..SyntheticModule::default()
        })
        .stack(&[0x5010, 0x5020], held)
        // Interned for the failed call: no figures, so not in `stacks`.
        .stack(&[0x5030], stack_record())
        .failure(failure(1, 2, memwarden_abi::failed_function::MALLOC, 0))
        .failure(failure(
            2,
            0,
            memwarden_abi::failed_function::OPERATOR_NEW_ARRAY,
            1,
        ))
        .crash(11, &[0x5000, 0x5020]);
    builder.header.failure_count = 7;
    fs::write(raw.join("300-1.mwp"), builder.build()).unwrap();

    let done = generate(dir.path(), &Options::default()).unwrap();
    let json: serde_json::Value =
        parse_with_frames_inlined(&fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    let p = &json["processes"][0];
    let key = |frames: &[(&[u8], u64)]| {
        format!(
            "{:016x}",
            memwarden_faults::site_key(&mut frames.iter().copied())
        )
    };
    let frame = |address: &str| {
        serde_json::json!({"function": null, "file": null, "line": null,
            "module": "/t/prog", "address": address, "inlined": false, "kind": "native"})
    };
    assert_eq!(p["injected_failure_count"], 7);
    assert_eq!(
        p["injected_failures"],
        serde_json::json!([
            {"seq": 1, "call": 3, "function": "malloc", "size": 1048576, "rule": 1,
             "time_ms": 2.5, "stack_id": 2, "site": key(&[(b"prog", 0x1030)]),
             "frames": [frame("0x5030")], "pid": 300},
            {"seq": 2, "call": 3, "function": "operator new[]", "size": 1048576, "rule": 2,
             "time_ms": 2.5, "stack_id": 0, "site": null,
             "frames": [{"function": "[unknown stack]", "file": null, "line": null,
                         "module": null, "address": null, "inlined": false, "kind": "native"}],
             "pid": 300},
        ])
    );
    // Frame 0 of a crash is the faulting instruction: 0x5000 is inside the module (as a
    // return address it would not be).
    assert_eq!(
        p["crash"],
        serde_json::json!({"signal": 11, "frames": [frame("0x5000"), frame("0x5020")]})
    );
    assert_eq!(p["stacks"].as_array().unwrap().len(), 1);
    assert_eq!(
        p["stacks"][0]["site"],
        key(&[(b"prog", 0x1010), (b"prog", 0x1020)])
    );
    assert!(done.summary.contains(
        "  injected     7 allocation failures (rule 1: 1, rule 2: 1, 5 more not stored)\n  first failed malloc of 1.0 MiB (1,048,576 bytes) at 0x5030 [prog]\n  crashed      SIGSEGV at 0x5000 [prog] <- 0x5020 [prog]\n"
    ), "{}", done.summary);
}

#[test]
fn stacks_name_their_frames_by_index_into_one_table_per_process() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw");
    fs::create_dir_all(&raw).unwrap();
    let mut record = stack_record();
    (record.live_bytes, record.live_blocks, record.max_live_bytes) = (8, 1, 8);
    (record.allocated_bytes, record.allocations) = (8, 1);
    let mut bigger = record;
    (
        bigger.live_bytes,
        bigger.max_live_bytes,
        bigger.allocated_bytes,
    ) = (16, 16, 16);
    // Two stacks sharing their outer frame 0x7000.
    let profile = ProfileBuilder::new(7)
        .argv(&["prog"])
        .heap(24, 0)
        .stack(&[0x6000, 0x7000], record)
        .stack(&[0x5000, 0x7000], bigger);
    fs::write(raw.join("7.mwp"), profile.build()).unwrap();

    generate(dir.path(), &Options::default()).unwrap();

    let text = fs::read_to_string(dir.path().join("report.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let p = &json["processes"][0];
    let frame = |address: &str| {
        serde_json::json!({"function": null, "file": null, "line": null, "module": null,
            "address": address, "inlined": false, "kind": "native"})
    };
    // In the order the stacks (by bytes) first use them, each once.
    assert_eq!(
        p["frames"],
        serde_json::json!([frame("0x5000"), frame("0x7000"), frame("0x6000")])
    );
    assert_eq!(p["stacks"][0]["frames"], serde_json::json!([0, 1]));
    assert_eq!(p["stacks"][1]["frames"], serde_json::json!([2, 1]));
}
