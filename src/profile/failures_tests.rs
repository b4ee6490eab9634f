//! Tests of the fault-injection part of the reader: failure records and the crash stack
//! round-trip, and every inconsistency is refused with its own message.

use std::mem::offset_of;

use memwarden_abi::{failed_function, FailureRecord, Header, CRASH_DEPTH};

use super::synthetic::{stack_record, ProfileBuilder};
use super::*;

fn failure(seq: u64, stack: u32, function: u32) -> FailureRecord {
    FailureRecord {
        seq,
        call: seq + 10,
        size: 100 * seq,
        time_ns: 5_000 * seq,
        stack,
        function,
        rule: 1,
        reserved: 0,
    }
}

fn sample() -> ProfileBuilder {
    ProfileBuilder::new(7)
        .stack(&[0x1000, 0x2000], stack_record())
        .failure(failure(1, 1, failed_function::MALLOC))
        .failure(failure(2, 0, failed_function::OPERATOR_NEW))
}

fn error_of(bytes: &[u8]) -> String {
    match read_profile(bytes) {
        Ok(_) => panic!("corrupt profile accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn failures_and_the_crash_round_trip() {
    let p = sample().crash(11, &[0x1234, 0x2000]).build_profile();
    assert_eq!(p.failure_count, 2);
    assert_eq!(
        p.failures,
        [
            failure(1, 1, failed_function::MALLOC),
            failure(2, 0, failed_function::OPERATOR_NEW)
        ]
    );
    assert_eq!(
        p.crash,
        Some(Crash {
            signal: 11,
            frames: vec![0x1234, 0x2000]
        })
    );
    assert_eq!(
        p.stack(1).map(|s| s.frames.to_vec()),
        Some(vec![0x1000, 0x2000])
    );
    assert!(p.stack(2).is_none());
}

#[test]
fn without_injection_there_is_nothing_and_no_region_is_needed() {
    let builder = ProfileBuilder::new(7).stack(&[0x1000], stack_record());
    let bytes = builder.build();
    let frames_end = builder.header.layout.frame_offset(1) as usize;
    let p = read_profile(&bytes[..frames_end]).unwrap();
    assert_eq!((p.failure_count, p.failures.len(), p.crash), (0, 0, None));
}

#[test]
fn failures_beyond_the_capacity_are_counted_not_read() {
    let mut builder = sample();
    for seq in 3..=16 {
        builder = builder.failure(failure(seq, 1, failed_function::CALLOC));
    }
    builder.header.failure_count = 40;
    let p = builder.build_profile();
    assert_eq!(p.failure_count, 40);
    assert_eq!(p.failures.len(), 16);
    assert_eq!(p.failures[15].seq, 16);
}

#[test]
fn records_claimed_but_never_written_are_skipped() {
    let mut builder = sample();
    builder.header.failure_count = 5;
    let p = builder.build_profile();
    assert_eq!(p.failure_count, 5);
    assert_eq!(p.failures.iter().map(|f| f.seq).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn a_truncated_failure_region_is_refused() {
    let builder = sample();
    let bytes = builder.build();
    let end = builder.header.layout.failure_offset(2) as usize;
    assert!(read_profile(&bytes[..end]).is_ok());
    assert_eq!(
        error_of(&bytes[..end - 1]),
        format!(
            "truncated: injected-failure records end at byte {end}, but the file has {} bytes",
            end - 1
        )
    );
}

#[test]
fn unknown_functions_and_stacks_outside_the_table_are_refused() {
    let bad_function = ProfileBuilder::new(7).failure(failure(1, 0, 13)).build();
    assert_eq!(failed_function::name(13), "unknown");
    assert_eq!(
        error_of(&bad_function),
        "injected failure 0: unknown function code 13"
    );
    let bad_stack = sample()
        .failure(failure(3, 2, failed_function::MALLOC))
        .build();
    assert_eq!(
        error_of(&bad_stack),
        "injected failure 2: stack 2 outside the 2 stacks in use"
    );
}

#[test]
fn a_crash_deeper_than_its_room_is_refused_and_no_signal_means_no_crash() {
    let mut bytes = sample().crash(11, &[1, 2]).build();
    let depth = (CRASH_DEPTH as u32 + 1).to_le_bytes();
    bytes[offset_of!(Header, crash_depth)..][..4].copy_from_slice(&depth);
    assert_eq!(
        error_of(&bytes),
        "corrupt header: crash_depth 65 exceeds 64"
    );
    let mut bytes = sample().crash(11, &[1, 2]).build();
    bytes[offset_of!(Header, crash_signal)..][..4].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(read_profile(&bytes[..]).unwrap().crash, None);
}

#[test]
fn compaction_keeps_the_failures() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("7-1.mwp");
    std::fs::write(&path, sample().crash(6, &[9]).build()).unwrap();
    assert!(compact_profile_file(&path).unwrap());
    let p = read_profile_file(&path).unwrap();
    assert_eq!(p.failures, sample().build_profile().failures);
    assert_eq!(p.crash.map(|c| (c.signal, c.frames)), Some((6, vec![9])));
}
