//! The store → analysis boundary, heap-guard part: reads the heap-error records and the
//! guard mode of a profile, each checked against the rest of the file (records in the
//! region, known kinds, stack ids in the table, a known mode).

use memwarden_abi::{error_kind, guard_mode, ErrorRecord, Header};

use super::plain::read_plain;
use super::reader::ProfileError;

/// Heap-error records stored: the count may exceed the room, the excess is only counted.
pub(super) fn stored_errors(header: &Header) -> u64 {
    header.error_count.min(header.layout.error_capacity)
}

/// The bytes `[start, end)` of the error records in use; `(0, 0)` when none is stored, so
/// that a file without errors needs no error region. Cannot overflow: the layout was
/// checked and the stored count is within the capacity.
pub(super) fn error_region(header: &Header) -> (u64, u64) {
    match stored_errors(header) {
        0 => (0, 0),
        stored => (
            header.layout.errors_offset,
            header.layout.error_offset(stored),
        ),
    }
}

/// The stored error records, in the order they were claimed, without the ones claimed but
/// never written.
pub(super) fn parse_errors(
    bytes: &[u8],
    header: &Header,
) -> Result<Vec<ErrorRecord>, ProfileError> {
    let mut errors = Vec::new();
    let stored = stored_errors(header);
    for (index, chunk) in (0..stored).zip(bytes.chunks_exact(size_of::<ErrorRecord>())) {
        let bad = |what: String| ProfileError::HeapError { index, what };
        let record =
            read_plain::<ErrorRecord>(chunk, 0).ok_or_else(|| bad("short record".into()))?;
        if record.kind == 0 {
            // Claimed but never written: the writer counts first, then writes, and skips
            // the write when the file cannot grow or the process dies in between.
            continue;
        }
        if error_kind::name(record.kind) == "unknown" {
            return Err(bad(format!("unknown kind {}", record.kind)));
        }
        let stacks = [
            ("stack", record.stack),
            ("alloc_stack", record.alloc_stack),
            ("free_stack", record.free_stack),
        ];
        for (what, id) in stacks {
            if u64::from(id) >= header.stack_count {
                return Err(bad(format!(
                    "{what} {id} outside the {} stacks in use",
                    header.stack_count
                )));
            }
        }
        errors.push(record);
    }
    Ok(errors)
}

/// The guard mode the header records, if this reader knows it.
pub(super) fn parse_guard_mode(header: &Header) -> Result<u32, ProfileError> {
    match header.guard_mode {
        guard_mode::NONE | guard_mode::HEADER | guard_mode::PAGE | guard_mode::SAMPLED => {
            Ok(header.guard_mode)
        }
        other => Err(ProfileError::GuardMode(other)),
    }
}

/// The name of a guard mode as reports show it (`none`, `header`, `page`, `sampled`).
pub fn guard_mode_name(mode: u32) -> &'static str {
    match mode {
        guard_mode::NONE => "none",
        guard_mode::HEADER => "header",
        guard_mode::PAGE => "page",
        guard_mode::SAMPLED => "sampled",
        _ => "unknown",
    }
}
