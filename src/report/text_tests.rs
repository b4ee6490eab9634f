//! Tests of the summary text: exact layout, allocator frames skipped, units.

use super::*;
use crate::report::test_report::{
    function_frame, intern, intern_all, process_report, python_frame, stack_report,
};
use crate::Exit;

fn style() -> Style {
    Style {
        leak_kinds: crate::report::leaks::DEFAULT_GATE_KINDS.to_vec(),
        top: 2,
        colour: false,
    }
}

#[test]
fn stacks_showing_the_same_frames_are_one_entry_of_the_top_list() {
    // GIVEN two recorded stacks that show the same frames (two instructions of one Python
    // line, say), holding 1 MiB and 3 MiB, and a third of 2 MiB elsewhere.
    let mut p = process_report(7, &["python3", "job.py"]);
    (p.peak_bytes, p.peak_blocks) = (6 << 20, 3);
    p.stacks = vec![
        stack_report(&mut p, 1, &["job.py:4 (make)"], 3 << 20, 0, 3 << 20),
        stack_report(&mut p, 2, &["job.py:9 (other)"], 2 << 20, 0, 2 << 20),
        stack_report(&mut p, 3, &["job.py:4 (make)"], 1 << 20, 0, 1 << 20),
    ];
    let report = Report {
        format_version: 1,
        command: vec!["python3".into(), "job.py".into()],
        processes: vec![p],
    };
    // THEN the line is one entry of 4 MiB, above the other.
    let text = summary(&report, &style(), &[]);
    assert!(
        text.contains(
            "  at the peak     4.0 MiB  66.7%  job.py:4 (make)\n                  2.0 MiB  33.3%  job.py:9 (other)\n"
        ),
        "{text}"
    );
}

#[test]
fn stacks_that_differ_only_past_the_printed_chain_are_one_entry() {
    // GIVEN two stacks through the same three innermost frames, reached from two callers
    // further out (1 MiB and 3 MiB), and a third through one of those frames at another
    // address of the same function (2 MiB: its frame prints the same).
    let mut p = process_report(8, &["./merge"]);
    (p.peak_bytes, p.peak_blocks) = (6 << 20, 3);
    let chain = ["take", "take_nd", "reindex"];
    let from_a = [&chain[..], &["concat_a", "main"]].concat();
    let from_b = [&chain[..], &["concat_b", "main"]].concat();
    p.stacks = vec![
        stack_report(&mut p, 1, &from_a, 1 << 20, 0, 1 << 20),
        stack_report(&mut p, 2, &from_b, 3 << 20, 0, 3 << 20),
    ];
    let mut other_address = function_frame("take");
    other_address.address = Some("0x2000".to_owned());
    let mut third = stack_report(&mut p, 3, &from_a, 2 << 20, 0, 2 << 20);
    third.frames[0] = intern(&mut p, other_address);
    assert_ne!(third.frames, p.stacks[0].frames);
    p.stacks.push(third);
    let report = Report {
        format_version: 1,
        command: vec!["./merge".into()],
        processes: vec![p],
    };
    // THEN the summary shows one entry of all 6 MiB, not the same line three times.
    let text = summary(&report, &style(), &[]);
    assert!(
        text.contains("  at the peak     6.0 MiB 100.0%  take <- take_nd <- reindex\n  allocated"),
        "{text}"
    );
}

