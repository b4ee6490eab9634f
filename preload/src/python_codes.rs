//! Event → store (Python): interns code objects. The first time a stack holds a code
//! object, its file name, names and line table are copied into the profile's code records
//! and blob area, so the report needs neither the process nor Python to name the frame;
//! after that, finding its index is one lock-free probe.
//!
//! A code object is known by its address: when it dies (`python_code_deaths`), its slot is
//! marked dead, so a new code object at the same address gets a new record. Where deaths
//! cannot be seen, a check of the objects it owns (file name, name, line table) and its
//! first line stands in, which a code object made where one died with all of those reused
//! cannot tell apart. Table slots are written once, under a lock, and published by their
//! `code` word last, so readers never lock.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memwarden_abi::python::{BlobSpan, CodeRecord, MAX_CODE_INDEX};
use memwarden_abi::Header;

use crate::profile_file::ProfileFile;
use crate::python_layout::{
    PyLayout, BYTES_DATA, STATE_ASCII, STATE_COMPACT, STATE_KIND_MASK, STATE_KIND_SHIFT,
    UNICODE_LENGTH, UNICODE_STATE, VAR_SIZE,
};
use crate::spin;

const SLOT_BITS: u32 = 17;
const SLOTS: usize = 1 << SLOT_BITS;
/// The table takes no more codes past this load, so probes stay short.
const MAX_CODES: u64 = (SLOTS as u64) * 3 / 4;
/// A dead code object's slot: an address no object has.
const DEAD_CODE: u64 = 1;
/// Longest name copied (longer ones are cut at a character boundary).
const MAX_NAME_BYTES: usize = 4096;
/// Longest line table copied (longer ones are dropped: the frame shows its first line).
const MAX_LINE_TABLE_BYTES: usize = 1 << 20;

#[repr(C)]
struct Slot {
    code: AtomicU64,
    check: AtomicU64,
    index: AtomicU32,
    _pad: u32,
    _pad2: u64,
}

pub struct CodeTable {
    slots: *const Slot,
    lock: AtomicU32,
    waits: AtomicU64,
    entries: AtomicU64,
}

// SAFETY: the slot array is shared memory accessed only through atomics.
unsafe impl Sync for CodeTable {}
// SAFETY: as above.
unsafe impl Send for CodeTable {}

/// Reads a word of the interpreter's memory.
///
/// # Safety
/// `address` is readable: a field of an object the calling thread's own frames keep alive.
#[inline(always)]
pub unsafe fn read_u64(address: u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { (address as *const u64).read_unaligned() }
}

#[inline(always)]
unsafe fn read_u32(address: u64) -> u32 {
    // SAFETY: the caller's contract (as `read_u64`).
    unsafe { (address as *const u32).read_unaligned() }
}

impl CodeTable {
    pub fn new() -> Option<CodeTable> {
        // Zero-filled: every slot is empty. Its code object addresses must not count as roots
        // for the leak check (`map_scratch` notes it as memwarden's). Not on huge pages: a
        // small script's few hundred codes touch a third of its 4 KiB pages, where huge pages
        // would make all 4 MiB resident.
        let slots = crate::own_regions::map_scratch(SLOTS * core::mem::size_of::<Slot>())?;
        Some(CodeTable {
            slots: slots.cast(),
            lock: AtomicU32::new(0),
            waits: AtomicU64::new(0),
            entries: AtomicU64::new(0),
        })
    }

    fn slot(&self, index: usize) -> &Slot {
        // SAFETY: index is masked below SLOTS; the mapping lives for the process.
        unsafe { &*self.slots.add(index & (SLOTS - 1)) }
    }

    /// The record index of code object `code`, whose [`check_of`] is `check`, writing its
    /// record first if it is new; `None` when the table or the file is full.
    ///
    /// # Safety
    /// `code` is a live `PyCodeObject` of the layout `l` (a frame of the calling thread
    /// holds it), and `check` is `check_of(l, code)`.
    pub unsafe fn index_of(
        &self,
        file: &ProfileFile,
        l: &PyLayout,
        code: u64,
        check: u64,
    ) -> Option<u32> {
        if let Some(index) = self.find(code, check) {
            return Some(index);
        }
        let _lock = spin::lock(&self.lock, &self.waits);
        if let Some(index) = self.find(code, check) {
            return Some(index);
        }
        if self.entries.load(Ordering::Relaxed) >= MAX_CODES {
            return None;
        }
        // SAFETY: the caller's contract; records are written under the lock.
        let index = unsafe { write_record(file, l, code) }?;
        let mut at = start_of(code);
        loop {
            let slot = self.slot(at);
            if slot.code.load(Ordering::Relaxed) == 0 {
                slot.check.store(check, Ordering::Relaxed);
                slot.index.store(index, Ordering::Relaxed);
                slot.code.store(code, Ordering::Release);
                self.entries.fetch_add(1, Ordering::Relaxed);
                return Some(index);
            }
            at += 1;
        }
    }

