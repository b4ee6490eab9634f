//! The synthetic store's byte writer: puts each record's fields at the offsets
//! `memwarden-abi` declares (see `synthetic.rs`, the builder that calls it).

use std::mem::offset_of;

use memwarden_abi::python::CodeRecord;
use memwarden_abi::{ErrorRecord, FailureRecord, Header, LeakRecord, ModuleRecord, StackRecord};

use super::SyntheticModule;

pub(super) fn put(file: &mut [u8], offset: impl TryInto<usize>, bytes: &[u8]) {
    let Ok(offset) = offset.try_into() else {
        panic!("offset beyond usize")
    };
    file[offset..offset + bytes.len()].copy_from_slice(bytes);
}

/// Puts `words` one after the other at `at`, little-endian.
fn put_words(file: &mut [u8], at: usize, words: &[u64]) {
    for (i, word) in words.iter().enumerate() {
        put(file, at + 8 * i, &word.to_le_bytes());
    }
}

/// Puts each named field of `record` (a `Type`) at `at` plus its offset, little-endian.
macro_rules! put_fields {
    ($file:expr, $at:expr, $type:ty, $record:expr; $($name:ident),+ $(,)?) => {
        $(put($file, $at + offset_of!($type, $name), &$record.$name.to_le_bytes());)+
    };
}

pub(super) fn write_header(file: &mut [u8], h: &Header) {
    put(file, offset_of!(Header, magic), &h.magic);
    put_fields!(
        file, 0, Header, h;
        version, header_size, pid, ppid, max_depth, exit_kind, exit_value,
        degraded_reason, start_realtime_ns, start_monotonic_ns
    );
    let layout = offset_of!(Header, layout);
    let l = h.layout;
    let words = crate::profile::plain::layout_fields(&l);
    for (offset, value) in words {
        put(file, layout + offset, &value.to_le_bytes());
    }
    put_words(file, offset_of!(Header, heap), &h.heap);
    put_words(file, offset_of!(Header, blocks), &h.blocks);
    put_fields!(
        file, 0, Header, h;
        peak_time_ns, rise_time_ns, end_time_ns, stack_count, frame_words_used,
        module_count, flags, untracked_allocations, argv_len, lock_waits,
        heap_cas_retries, failure_count, crash_signal, crash_depth, error_count,
        guard_mode, code_count, blob_used, python_version, leak_status, leak_view,
        leak_record_count, leak_scanned_bytes, leak_scan_ns, leak_threads_stopped,
        leak_threads_missed
    );
    put_words(file, offset_of!(Header, crash_frames), &h.crash_frames);
    put(file, offset_of!(Header, argv), &h.argv);
}

pub(super) fn write_failure(file: &mut [u8], at: usize, r: &FailureRecord) {
    put_fields!(
        file, at, FailureRecord, r;
        seq, call, size, time_ns, stack, function, rule
    );
}

pub(super) fn write_leak(file: &mut [u8], at: usize, r: &LeakRecord) {
    put_fields!(
        file, at, LeakRecord, r;
        stack, kind, blocks, bytes
    );
}

pub(super) fn write_error(file: &mut [u8], at: usize, r: &ErrorRecord) {
    put_fields!(
        file, at, ErrorRecord, r;
        kind, stack, address, block_size, offset, alloc_stack, free_stack, time_ns
    );
}

pub(super) fn write_stack(file: &mut [u8], at: usize, r: &StackRecord) {
    put_fields!(
        file, at, StackRecord, r;
        published, depth, frames_start, live_bytes, live_blocks, snap_bytes, snap_blocks,
        snap_peak, max_live_bytes, allocated_bytes, allocations, frees, category
    );
}

pub(super) fn write_code(file: &mut [u8], at: usize, r: &CodeRecord) {
    put_fields!(
        file, at, CodeRecord, r;
        published, line_table_kind, first_line
    );
    let spans = [
        (offset_of!(CodeRecord, filename), r.filename),
        (offset_of!(CodeRecord, name), r.name),
        (offset_of!(CodeRecord, qualname), r.qualname),
        (offset_of!(CodeRecord, line_table), r.line_table),
    ];
    for (offset, span) in spans {
        put(file, at + offset, &span.start.to_le_bytes());
        put(file, at + offset + 4, &span.len.to_le_bytes());
    }
}

pub(super) fn write_module(file: &mut [u8], at: usize, m: &SyntheticModule) {
    let field = |name: usize| at + name;
    put(
        file,
        field(offset_of!(ModuleRecord, published)),
        &1u32.to_le_bytes(),
    );
    let path_len = m.path.len() as u32;
    put(
        file,
        field(offset_of!(ModuleRecord, path_len)),
        &path_len.to_le_bytes(),
    );
    put(
        file,
        field(offset_of!(ModuleRecord, base)),
        &m.base.to_le_bytes(),
    );
    put(
        file,
        field(offset_of!(ModuleRecord, start)),
        &m.start.to_le_bytes(),
    );
    put(
        file,
        field(offset_of!(ModuleRecord, end)),
        &m.end.to_le_bytes(),
    );
    let id_len = m.build_id.len() as u32;
    put(
        file,
        field(offset_of!(ModuleRecord, build_id_len)),
        &id_len.to_le_bytes(),
    );
    put(
        file,
        field(offset_of!(ModuleRecord, module_flags)),
        &m.flags.to_le_bytes(),
    );
    put(file, field(offset_of!(ModuleRecord, build_id)), &m.build_id);
    put(
        file,
        field(offset_of!(ModuleRecord, path)),
        m.path.as_bytes(),
    );
}