#[test]
fn summary_shows_exit_peak_top_stacks_totals_and_flags() {
    let mut p = process_report(42, &["./peak", "3"]);
    p.exit = Some(Exit::Code(0));
    (p.peak_bytes, p.peak_blocks, p.peak_time_ms) = (4 << 20, 3, 12.34);
    (p.not_freed_bytes, p.not_freed_blocks) = (100, 2);
    p.totals.allocated_bytes = 5 << 20;
    (p.totals.allocations, p.totals.frees) = (1000, 998);
    p.own_malloc = true;
    p.stacks = vec![
        stack_report(
            &mut p,
            1,
            &["malloc", "make_big", "main"],
            3 << 20,
            0,
            3 << 20,
        ),
        stack_report(
            &mut p,
            2,
            &["operator new(unsigned long)", "make_small", "main"],
            1 << 20,
            100,
            1 << 20,
        ),
        stack_report(&mut p, 3, &["third"], 0, 0, 100),
    ];
    let report = Report {
        format_version: 1,
        command: vec!["./peak".into(), "3".into()],
        processes: vec![p],
    };
    let text = summary(
        &report,
        &style(),
        &["memwarden: report written to /out".into()],
    );
    let expected = "\
memwarden: ./peak 3 (1 process)
pid 42: ./peak 3
  exit         exit code 0
  peak heap    4.0 MiB (4,194,304 bytes) in 3 blocks, at 12.3 ms
  at the peak     3.0 MiB  75.0%  make_big <- main
                  1.0 MiB  25.0%  make_small <- main
  allocated    5.0 MiB (5,242,880 bytes) in 1,000 allocations, 998 frees
  not freed    100 bytes in 2 blocks at exit
  flags        own malloc: the program defines malloc, its calls are not seen
memwarden: report written to /out
";
    assert_eq!(text, expected);
}

#[test]
fn replaced_and_unknown_exits_and_many_processes() {
    let mut processes = Vec::new();
    for pid in 0..(MAX_PROCESSES_SHOWN as u32 + 2) {
        let mut p = process_report(100 + pid, &["sh"]);
        p.start_time_ms = pid as f64;
        p.peak_bytes = 1000 + pid as u64;
        processes.push(p);
    }
    processes[12].replaced_by_exec = true;
    processes[12].exit = Some(Exit::Signal(9));
    let report = Report {
        format_version: 1,
        command: vec!["sh".into()],
        processes,
    };
    let text = summary(&report, &style(), &[]);
    // The two smallest peaks (pids 100 and 101) are summed up, the rest shown in order.
    assert!(!text.contains("pid 100:") && !text.contains("pid 101:"));
    assert!(text.contains("pid 102: sh\n  exit         unknown"));
    assert!(text.contains(
        "pid 112: sh\n  exit         replaced by exec (final image: killed by signal 9 (SIGKILL))"
    ));
    assert!(text.contains("(SIGKILL))\n  peak heap    1012 bytes in 0 blocks, at 0.0 ms\n  allocated    0 bytes in 0 allocations, 0 frees\n  not freed    0 bytes in 0 blocks at exec\n"));
    assert!(text.contains("… 2 more processes with smaller peaks (see report.json)\n"));
    assert!(text.ends_with(
        "all processes: allocated 0 bytes in 0 allocations, 0 frees; not freed at exit 0 bytes\n"
    ));
    let first = text.find("pid 102:").unwrap();
    assert!(first < text.find("pid 113:").unwrap());
}

#[test]
fn colour_only_when_asked() {
    let report = Report {
        format_version: 1,
        command: vec![],
        processes: vec![process_report(1, &["x"])],
    };
    let plain = summary(&report, &style(), &[]);
    let bold = summary(
        &report,
        &Style {
            leak_kinds: crate::report::leaks::DEFAULT_GATE_KINDS.to_vec(),
            top: 1,
            colour: true,
        },
        &[],
    );
    assert!(!plain.contains('\x1b'));
    assert!(bold.contains("\x1b[1mpid 1: x\x1b[0m"));
}

#[test]
fn units_and_grouping() {
    assert_eq!(human(0), "0 B");
    assert_eq!(human(1023), "1023 B");
    assert_eq!(human(1536), "1.5 KiB");
    assert_eq!(human(110 << 20), "110.0 MiB");
    assert_eq!(human(u64::MAX), "16.0 EiB");
    assert_eq!(group(0), "0");
    assert_eq!(group(999), "999");
    assert_eq!(group(1000), "1,000");
    assert_eq!(group(1_234_567), "1,234,567");
    assert_eq!(bytes(0), "0 bytes");
    assert_eq!(bytes(1), "1 byte");
    assert_eq!(bytes(1023), "1023 bytes");
    assert_eq!(bytes(2048), "2.0 KiB (2,048 bytes)");
    assert_eq!(how_many(0, "block"), "0 blocks");
    assert_eq!(how_many(1, "allocation"), "1 allocation");
    assert_eq!(how_many(1234, "free"), "1,234 frees");
}