    /// Code object `code` has died (`python_code_deaths`): its slot is left matching no
    /// address, so a code object made later at its address gets a record of its own.
    /// Without the lock: a live code object's slot is written only while a frame holds it,
    /// so never while it is dying, and probes skip the dead slot as any other.
    pub fn mark_dead(&self, code: u64) {
        let start = start_of(code);
        for at in start..start + SLOTS {
            let slot = self.slot(at);
            match slot.code.load(Ordering::Acquire) {
                0 => return,
                found if found == code => slot.code.store(DEAD_CODE, Ordering::Release),
                _ => {}
            }
        }
    }

    fn find(&self, code: u64, check: u64) -> Option<u32> {
        let mut at = start_of(code);
        loop {
            let slot = self.slot(at);
            match slot.code.load(Ordering::Acquire) {
                0 => return None,
                found if found == code && slot.check.load(Ordering::Relaxed) == check => {
                    return Some(slot.index.load(Ordering::Relaxed));
                }
                _ => at += 1,
            }
        }
    }

    /// Fork (prepare): no record may be half written when the child copies the file.
    pub fn lock_for_fork(&self) {
        spin::lock_raw(&self.lock, &self.waits);
    }

    /// Fork (parent and child): the lock taken by `lock_for_fork`.
    pub fn unlock_after_fork(&self) {
        spin::unlock_raw(&self.lock);
    }
}

fn start_of(code: u64) -> usize {
    ((code >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOT_BITS)) as usize
}

/// Identifies the source behind a code object address where code deaths are not seen: the
/// objects it owns cannot be freed while it lives, so a new code object at the same address
/// usually differs (not when all of them were freed with the old one and reused).
///
/// # Safety
/// `code` is a live `PyCodeObject` of the layout `l`.
#[inline]
pub unsafe fn check_of(l: &PyLayout, code: u64) -> u64 {
    // SAFETY: fields of a live code object (the caller's contract).
    let (filename, name, table, first_line) = unsafe {
        (
            read_u64(code + l.code_filename as u64),
            read_u64(code + l.code_name as u64),
            l.code_line_table.map_or(0, |at| read_u64(code + at as u64)),
            read_u32(code + l.code_first_line as u64),
        )
    };
    let mut mixed = filename ^ name.rotate_left(21) ^ table.rotate_left(42) ^ u64::from(first_line);
    mixed = (mixed ^ (mixed >> 31)).wrapping_mul(0x7fb5_d329_728e_a185);
    mixed ^ (mixed >> 29)
}

/// Copies `code`'s names and line table into the file; its new record index.
unsafe fn write_record(file: &ProfileFile, l: &PyLayout, code: u64) -> Option<u32> {
    let count = file.counter(core::mem::offset_of!(Header, code_count));
    let index = count.load(Ordering::Relaxed);
    let layout = file.layout();
    if index >= layout.code_capacity || index > u64::from(MAX_CODE_INDEX) {
        return None;
    }
    let record_offset = layout.code_offset(index);
    if !file.back(record_offset, core::mem::size_of::<CodeRecord>() as u64) {
        return None;
    }
    // SAFETY: fields of a live code object (the caller's contract).
    let (filename, name, qualname, table, first_line) = unsafe {
        (
            read_u64(code + l.code_filename as u64),
            read_u64(code + l.code_name as u64),
            read_u64(code + l.code_qualname as u64),
            l.code_line_table.map_or(0, |at| read_u64(code + at as u64)),
            read_u32(code + l.code_first_line as u64) as i32,
        )
    };
    // SAFETY: strings and bytes owned by the live code object.
    let (filename, name, qualname, line_table) = unsafe {
        (
            copy_string(file, l, filename)?,
            copy_string(file, l, name)?,
            copy_string(file, l, qualname)?,
            copy_bytes(file, table)?,
        )
    };
    let line_table_kind = if line_table.len == 0 {
        memwarden_abi::python::line_table::NONE
    } else {
        memwarden_abi::python::line_table::LOCATIONS_311
    };
    let record = CodeRecord {
        published: 1,
        line_table_kind,
        first_line,
        filename,
        name,
        qualname,
        line_table,
        ..CodeRecord::default()
    };
    // SAFETY: record `index` lies inside the mapping, is backed, and is written only here,
    // under the table lock; the count is raised after, so readers never see it half done.
    unsafe {
        file.base()
            .add(record_offset as usize)
            .cast::<CodeRecord>()
            .write_unaligned(record);
    }
    count.store(index + 1, Ordering::Release);
    Some(index as u32)
}

/// Claims `len` bytes of the blob area; its span, or `None` if the area is full.
fn claim_blob(file: &ProfileFile, len: usize) -> Option<(BlobSpan, *mut u8)> {
    let used = file.counter(core::mem::offset_of!(Header, blob_used));
    let start = used.load(Ordering::Relaxed);
    let layout = file.layout();
    let end = start.checked_add(len as u64)?;
    if end > layout.blob_capacity || end > u64::from(u32::MAX) {
        return None;
    }
    if !file.back(layout.blob_offset + start, len as u64) {
        return None;
    }
    used.store(end, Ordering::Release);
    let span = BlobSpan {
        start: start as u32,
        len: len as u32,
    };
    // SAFETY: the claimed bytes lie inside the mapping (end ≤ blob_capacity).
    let at = unsafe { file.base().add((layout.blob_offset + start) as usize) };
    Some((span, at))
}

