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

pub(super) fn write_header(file: &mut [u8], h: &Header) {
    macro_rules! field {
        ($name:ident) => {
            put(file, offset_of!(Header, $name), &h.$name.to_le_bytes())
        };
    }
    put(file, offset_of!(Header, magic), &h.magic);
    field!(version);
    field!(header_size);
    field!(pid);
    field!(ppid);
    field!(max_depth);
    field!(exit_kind);
    field!(exit_value);
    field!(degraded_reason);
    field!(start_realtime_ns);
    field!(start_monotonic_ns);
    let layout = offset_of!(Header, layout);
    let l = h.layout;
    let words = crate::profile::plain::layout_fields(&l);
    for (offset, value) in words {
        put(file, layout + offset, &value.to_le_bytes());
    }
    for (i, word) in h.heap.iter().enumerate() {
        put(file, offset_of!(Header, heap) + 8 * i, &word.to_le_bytes());
    }
    for (i, word) in h.blocks.iter().enumerate() {
        put(
            file,
            offset_of!(Header, blocks) + 8 * i,
            &word.to_le_bytes(),
        );
    }
    field!(peak_time_ns);
    field!(rise_time_ns);
    field!(end_time_ns);
    field!(stack_count);
    field!(frame_words_used);
    field!(module_count);
    field!(flags);
    field!(untracked_allocations);
    field!(argv_len);
    field!(lock_waits);
    field!(heap_cas_retries);
    field!(failure_count);
    field!(crash_signal);
    field!(crash_depth);
    field!(error_count);
    field!(guard_mode);
    field!(code_count);
    field!(blob_used);
    field!(python_version);
    field!(leak_status);
    field!(leak_view);
    field!(leak_record_count);
    field!(leak_scanned_bytes);
    field!(leak_scan_ns);
    field!(leak_threads_stopped);
    field!(leak_threads_missed);
    for (i, word) in h.crash_frames.iter().enumerate() {
        put(
            file,
            offset_of!(Header, crash_frames) + 8 * i,
            &word.to_le_bytes(),
        );
    }
    put(file, offset_of!(Header, argv), &h.argv);
}

pub(super) fn write_failure(file: &mut [u8], at: usize, r: &FailureRecord) {
    macro_rules! field {
        ($name:ident) => {
            put(
                file,
                at + offset_of!(FailureRecord, $name),
                &r.$name.to_le_bytes(),
            )
        };
    }
    field!(seq);
    field!(call);
    field!(size);
    field!(time_ns);
    field!(stack);
    field!(function);
    field!(rule);
}

pub(super) fn write_leak(file: &mut [u8], at: usize, r: &LeakRecord) {
    macro_rules! field {
        ($name:ident) => {
            put(
                file,
                at + offset_of!(LeakRecord, $name),
                &r.$name.to_le_bytes(),
            )
        };
    }
    field!(stack);
    field!(kind);
    field!(blocks);
    field!(bytes);
}

pub(super) fn write_error(file: &mut [u8], at: usize, r: &ErrorRecord) {
    macro_rules! field {
        ($name:ident) => {
            put(
                file,
                at + offset_of!(ErrorRecord, $name),
                &r.$name.to_le_bytes(),
            )
        };
    }
    field!(kind);
    field!(stack);
    field!(address);
    field!(block_size);
    field!(offset);
    field!(alloc_stack);
    field!(free_stack);
    field!(time_ns);
}

pub(super) fn write_stack(file: &mut [u8], at: usize, r: &StackRecord) {
    macro_rules! field {
        ($name:ident) => {
            put(
                file,
                at + offset_of!(StackRecord, $name),
                &r.$name.to_le_bytes(),
            )
        };
    }
    field!(published);
    field!(depth);
    field!(frames_start);
    field!(live_bytes);
    field!(live_blocks);
    field!(snap_bytes);
    field!(snap_blocks);
    field!(snap_peak);
    field!(max_live_bytes);
    field!(allocated_bytes);
    field!(allocations);
    field!(frees);
    field!(category);
}

pub(super) fn write_code(file: &mut [u8], at: usize, r: &CodeRecord) {
    macro_rules! field {
        ($name:ident) => {
            put(
                file,
                at + offset_of!(CodeRecord, $name),
                &r.$name.to_le_bytes(),
            )
        };
    }
    field!(published);
    field!(line_table_kind);
    field!(first_line);
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
