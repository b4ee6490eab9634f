//! The store → analysis boundary, fault-injection part: reads the injected-failure records
//! and the crash stack of a profile, each checked against the rest of the file (records in
//! the region, known function codes, stack ids in the table, crash depth in bounds).

use memwarden_abi::{failed_function, FailureRecord, Header, CRASH_DEPTH};

use super::plain::read_plain;
use super::reader::ProfileError;
use super::Crash;

/// Failure records stored: the count may exceed the room, the excess is only counted.
pub(super) fn stored_failures(header: &Header) -> u64 {
    header.failure_count.min(header.layout.failure_capacity)
}

/// The bytes `[start, end)` of the failure records in use; `(0, 0)` when none is stored, so
/// that a file without failures needs no failure region. Cannot overflow: the layout was
/// checked and the stored count is within the capacity.
pub(super) fn failure_region(header: &Header) -> (u64, u64) {
    match stored_failures(header) {
        0 => (0, 0),
        stored => (
            header.layout.failures_offset,
            header.layout.failure_offset(stored),
        ),
    }
}

/// The stored failure records, in the order they were claimed, without the ones claimed
/// but never written.
pub(super) fn parse_failures(
    bytes: &[u8],
    header: &Header,
) -> Result<Vec<FailureRecord>, ProfileError> {
    let mut failures = Vec::new();
    let stored = stored_failures(header);
    for (index, chunk) in (0..stored).zip(bytes.chunks_exact(size_of::<FailureRecord>())) {
        let bad = |what: String| ProfileError::Failure { index, what };
        let record =
            read_plain::<FailureRecord>(chunk, 0).ok_or_else(|| bad("short record".into()))?;
        if record.function == 0 {
            // Claimed but never written: the writer counts first, then writes, and skips
            // the write when the file cannot grow or the process dies in between.
            continue;
        }
        if failed_function::name(record.function) == "unknown" {
            return Err(bad(format!("unknown function code {}", record.function)));
        }
        if u64::from(record.stack) >= header.stack_count {
            return Err(bad(format!(
                "stack {} outside the {} stacks in use",
                record.stack, header.stack_count
            )));
        }
        failures.push(record);
    }
    Ok(failures)
}

/// The crash the preload caught, if any: its signal and the frames it recorded.
pub(super) fn parse_crash(header: &Header) -> Result<Option<Crash>, ProfileError> {
    let depth = header.crash_depth as usize;
    if depth > CRASH_DEPTH {
        return Err(ProfileError::CrashDepth {
            depth: header.crash_depth,
        });
    }
    if header.crash_signal == 0 {
        return Ok(None);
    }
    Ok(Some(Crash {
        signal: header.crash_signal,
        frames: header.crash_frames[..depth].to_vec(),
    }))
}
