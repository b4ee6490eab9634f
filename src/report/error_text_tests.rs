//! Tests of the heap errors in the summary: exact sanitizer-style text for each kind of
//! error, the guard line, what is left out, and the closing count.

use super::*;
use crate::report::json::Report;
use crate::report::test_report::process_report;
use crate::report::text::{summary, Style};

fn frame_report(function: &str, file: &str, line: u32) -> FrameReport {
    FrameReport {
        function: Some(function.to_owned()),
        file: Some(format!("/src/{file}")),
        line: Some(line),
        module: Some("/t/mwt_bug".to_owned()),
        address: Some("0x1000".to_owned()),
        inlined: false,
        kind: crate::report::json::FrameKind::Native,
    }
}

/// The frame table of the processes of these tests; [`frame`] gives each's index.
const TABLE: [(&str, &str, u32); 8] = [
    ("overflow", "bug.c", 12),
    ("main", "bug.c", 30),
    ("malloc", "hooks.rs", 1),
    ("make_block", "bug.c", 5),
    ("main", "bug.c", 29),
    ("free", "hooks.rs", 1),
    ("release", "bug.c", 8),
    ("main", "bug.c", 31),
];

/// A process whose frame table is [`TABLE`].
fn process(pid: u32, argv: &[&str]) -> ProcessReport {
    let mut p = process_report(pid, argv);
    p.frames = TABLE
        .iter()
        .map(|&(function, file, line)| frame_report(function, file, line))
        .collect();
    p
}

/// The index of a frame of [`TABLE`].
fn frame(function: &str, file: &str, line: u32) -> u32 {
    TABLE
        .iter()
        .position(|&f| f == (function, file, line))
        .expect("a frame of TABLE") as u32
}

fn error(kind: &str, block_size: u64, offset: i64) -> ErrorReport {
    ErrorReport {
        kind: kind.to_owned(),
        address: "0x602000000074".to_owned(),
        block_size,
        offset,
        stack: Some(vec![
            frame("overflow", "bug.c", 12),
            frame("main", "bug.c", 30),
        ]),
        alloc_stack: Some(vec![
            frame("malloc", "hooks.rs", 1),
            frame("make_block", "bug.c", 5),
            frame("main", "bug.c", 29),
        ]),
        free_stack: None,
        time_ms: 1.5,
        pid: 1234,
    }
}

fn text(e: &ErrorReport) -> String {
    let mut out = String::new();
    write_error(&mut out, &process(e.pid, &["./bug"]), e);
    out
}

#[test]
fn an_overflow_reads_like_a_sanitizer_report() {
    assert_eq!(
        text(&error("heap-buffer-overflow", 100, 104)),
        "\
ERROR: memwarden: heap-buffer-overflow on address 0x602000000074 in pid 1234
  at  overflow (bug.c:12) <- main (bug.c:30)
  0x602000000074 is located 4 bytes after the 100-byte block allocated at
      make_block (bug.c:5) <- main (bug.c:29)
SUMMARY: memwarden: heap-buffer-overflow at overflow (bug.c:12)
"
    );
}

#[test]
fn offsets_say_before_after_or_inside() {
    assert_eq!(position(100, 100), "0 bytes after");
    assert_eq!(position(101, 100), "1 byte after");
    assert_eq!(position(-1, 100), "1 byte before");
    assert_eq!(position(-16, 100), "16 bytes before");
    assert_eq!(position(0, 100), "0 bytes inside");
    assert_eq!(position(99, 100), "99 bytes inside");
    assert_eq!(
        position(i64::MIN, 1),
        "9,223,372,036,854,775,808 bytes before"
    );
}

#[test]
fn a_use_after_free_shows_where_the_block_was_freed() {
    let mut e = error("heap-use-after-free", 100, 8);
    e.free_stack = Some(vec![
        frame("free", "hooks.rs", 1),
        frame("release", "bug.c", 8),
        frame("main", "bug.c", 31),
    ]);
    assert_eq!(
        text(&e),
        "\
ERROR: memwarden: heap-use-after-free on address 0x602000000074 in pid 1234
  at  overflow (bug.c:12) <- main (bug.c:30)
  0x602000000074 is located 8 bytes inside the 100-byte block allocated at
      make_block (bug.c:5) <- main (bug.c:29)
  freed at
      release (bug.c:8) <- main (bug.c:31)
SUMMARY: memwarden: heap-use-after-free at overflow (bug.c:12)
"
    );
}

