//! The store, read back, Python part: the code records that Python frame words point to
//! (file, function names, line table, all in the blob area), validated against the blob
//! bytes in use, and the check that every Python frame of every stack names a record.

use memwarden_abi::python::{self, line_table, BlobSpan, CodeRecord, FrameWord};
use memwarden_abi::Header;

use super::plain::read_plain;
use super::{ProfileError, Stack};

/// A Python code object (function, module body, class body…) as the preload copied it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonCode {
    /// `co_filename` (lossy UTF-8).
    pub filename: String,
    /// `co_name`.
    pub name: String,
    /// `co_qualname` (the same as `name` before Python 3.11).
    pub qualname: String,
    /// `co_firstlineno`.
    pub first_line: i32,
    /// One of `memwarden_abi::python::line_table`.
    pub line_table_kind: u32,
    /// `co_linetable`'s bytes.
    pub line_table: Vec<u8>,
}

/// The bytes `[start, end)` of the code records in use; empty (and at 0) when there are
/// none, so a profile without Python needs no room for them.
pub(crate) fn code_region(header: &Header) -> (u64, u64) {
    let l = &header.layout;
    match header.code_count {
        0 => (0, 0),
        count => (l.codes_offset, l.code_offset(count)),
    }
}

/// The bytes `[start, end)` of the blob area in use; empty (and at 0) when nothing is.
pub(crate) fn blob_region(header: &Header) -> (u64, u64) {
    match header.blob_used {
        0 => (0, 0),
        used => (header.layout.blob_offset, header.layout.blob_offset + used),
    }
}

/// The `header.code_count` code records in `records`, by index; `None` for a record not
/// yet published (its frames show as unknown Python frames).
pub(crate) fn parse_codes(
    records: &[u8],
    blob: &[u8],
    header: &Header,
) -> Result<Vec<Option<PythonCode>>, ProfileError> {
    (0..header.code_count)
        .map(|index| {
            let at = usize::try_from(index)
                .ok()
                .and_then(|i| i.checked_mul(size_of::<CodeRecord>()));
            let record = at
                .and_then(|at| read_plain::<CodeRecord>(records, at))
                .ok_or_else(|| ProfileError::Code {
                    index,
                    what: "short record".into(),
                })?;
            parse_code(&record, index, blob, 0)
        })
        .collect()
}

/// Code record number `index`, with its texts and line table out of `blob`, the bytes of
/// the blob area from offset `blob_start` on; `None` while it is not published.
pub(crate) fn parse_code(
    record: &CodeRecord,
    index: u64,
    blob: &[u8],
    blob_start: u64,
) -> Result<Option<PythonCode>, ProfileError> {
    let bad = |what: String| ProfileError::Code { index, what };
    if record.published == 0 {
        return Ok(None);
    }
    if !matches!(
        record.line_table_kind,
        line_table::NONE | line_table::LOCATIONS_311
    ) {
        return Err(bad(format!(
            "unknown line_table_kind {}",
            record.line_table_kind
        )));
    }
    let bytes = |what: &str, span: BlobSpan| {
        let end = u64::from(span.start) + u64::from(span.len);
        let local = |offset: u64| usize::try_from(offset.checked_sub(blob_start)?).ok();
        local(u64::from(span.start))
            .zip(local(end))
            .and_then(|(from, to)| blob.get(from..to))
            .ok_or_else(|| {
                bad(format!(
                    "{what} at blob bytes {}..{end}, past the {} bytes in use",
                    span.start,
                    blob_start + blob.len() as u64
                ))
            })
    };
    let text = |what, span| bytes(what, span).map(|b| String::from_utf8_lossy(b).into_owned());
    Ok(Some(PythonCode {
        filename: text("filename", record.filename)?,
        name: text("name", record.name)?,
        qualname: text("qualname", record.qualname)?,
        first_line: record.first_line,
        line_table_kind: record.line_table_kind,
        line_table: bytes("line table", record.line_table)?.to_vec(),
    }))
}

/// Checks that every Python frame of `stacks` names a code record below `code_count`.
pub(crate) fn check_python_frames(stacks: &[Stack], code_count: u64) -> Result<(), ProfileError> {
    for stack in stacks {
        for &word in &stack.frames {
            if let FrameWord::Python { code, .. } = python::decode(word) {
                if u64::from(code) >= code_count {
                    return Err(ProfileError::PythonFrame {
                        id: stack.id,
                        code,
                        code_count,
                    });
                }
            }
        }
    }
    Ok(())
}

/// `PY_VERSION_HEX` as `3.11.7`; `None` for 0 (no Python in the process).
pub fn python_version_text(hex: u32) -> Option<String> {
    (hex != 0).then(|| format!("{}.{}.{}", hex >> 24, (hex >> 16) & 0xff, (hex >> 8) & 0xff))
}

#[cfg(test)]
#[path = "python_tests.rs"]
mod tests;
