//! Event → store (Python): the names of a code object, read back from the code record the
//! profile holds, without allocating. For what the preload itself says of a Python frame:
//! a heap error printed at once on stderr, a fault rule's `in=` glob.

use core::sync::atomic::Ordering;

use memwarden_abi::python::{BlobSpan, CodeRecord};
use memwarden_abi::Header;

use crate::profile_file::ProfileFile;

/// A code object's names, as copied into the profile.
pub struct CodeNames<'f> {
    /// `co_qualname` (`Parser.parse`), or `co_name` before 3.11.
    pub qualname: &'f [u8],
    /// `co_name` (`parse`).
    pub name: &'f [u8],
    /// `co_filename`, as Python knew it.
    pub filename: &'f [u8],
}

/// The names of code record `index`, if it is written and published (a full code table
/// leaves later codes without a record).
pub fn code_names(file: &ProfileFile, index: u32) -> Option<CodeNames<'_>> {
    let record = code_record(file, index)?;
    Some(CodeNames {
        qualname: blob(file, record.qualname)?,
        name: blob(file, record.name)?,
        filename: blob(file, record.filename)?,
    })
}

fn code_record(file: &ProfileFile, index: u32) -> Option<CodeRecord> {
    let written = file
        .counter(core::mem::offset_of!(Header, code_count))
        .load(Ordering::Acquire);
    if u64::from(index) >= written {
        return None;
    }
    let offset = file.layout().code_offset(u64::from(index));
    // SAFETY: records below the count lie inside the mapping, are backed, and were written
    // whole before the count was raised past them (release store, acquire load above).
    let record = unsafe {
        file.base()
            .add(offset as usize)
            .cast::<CodeRecord>()
            .read_unaligned()
    };
    (record.published != 0).then_some(record)
}

/// The bytes of `span` in the blob area, if it lies within the part claimed.
fn blob(file: &ProfileFile, span: BlobSpan) -> Option<&[u8]> {
    let used = file
        .counter(core::mem::offset_of!(Header, blob_used))
        .load(Ordering::Acquire);
    let end = u64::from(span.start).checked_add(u64::from(span.len))?;
    if end > used {
        return None;
    }
    let start = file.layout().blob_offset + u64::from(span.start);
    // SAFETY: the span lies within the blob bytes claimed so far, inside the mapping and
    // backed; a published record's blob bytes were written before it and never change.
    Some(unsafe { core::slice::from_raw_parts(file.base().add(start as usize), span.len as usize) })
}