fn injected_failure(
    p: &mut ProcessReport,
    seq: u64,
    rule: u32,
) -> crate::report::failures::FailureReport {
    crate::report::failures::FailureReport {
        seq,
        call: seq,
        function: "malloc".into(),
        size: 16,
        rule,
        time_ms: 0.0,
        stack_id: 1,
        site: None,
        frames: vec![intern(p, function_frame("make_b"))],
        pid: 42,
    }
}

#[test]
fn injected_failures_are_counted_by_rule_and_the_crash_is_placed() {
    let mut p = process_report(42, &["./prog"]);
    p.exit = Some(Exit::Signal(11));
    p.injected_failures = vec![
        injected_failure(&mut p, 1, 1),
        injected_failure(&mut p, 2, 2),
        injected_failure(&mut p, 3, 1),
    ];
    p.injected_failure_count = 3;
    p.crash = Some(crate::report::failures::CrashReport {
        signal: 11,
        frames: intern_all(
            &mut p,
            ["use_b", "main", "x", "y"].map(function_frame).to_vec(),
        ),
    });
    let report = Report {
        format_version: 2,
        command: vec!["./prog".into()],
        processes: vec![p],
    };
    let text = summary(&report, &style(), &[]);
    assert!(
        text.contains(
            "  not freed    0 bytes in 0 blocks at exit\n  injected     3 allocation failures (rule 1: 2, rule 2: 1)\n  first failed malloc of 16 bytes at make_b\n  crashed      SIGSEGV at use_b <- main <- x\n"
        ),
        "{text}"
    );

    let mut p = process_report(42, &["./prog"]);
    p.injected_failures = vec![injected_failure(&mut p, 1, 1)];
    p.injected_failure_count = 5000;
    p.crash = Some(crate::report::failures::CrashReport {
        signal: 77,
        frames: vec![],
    });
    let report = Report {
        format_version: 2,
        command: vec![],
        processes: vec![p],
    };
    let text = summary(&report, &style(), &[]);
    assert!(text.contains(
        "  injected     5,000 allocation failures (rule 1: 1, 4,999 more not stored)\n  first failed malloc of 16 bytes at make_b\n  crashed      signal 77 at an unknown place\n"
    ), "{text}");
    let quiet = summary(
        &Report {
            format_version: 2,
            command: vec![],
            processes: vec![process_report(1, &["x"])],
        },
        &style(),
        &[],
    );
    assert!(!quiet.contains("injected") && !quiet.contains("crashed"));
}

#[test]
fn numpy_data_gets_its_line_and_python_stacks_start_at_their_innermost_python_frame() {
    let mut p = process_report(7, &["python3", "script.py"]);
    p.exit = Some(Exit::Code(0));
    (p.peak_bytes, p.peak_blocks) = (8_000_100, 2);
    p.numpy.peak_bytes = 8_000_000;
    p.numpy.peak_blocks = 1;
    let mut array = stack_report(
        &mut p,
        1,
        &["PyDataMem_UserNEW", "PyArray_NewFromDescr"],
        8_000_000,
        0,
        8_000_000,
    );
    let python = vec![
        python_frame("/work/script.py", 5, "make"),
        python_frame("/work/script.py", 9, "<module>"),
    ];
    array.frames.extend(intern_all(&mut p, python));
    p.stacks = vec![array];
    let report = Report {
        format_version: 4,
        command: vec![],
        processes: vec![p],
    };
    let text = summary(&report, &style(), &[]);
    assert!(
        text.contains(
            "  peak heap    7.6 MiB (8,000,100 bytes) in 2 blocks, at 0.0 ms\n  numpy        7.6 MiB (8,000,000 bytes) of array data at the peak in 1 array; 0 bytes not freed\n  at the peak     7.6 MiB 100.0%  script.py:5 (make) <- script.py:9 (<module>)\n"
        ),
        "{text}"
    );
}

#[test]
fn without_numpy_data_there_is_no_numpy_line() {
    let mut p = process_report(7, &["prog"]);
    p.stacks = vec![stack_report(&mut p, 1, &["f"], 8, 8, 8)];
    let report = Report {
        format_version: 4,
        command: vec![],
        processes: vec![p],
    };
    assert!(!summary(&report, &style(), &[]).contains("numpy"));
}
