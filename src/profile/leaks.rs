//! The store → analysis boundary, leak-check part: reads the leak check's outcome and its
//! records (one per allocation stack and kind), each checked against the rest of the file
//! (records in the region, known kinds, stack ids in the table, a known status and view).

use memwarden_abi::{leak_kind, leak_status, leak_view, Header, LeakRecord};

use super::plain::read_plain;
use super::reader::ProfileError;

/// What the leak check found in one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeakCheck {
    /// One of `memwarden_abi::leak_status`.
    pub status: u32,
    /// One of `memwarden_abi::leak_view`.
    pub view: u32,
    /// Records found (stored or not).
    pub record_count: u64,
    /// The stored records.
    pub records: Vec<LeakRecord>,
    /// Bytes of memory read.
    pub scanned_bytes: u64,
    /// How long the check took, ns.
    pub scan_ns: u64,
    /// Threads stopped for it.
    pub threads_stopped: u32,
    /// Threads that did not answer.
    pub threads_missed: u32,
}

impl LeakCheck {
    /// True when the check ran and its records are complete.
    pub fn done(&self) -> bool {
        self.status == leak_status::DONE
    }

    /// `(bytes, blocks)` of one kind.
    pub fn total(&self, kind: u32) -> (u64, u64) {
        self.records
            .iter()
            .filter(|r| r.kind == kind)
            .fold((0, 0), |(bytes, blocks), r| {
                (
                    bytes.saturating_add(r.bytes),
                    blocks.saturating_add(r.blocks),
                )
            })
    }
}

/// The name of a leak view as reports and options spell it.
pub fn leak_view_name(view: u32) -> &'static str {
    match view {
        leak_view::LSAN => "lsan",
        _ => "memcheck",
    }
}

pub(super) fn stored_leaks(header: &Header) -> u64 {
    header.leak_record_count.min(header.layout.leak_capacity)
}

/// The bytes `[start, end)` of the stored leak records; `(0, 0)` when none is stored.
pub(super) fn leak_region(header: &Header) -> (u64, u64) {
    match stored_leaks(header) {
        0 => (0, 0),
        stored => (
            header.layout.leaks_offset,
            header.layout.leak_offset(stored),
        ),
    }
}

pub(super) fn parse_leaks(bytes: &[u8], header: &Header) -> Result<LeakCheck, ProfileError> {
    let status = header.leak_status;
    if !matches!(
        status,
        leak_status::NOT_RUN | leak_status::DONE | leak_status::SKIPPED | leak_status::PENDING
    ) {
        return Err(ProfileError::LeakHeader(format!(
            "unknown leak_status {status}"
        )));
    }
    if !matches!(header.leak_view, leak_view::MEMCHECK | leak_view::LSAN) {
        return Err(ProfileError::LeakHeader(format!(
            "unknown leak_view {}",
            header.leak_view
        )));
    }
    let mut records = Vec::new();
    let stored = stored_leaks(header);
    for (index, chunk) in (0..stored).zip(bytes.chunks_exact(size_of::<LeakRecord>())) {
        let bad = |what: String| ProfileError::Leak { index, what };
        let record =
            read_plain::<LeakRecord>(chunk, 0).ok_or_else(|| bad("short record".into()))?;
        if leak_kind::name(record.kind) == "unknown" {
            return Err(bad(format!("unknown kind {}", record.kind)));
        }
        if u64::from(record.stack) >= header.stack_count {
            return Err(bad(format!(
                "stack {} outside the {} stacks in use",
                record.stack, header.stack_count
            )));
        }
        if record.blocks == 0 {
            return Err(bad("no blocks".into()));
        }
        records.push(record);
    }
    Ok(LeakCheck {
        status,
        view: header.leak_view,
        record_count: header.leak_record_count,
        records,
        scanned_bytes: header.leak_scanned_bytes,
        scan_ns: header.leak_scan_ns,
        threads_stopped: header.leak_threads_stopped,
        threads_missed: header.leak_threads_missed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::synthetic::leak_record;

    fn header(records: u64) -> Header {
        // SAFETY: Header is plain integers and arrays of them; all-zero is a valid value.
        let mut header: Header = unsafe { std::mem::zeroed() };
        header.stack_count = 3;
        header.leak_status = leak_status::DONE;
        header.leak_record_count = records;
        header.layout.leak_capacity = 8;
        header
    }

    fn bytes(records: &[LeakRecord]) -> Vec<u8> {
        records
            .iter()
            .flat_map(|r| {
                [
                    r.stack.to_le_bytes().to_vec(),
                    r.kind.to_le_bytes().to_vec(),
                    r.blocks.to_le_bytes().to_vec(),
                    r.bytes.to_le_bytes().to_vec(),
                    r.reserved.to_le_bytes().to_vec(),
                ]
                .concat()
            })
            .collect()
    }

    #[test]
    fn records_read_back_with_their_totals() {
        let records = [
            leak_record(1, leak_kind::DEFINITE, 1, 77),
            leak_record(2, leak_kind::INDIRECT, 4, 128),
        ];
        let check = parse_leaks(&bytes(&records), &header(2)).unwrap();
        assert!(check.done());
        assert_eq!(check.records, records);
        assert_eq!(check.total(leak_kind::INDIRECT), (128, 4));
        assert_eq!(check.total(leak_kind::POSSIBLE), (0, 0));
    }

    #[test]
    fn corrupt_records_and_fields_are_one_line_errors() {
        let unknown_kind = [leak_record(1, 9, 1, 1)];
        let error = parse_leaks(&bytes(&unknown_kind), &header(1)).unwrap_err();
        assert_eq!(error.to_string(), "leak record 0: unknown kind 9");
        let bad_stack = [leak_record(3, leak_kind::DEFINITE, 1, 1)];
        let error = parse_leaks(&bytes(&bad_stack), &header(1)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "leak record 0: stack 3 outside the 3 stacks in use"
        );
        let no_blocks = [leak_record(1, leak_kind::DEFINITE, 0, 0)];
        assert!(parse_leaks(&bytes(&no_blocks), &header(1)).is_err());
        let mut bad_status = header(0);
        bad_status.leak_status = 7;
        let error = parse_leaks(&[], &bad_status).unwrap_err();
        assert_eq!(error.to_string(), "corrupt header: unknown leak_status 7");
        let mut bad_view = header(0);
        bad_view.leak_view = 5;
        assert!(parse_leaks(&[], &bad_view).is_err());
    }
}