/// Copies `len` bytes from `from` into the blob area.
unsafe fn copy_into_blob(file: &ProfileFile, from: *const u8, len: usize) -> Option<BlobSpan> {
    let (span, to) = claim_blob(file, len)?;
    // SAFETY: `from` holds `len` readable bytes (caller); `to` has room for them.
    unsafe { core::ptr::copy_nonoverlapping(from, to, len) };
    Some(span)
}

/// Copies a `bytes` object's contents (a line table); an empty span if it is too long.
unsafe fn copy_bytes(file: &ProfileFile, bytes: u64) -> Option<BlobSpan> {
    if bytes == 0 {
        return Some(BlobSpan::default());
    }
    // SAFETY: `bytes` is a live bytes object (caller): ob_size, then the data.
    let len = unsafe { read_u64(bytes + VAR_SIZE as u64) } as usize;
    if len > MAX_LINE_TABLE_BYTES {
        return Some(BlobSpan::default());
    }
    // SAFETY: the object's data holds `len` bytes.
    unsafe { copy_into_blob(file, (bytes + BYTES_DATA as u64) as *const u8, len) }
}

/// Copies a `str` object as UTF-8. Compact strings (every name and file name CPython makes)
/// are read directly; anything else is written as `?`.
unsafe fn copy_string(file: &ProfileFile, l: &PyLayout, string: u64) -> Option<BlobSpan> {
    if string == 0 {
        // SAFETY: a static one-byte string.
        return unsafe { copy_into_blob(file, b"?".as_ptr(), 1) };
    }
    // SAFETY: `string` is a live str object (caller).
    let (state, length) = unsafe {
        (
            read_u32(string + UNICODE_STATE as u64),
            read_u64(string + UNICODE_LENGTH as u64) as usize,
        )
    };
    if state & STATE_COMPACT == 0 {
        // SAFETY: a static one-byte string.
        return unsafe { copy_into_blob(file, b"?".as_ptr(), 1) };
    }
    if state & STATE_ASCII != 0 {
        let data = (string + l.ascii_size as u64) as *const u8;
        // SAFETY: a compact ASCII string's characters follow its header.
        return unsafe { copy_into_blob(file, data, length.min(MAX_NAME_BYTES)) };
    }
    // SAFETY: a compact non-ASCII string: its UTF-8 cache pointer and length.
    let (utf8, utf8_length) = unsafe {
        (
            read_u64(string + l.compact_utf8 as u64),
            read_u64(string + l.compact_utf8_length as u64) as usize,
        )
    };
    if utf8 != 0 {
        let len = cut_at_boundary(utf8 as *const u8, utf8_length, MAX_NAME_BYTES);
        // SAFETY: the cache holds `utf8_length` ≥ len bytes.
        return unsafe { copy_into_blob(file, utf8 as *const u8, len) };
    }
    let kind = (state >> STATE_KIND_SHIFT) & STATE_KIND_MASK;
    let data = string + l.compact_size as u64;
    // SAFETY: `length` characters of `kind` bytes each follow the compact header.
    unsafe { encode_utf8(file, data, kind, length) }
}

/// Length of the longest prefix of at most `limit` bytes that ends on a UTF-8 boundary.
fn cut_at_boundary(text: *const u8, len: usize, limit: usize) -> usize {
    let mut cut = len.min(limit);
    // SAFETY: `cut < len` bytes of `text` are readable.
    while cut < len && cut > 0 && unsafe { *text.add(cut) } & 0xc0 == 0x80 {
        cut -= 1;
    }
    cut
}

/// Writes `length` code points of `kind` (1, 2 or 4) bytes each, at `data`, as UTF-8.
unsafe fn encode_utf8(file: &ProfileFile, data: u64, kind: u32, length: usize) -> Option<BlobSpan> {
    let code_point = |i: usize| -> u32 {
        // SAFETY: i < length; the string holds `length` units of `kind` bytes.
        unsafe {
            match kind {
                1 => u32::from(*(data as *const u8).add(i)),
                2 => u32::from((data as *const u16).add(i).read_unaligned()),
                _ => (data as *const u32).add(i).read_unaligned(),
            }
        }
    };
    let mut units = 0usize;
    let mut bytes = 0usize;
    while units < length {
        let width = char::from_u32(code_point(units)).map_or(3, char::len_utf8);
        if bytes + width > MAX_NAME_BYTES {
            break;
        }
        bytes += width;
        units += 1;
    }
    let (span, to) = claim_blob(file, bytes)?;
    let mut at = 0usize;
    for i in 0..units {
        let character = char::from_u32(code_point(i)).unwrap_or(char::REPLACEMENT_CHARACTER);
        let mut buffer = [0u8; 4];
        let encoded = character.encode_utf8(&mut buffer).as_bytes();
        // SAFETY: the claimed span has room for every character counted above.
        unsafe { core::ptr::copy_nonoverlapping(encoded.as_ptr(), to.add(at), encoded.len()) };
        at += encoded.len();
    }
    Some(span)
}
