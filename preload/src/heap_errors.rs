//! Event → store (guard modes): reports one heap error — recorded in the profile's error
//! region and written at once to stderr in the sanitizer style CI logs grep for. This runs
//! on the error path, so it allocates nothing and uses no stdio: native frames are printed
//! raw (address, module and offset), Python frames by their code's file and name as the
//! profile holds them, markers not at all; `memwarden run` prints every frame symbolized
//! when the run ends.

use core::sync::atomic::Ordering;

use memwarden_abi::python::{self, FrameWord};
use memwarden_abi::{error_kind, ErrorRecord, Header, UNKNOWN_STACK_ID};

use crate::log;
use crate::profile_file::clock_ns;
use crate::python_code_names::code_names;
use crate::recorder::Recorder;
use crate::snapshot;

/// A heap error as found: see [`ErrorRecord`] for the fields.
pub struct HeapError {
    pub kind: u32,
    pub address: u64,
    pub block_size: u64,
    pub offset: i64,
    pub stack: u32,
    pub alloc_stack: u32,
    pub free_stack: u32,
}

impl HeapError {
    /// An error of `kind` at `address`, found by the call or access at `stack`, in no block
    /// the preload knows (block size 0, no allocation or free stack).
    pub fn without_block(kind: u32, address: u64, stack: u32) -> HeapError {
        HeapError {
            kind,
            address,
            block_size: 0,
            offset: 0,
            stack,
            alloc_stack: UNKNOWN_STACK_ID,
            free_stack: UNKNOWN_STACK_ID,
        }
    }
}

/// Records `error` in the profile and prints it on stderr.
pub fn report(recorder: &Recorder, error: &HeapError) {
    record(recorder, error);
    print(recorder, error);
}

fn record(recorder: &Recorder, error: &HeapError) {
    let file = &recorder.file;
    let index = file
        .counter(core::mem::offset_of!(Header, error_count))
        .fetch_add(1, Ordering::Relaxed);
    let layout = *file.layout();
    let size = core::mem::size_of::<ErrorRecord>() as u64;
    if index >= layout.error_capacity || !file.back(layout.error_offset(index), size) {
        return;
    }
    // SAFETY: written once before tracking starts.
    let start = unsafe { (*file.header()).start_monotonic_ns };
    let record = ErrorRecord {
        kind: error.kind,
        stack: error.stack,
        address: error.address,
        block_size: error.block_size,
        offset: error.offset,
        alloc_stack: error.alloc_stack,
        free_stack: error.free_stack,
        time_ns: clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(start),
    };
    // SAFETY: record `index` was claimed by this thread alone (fetch-add), lies inside the
    // mapping and is backed.
    unsafe { file.error_record(index).write(record) };
}

fn print(recorder: &Recorder, error: &HeapError) {
    let mut pid_digits = [0u8; 20];
    // SAFETY: getpid has no preconditions.
    let pid = log::decimal(unsafe { libc::getpid() } as u64, &mut pid_digits);
    let mut address = [0u8; 18];
    let mut size = [0u8; 20];
    let mut distance = [0u8; 20];
    let name = error_kind::name(error.kind).as_bytes();
    log::raw(b"=================================================================\n==");
    log::raw(pid);
    log::raw(b"==ERROR: memwarden: ");
    log::raw(name);
    log::raw(b" on address ");
    log::raw(log::hex(error.address, &mut address));
    log::raw(b"\n");
    print_stack(recorder, error.stack);
    if error.block_size > 0 || error.alloc_stack != UNKNOWN_STACK_ID {
        let (amount, place): (u64, &[u8]) = match error.kind {
            error_kind::SIZE_MISMATCH => (
                error.offset.unsigned_abs(),
                b" bytes claimed by the deallocation, for the ",
            ),
            _ if error.offset < 0 => (error.offset.unsigned_abs(), b" bytes before the "),
            _ if error.offset as u64 >= error.block_size => {
                (error.offset as u64 - error.block_size, b" bytes after the ")
            }
            _ => (error.offset as u64, b" bytes inside the "),
        };
        log::raw(log::hex(error.address, &mut address));
        log::raw(b" is located ");
        log::raw(log::decimal(amount, &mut distance));
        log::raw(place);
        log::raw(log::decimal(error.block_size, &mut size));
        log::raw(b"-byte block allocated at:\n");
        print_stack(recorder, error.alloc_stack);
    }
    if error.free_stack != UNKNOWN_STACK_ID {
        log::raw(b"freed at:\n");
        print_stack(recorder, error.free_stack);
    }
    log::raw(b"SUMMARY: memwarden: ");
    log::raw(name);
    log::raw(b"\n");
}

/// Prints a stored stack, one line per frame: `#i 0xADDRESS (module+0xOFFSET)` for a
/// native frame, `#i function (file:line)` for a Python frame (`file, instruction N` when
/// its line is not resolved yet). Marker words are not frames, and are left out.
fn print_stack(recorder: &Recorder, stack: u32) {
    let frames = recorder.frames_of(stack);
    if frames.is_empty() {
        log::raw(b"    (stack not known)\n");
        return;
    }
    let snapshot = snapshot::snapshot();
    let shown = frames
        .iter()
        .map(|&word| python::decode(word))
        .filter(|frame| !matches!(frame, FrameWord::Marker(_)));
    for (index, frame) in (0u64..).zip(shown) {
        let mut number = [0u8; 20];
        log::raw(b"    #");
        log::raw(log::decimal(index, &mut number));
        log::raw(b" ");
        match frame {
            FrameWord::Python {
                code,
                value,
                line_resolved,
            } => print_python_frame(recorder, code, value, line_resolved),
            // Markers were left out above; should one come, it prints as a word.
            FrameWord::Native(address) | FrameWord::Marker(address) => {
                print_native_frame(snapshot, address)
            }
        }
    }
}

/// Prints `0xADDRESS (module+0xOFFSET)` of a native frame (the module when it is known).
fn print_native_frame(snapshot: Option<&snapshot::Snapshot>, address: u64) {
    let mut hex = [0u8; 18];
    let mut offset = [0u8; 18];
    log::raw(log::hex(address, &mut hex));
    if let Some((path, base)) = snapshot.and_then(|s| s.module_of(address.wrapping_sub(1))) {
        log::raw(b" (");
        log::raw(path);
        log::raw(b"+");
        log::raw(log::hex(address.wrapping_sub(base), &mut offset));
        log::raw(b")");
    }
    log::raw(b"\n");
}

/// Prints `qualname (file:line)` of a Python frame, from its code record; `[Python frame]`
/// when the record is not there (the code table was full).
fn print_python_frame(recorder: &Recorder, code: u32, value: u32, line_resolved: bool) {
    let mut digits = [0u8; 20];
    let Some(names) = code_names(&recorder.file, code) else {
        log::raw(b"[Python frame]\n");
        return;
    };
    log::raw(names.qualname);
    log::raw(b" (");
    log::raw(names.filename);
    log::raw(if line_resolved {
        b":"
    } else {
        b", instruction "
    });
    log::raw(log::decimal(u64::from(value), &mut digits));
    log::raw(b")\n");
}
