//! Tests of the heap-guard part of the reader: error records and the guard mode round-trip,
//! and every inconsistency is refused with its own message.

use std::mem::offset_of;

use memwarden_abi::{error_kind, guard_mode, ErrorRecord, Header};

use super::synthetic::{stack_record, ProfileBuilder};
use super::*;

fn error(kind: u32, stack: u32, alloc_stack: u32, free_stack: u32) -> ErrorRecord {
    ErrorRecord {
        kind,
        stack,
        address: 0x6020_0000_0074,
        block_size: 100,
        offset: 104,
        alloc_stack,
        free_stack,
        time_ns: 7_000,
    }
}

fn sample() -> ProfileBuilder {
    ProfileBuilder::new(7)
        .guard_mode(guard_mode::HEADER)
        .stack(&[0x1000, 0x2000], stack_record())
        .stack(&[0x3000], stack_record())
        .error(error(error_kind::HEAP_BUFFER_OVERFLOW, 1, 2, 0))
        .error(error(error_kind::DOUBLE_FREE, 2, 1, 2))
}

fn error_of(bytes: &[u8]) -> String {
    match read_profile(bytes) {
        Ok(_) => panic!("corrupt profile accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn errors_and_the_guard_mode_round_trip() {
    let p = sample().build_profile();
    assert_eq!(p.guard_mode, guard_mode::HEADER);
    assert_eq!(p.error_count, 2);
    assert_eq!(
        p.errors,
        [
            error(error_kind::HEAP_BUFFER_OVERFLOW, 1, 2, 0),
            error(error_kind::DOUBLE_FREE, 2, 1, 2)
        ]
    );
    let negative = ErrorRecord {
        offset: -1,
        ..error(error_kind::HEAP_BUFFER_UNDERFLOW, 0, 0, 0)
    };
    let p = ProfileBuilder::new(7).error(negative).build_profile();
    assert_eq!(p.errors, [negative]);
}

#[test]
fn without_guards_there_is_nothing_and_no_region_is_needed() {
    let builder = ProfileBuilder::new(7).stack(&[0x1000], stack_record());
    let bytes = builder.build();
    let frames_end = builder.header.layout.frame_offset(1) as usize;
    let p = read_profile(&bytes[..frames_end]).unwrap();
    assert_eq!((p.guard_mode, p.error_count, p.errors.len()), (0, 0, 0));
    assert_eq!(guard_mode_name(p.guard_mode), "none");
}

#[test]
fn errors_beyond_the_capacity_are_counted_not_read() {
    let mut builder = sample();
    for _ in 3..=16 {
        builder = builder.error(error(error_kind::INVALID_FREE, 1, 0, 0));
    }
    builder.header.error_count = 40;
    let p = builder.build_profile();
    assert_eq!(p.error_count, 40);
    assert_eq!(p.errors.len(), 16);
    assert_eq!(p.errors[15].kind, error_kind::INVALID_FREE);
}

#[test]
fn records_claimed_but_never_written_are_skipped() {
    let mut builder = sample();
    builder.header.error_count = 5;
    let p = builder.build_profile();
    assert_eq!(p.error_count, 5);
    assert_eq!(
        p.errors.iter().map(|e| e.kind).collect::<Vec<_>>(),
        [error_kind::HEAP_BUFFER_OVERFLOW, error_kind::DOUBLE_FREE]
    );
}

#[test]
fn a_truncated_error_region_is_refused() {
    let builder = sample();
    let bytes = builder.build();
    let end = builder.header.layout.error_offset(2) as usize;
    assert!(read_profile(&bytes[..end]).is_ok());
    assert_eq!(
        error_of(&bytes[..end - 1]),
        format!(
            "truncated: heap-error records end at byte {end}, but the file has {} bytes",
            end - 1
        )
    );
}

#[test]
fn unknown_kinds_and_stacks_outside_the_table_are_refused() {
    assert_eq!(error_kind::name(9), "unknown");
    let bad_kind = ProfileBuilder::new(7).error(error(9, 0, 0, 0)).build();
    assert_eq!(error_of(&bad_kind), "heap error 0: unknown kind 9");
    let cases = [
        (
            error(1, 3, 0, 0),
            "heap error 2: stack 3 outside the 3 stacks in use",
        ),
        (
            error(1, 0, 3, 0),
            "heap error 2: alloc_stack 3 outside the 3 stacks in use",
        ),
        (
            error(7, 0, 1, 9),
            "heap error 2: free_stack 9 outside the 3 stacks in use",
        ),
    ];
    for (record, message) in cases {
        assert_eq!(error_of(&sample().error(record).build()), message);
    }
}

#[test]
fn an_unknown_guard_mode_is_refused() {
    let mut bytes = sample().build();
    bytes[offset_of!(Header, guard_mode)..][..4].copy_from_slice(&4u32.to_le_bytes());
    assert_eq!(error_of(&bytes), "corrupt header: unknown guard_mode 4");
    for (mode, name) in [
        (guard_mode::HEADER, "header"),
        (guard_mode::PAGE, "page"),
        (guard_mode::SAMPLED, "sampled"),
        (4, "unknown"),
    ] {
        assert_eq!(guard_mode_name(mode), name);
    }
}

#[test]
fn compaction_keeps_the_errors_and_the_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("7-1.mwp");
    std::fs::write(&path, sample().build()).unwrap();
    assert!(compact_profile_file(&path).unwrap());
    let p = read_profile_file(&path).unwrap();
    assert_eq!(p.errors, sample().build_profile().errors);
    assert_eq!((p.error_count, p.guard_mode), (2, guard_mode::HEADER));
}