#[test]
fn size_mismatch_alignment_and_unknown_blocks_have_their_own_lines() {
    let lines = |e: &ErrorReport| text(e).lines().nth(2).unwrap_or("").to_owned();
    assert_eq!(
        lines(&error("size-mismatch", 100, 96)),
        "  0x602000000074 was deallocated as 96 bytes, allocated as 100 bytes at"
    );
    let mut wild = error("invalid-free", 0, 0);
    wild.alloc_stack = None;
    assert_eq!(
        text(&wild),
        "\
ERROR: memwarden: invalid-free on address 0x602000000074 in pid 1234
  at  overflow (bug.c:12) <- main (bug.c:30)
  0x602000000074 is in no block memwarden holds (an address it never returned, or a block freed and out of quarantine)
SUMMARY: memwarden: invalid-free at overflow (bug.c:12)
"
    );
    let mut gone = error("heap-use-after-free", 0, 0);
    gone.alloc_stack = None;
    assert_eq!(
        lines(&gone),
        "  0x602000000074 lies in a block freed before and out of quarantine (its size and \
         stacks are no longer kept; a larger --quarantine keeps them longer)"
    );
    let mut alignment = error("invalid-alignment", 0, 3);
    alignment.alloc_stack = None;
    alignment.address = "0x0".to_owned();
    assert_eq!(
        text(&alignment),
        "\
ERROR: memwarden: invalid-alignment (alignment 3) in pid 1234
  at  overflow (bug.c:12) <- main (bug.c:30)
  alignment 3 is not one the allocation function accepts
SUMMARY: memwarden: invalid-alignment at overflow (bug.c:12)
"
    );
}

#[test]
fn unknown_stacks_are_said_so() {
    let mut e = error("double-free", 100, 0);
    e.stack = None;
    e.alloc_stack = Some(Vec::new());
    assert_eq!(
        text(&e),
        "\
ERROR: memwarden: double-free on address 0x602000000074 in pid 1234
  at  [unknown stack]
  0x602000000074 is located 0 bytes inside the 100-byte block allocated at
      [unknown stack]
SUMMARY: memwarden: double-free at an unknown place
"
    );
}

#[test]
fn the_summary_shows_errors_after_their_process_and_a_closing_count() {
    let mut p = process(1234, &["./bug"]);
    p.guard_mode = "header".to_owned();
    p.errors = vec![error("heap-buffer-overflow", 100, 104)];
    p.error_count = 1;
    let mut quiet = process_report(1300, &["./quiet"]);
    quiet.guard_mode = "header".to_owned();
    let report = Report {
        format_version: 3,
        command: vec!["./bug".into()],
        processes: vec![p, quiet],
    };
    let style = Style {
        leak_kinds: crate::report::leaks::DEFAULT_GATE_KINDS.to_vec(),
        top: 2,
        colour: false,
    };
    let text = summary(
        &report,
        &style,
        &["memwarden: report written to /out".into()],
    );
    assert!(
        text.contains(
            "  guard        header mode, 1 heap error\n\
             ERROR: memwarden: heap-buffer-overflow on address 0x602000000074 in pid 1234\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "SUMMARY: memwarden: heap-buffer-overflow at overflow (bug.c:12)\npid 1300: ./quiet\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("  guard        header mode, no heap errors\n"),
        "{text}"
    );
    assert!(
        text.ends_with("memwarden: report written to /out\nmemwarden: 1 heap error found\n"),
        "{text}"
    );
}

#[test]
fn without_guards_nothing_is_said_and_left_out_errors_are_counted() {
    let plain = process_report(1, &["./p"]);
    assert_eq!(guard_line(&plain), None);
    assert_eq!(total_line(std::slice::from_ref(&plain)), None);

    let mut p = process(7, &["./bug"]);
    p.guard_mode = "page".to_owned();
    p.errors = vec![error("double-free", 100, 0); MAX_ERRORS_SHOWN + 2];
    p.error_count = 5000;
    let mut out = String::new();
    write_errors(&mut out, &p);
    assert_eq!(out.matches("ERROR: memwarden:").count(), MAX_ERRORS_SHOWN);
    assert!(
        out.ends_with(
            "… 2 more heap errors in pid 7 (see report.json)\n\
             … 4,988 more heap errors in pid 7, counted but not stored (the profile's room for them filled up)\n"
        ),
        "{out}"
    );
    assert_eq!(
        guard_line(&p).as_deref(),
        Some("page mode, 5,000 heap errors")
    );
    assert_eq!(
        total_line(&[p]).as_deref(),
        Some("memwarden: 5,000 heap errors found")
    );
}
