//! A stand-in for the preload's store, for tests: builds profile files in memory, field by
//! field at the offsets `memwarden-abi` declares, so the reader can be tested without
//! LD_PRELOAD and without `unsafe`.

use memwarden_abi::python::{line_table, BlobSpan, CodeRecord};
use memwarden_abi::{
    exit_kind, leak_status, ErrorRecord, FailureRecord, Header, Layout, LeakRecord, StackRecord,
    ARGV_CAPACITY, CRASH_DEPTH, FORMAT_VERSION, MAGIC,
};

use super::{read_profile, Profile};
use records::{
    put, write_code, write_error, write_failure, write_header, write_leak, write_module,
    write_stack,
};

#[path = "synthetic_records.rs"]
mod records;
use crate::Exit;

/// The leak record of `blocks` blocks, `bytes` bytes, of kind `kind` at stack `stack`.
pub fn leak_record(stack: u32, kind: u32, blocks: u64, bytes: u64) -> LeakRecord {
    LeakRecord {
        stack,
        kind,
        blocks,
        bytes,
        reserved: 0,
    }
}

/// A stack record with every field zero except `published`.
pub fn stack_record() -> StackRecord {
    StackRecord {
        lock: 0,
        published: 1,
        depth: 0,
        next: 0,
        hash: 0,
        frames_start: 0,
        live_bytes: 0,
        live_blocks: 0,
        snap_bytes: 0,
        snap_blocks: 0,
        snap_peak: 0,
        max_live_bytes: 0,
        allocated_bytes: 0,
        allocations: 0,
        frees: 0,
        category: 0,
        reserved0: 0,
    }
}

/// A module to put in a synthetic profile.
#[derive(Clone, Debug, Default)]
pub struct SyntheticModule {
    /// Path of the mapped file.
    pub path: String,
    /// Load bias.
    pub base: u64,
    /// Lowest runtime address.
    pub start: u64,
    /// One past the highest runtime address.
    pub end: u64,
    /// `MODULE_*` bits.
    pub flags: u32,
    /// GNU build id.
    pub build_id: Vec<u8>,
}

impl SyntheticModule {
    /// A 4 KiB module at `start` (its load bias too), without a build id.
    pub fn at(path: &str, start: u64, flags: u32) -> SyntheticModule {
        SyntheticModule {
            path: path.into(),
            base: start,
            start,
            end: start + 0x1000,
            flags,
            build_id: Vec::new(),
        }
    }
}

/// A Python code object to put in a synthetic profile.
#[derive(Clone, Debug, Default)]
pub struct SyntheticCode {
    /// `co_filename`.
    pub filename: String,
    /// `co_name`.
    pub name: String,
    /// `co_qualname`.
    pub qualname: String,
    /// `co_firstlineno`.
    pub first_line: i32,
    /// `co_linetable`: with an empty table the record says `line_table::NONE`, else
    /// `line_table::LOCATIONS_311`.
    pub line_table: Vec<u8>,
}

impl SyntheticCode {
    /// Function `name` (its qualified name too) of `filename`, from line 1, with no line
    /// table: its frame words carry their lines resolved.
    pub fn function(filename: &str, name: &str) -> SyntheticCode {
        SyntheticCode {
            filename: filename.into(),
            name: name.into(),
            qualname: name.into(),
            first_line: 1,
            line_table: vec![],
        }
    }
}

/// Builds the bytes of a profile file.
#[derive(Clone)]
pub struct ProfileBuilder {
    /// The header, written as is apart from layout, counts and argv.
    pub header: Header,
    /// Modules, in order.
    pub modules: Vec<SyntheticModule>,
    /// Stacks after the reserved id 0: `(frames, record)`; depth, frames_start are set.
    pub stacks: Vec<(Vec<u64>, StackRecord)>,
    /// The reserved stack 0.
    pub unknown_stack: StackRecord,
    /// Arguments.
    pub argv: Vec<String>,
    /// Injected-failure records, written up to the failure capacity (16). The header's
    /// `failure_count` is their number unless it was set higher.
    pub failures: Vec<FailureRecord>,
    /// Heap-error records, written up to the error capacity (16). The header's
    /// `error_count` is their number unless it was set higher.
    pub errors: Vec<ErrorRecord>,
    /// Python code records, in index order, written up to the code capacity (16). The
    /// header's `code_count` is their number unless it was set higher.
    pub codes: Vec<CodeRecord>,
    /// The blob area's bytes in use (at most 4096): `blob_used` is their length.
    pub blob: Vec<u8>,
    /// Leak-check records. With any, the file has room for [`LEAK_CAPACITY`] of them and
    /// the leak check is `DONE` (unless the header says otherwise); `leak_record_count` is
    /// their number unless it was set higher.
    pub leaks: Vec<LeakRecord>,
}

/// Leak records a synthetic profile with any has room for.
pub const LEAK_CAPACITY: u64 = 16;

impl ProfileBuilder {
    /// A profile of process `pid` with nothing recorded yet, max_depth 64, small capacities.
    pub fn new(pid: u32) -> Self {
        let Some(layout) = Layout::new(16, 64, 1024, 16, 16, 16, 4096) else {
            unreachable!("small capacities fit")
        };
        let header = Header {
            magic: MAGIC,
            version: FORMAT_VERSION,
            header_size: size_of::<Header>() as u32,
            pid,
            ppid: 1,
            max_depth: 64,
            exit_kind: exit_kind::UNKNOWN,
            exit_value: 0,
            degraded_reason: 0,
            start_realtime_ns: 0,
            start_monotonic_ns: 0,
            layout,
            heap: [0, 0],
            blocks: [0, 0],
            peak_time_ns: 0,
            rise_time_ns: 0,
            end_time_ns: 0,
            stack_count: 0,
            frame_words_used: 0,
            module_count: 0,
            flags: 0,
            untracked_allocations: 0,
            argv_len: 0,
            reserved0: 0,
            lock_waits: 0,
            heap_cas_retries: 0,
            failure_count: 0,
            crash_signal: 0,
            crash_depth: 0,
            crash_frames: [0; memwarden_abi::CRASH_DEPTH],
            error_count: 0,
            guard_mode: 0,
            reserved1: 0,
            code_count: 0,
            blob_used: 0,
            python_version: 0,
            reserved2: 0,
            leak_status: 0,
            leak_view: 0,
            leak_record_count: 0,
            leak_scanned_bytes: 0,
            leak_scan_ns: 0,
            leak_threads_stopped: 0,
            leak_threads_missed: 0,
            reserved: [0; 22],
            argv: [0; ARGV_CAPACITY],
        };
        let mut unknown_stack = stack_record();
        unknown_stack.published = 0;
        ProfileBuilder {
            header,
            modules: Vec::new(),
            stacks: Vec::new(),
            unknown_stack,
            argv: Vec::new(),
            failures: Vec::new(),
            errors: Vec::new(),
            codes: Vec::new(),
            blob: Vec::new(),
            leaks: Vec::new(),
        }
    }

    /// Adds a published Python code record (index: the number of records before it), its
    /// strings and line table appended to the blob area.
    pub fn python_code(mut self, code: SyntheticCode) -> Self {
        let mut span = |bytes: &[u8]| {
            let span = BlobSpan {
                start: self.blob.len() as u32,
                len: bytes.len() as u32,
            };
            self.blob.extend_from_slice(bytes);
            span
        };
        let record = CodeRecord {
            published: 1,
            line_table_kind: if code.line_table.is_empty() {
                line_table::NONE
            } else {
                line_table::LOCATIONS_311
            },
            first_line: code.first_line,
            reserved0: 0,
            filename: span(code.filename.as_bytes()),
            name: span(code.name.as_bytes()),
            qualname: span(code.qualname.as_bytes()),
            line_table: span(&code.line_table),
            reserved: [0; 2],
        };
        self.codes.push(record);
        self
    }

    /// Sets the Python version found (`PY_VERSION_HEX`).
    pub fn python_version(mut self, hex: u32) -> Self {
        self.header.python_version = hex;
        self
    }

    /// Adds a heap-error record.
    pub fn error(mut self, record: ErrorRecord) -> Self {
        self.errors.push(record);
        self
    }

    /// Sets the guard mode (one of `memwarden_abi::guard_mode`).
    pub fn guard_mode(mut self, mode: u32) -> Self {
        self.header.guard_mode = mode;
        self
    }

    /// Adds a leak-check record.
    pub fn leak(mut self, record: LeakRecord) -> Self {
        self.leaks.push(record);
        self
    }

    /// Adds an injected-failure record.
    pub fn failure(mut self, record: FailureRecord) -> Self {
        self.failures.push(record);
        self
    }

    /// Records a crash: its signal and frames (innermost first, at most [`CRASH_DEPTH`]).
    pub fn crash(mut self, signal: u32, frames: &[u64]) -> Self {
        self.header.crash_signal = signal;
        self.header.crash_depth = frames.len() as u32;
        self.header.crash_frames = [0; CRASH_DEPTH];
        self.header.crash_frames[..frames.len()].copy_from_slice(frames);
        self
    }

    /// Sets the command line.
    pub fn argv(mut self, argv: &[&str]) -> Self {
        self.argv = argv.iter().map(|a| a.to_string()).collect();
        self
    }

    /// Sets the recorded exit.
    pub fn exit(mut self, exit: Option<Exit>) -> Self {
        (self.header.exit_kind, self.header.exit_value) = match exit {
            None => (exit_kind::UNKNOWN, 0),
            Some(Exit::Code(code)) => (exit_kind::CODE, code),
            Some(Exit::Signal(signal)) => (exit_kind::SIGNAL, signal),
        };
        self
    }

    /// Sets the monotonic start time.
    pub fn start_ns(mut self, ns: u64) -> Self {
        self.header.start_monotonic_ns = ns;
        self
    }

    /// Sets `heap = [live, peak]`.
    pub fn heap(mut self, live: u64, peak: u64) -> Self {
        self.header.heap = [live, peak];
        self
    }

    /// Adds a published stack with these frames and figures.
    pub fn stack(mut self, frames: &[u64], record: StackRecord) -> Self {
        self.stacks.push((frames.to_vec(), record));
        self
    }

    /// Adds a module.
    pub fn module(mut self, module: SyntheticModule) -> Self {
        self.modules.push(module);
        self
    }

    /// The file bytes, `layout.file_size` long.
    pub fn build(&self) -> Vec<u8> {
        let mut header = self.header;
        if !self.leaks.is_empty() {
            let Some(layout) = header.layout.with_leak_capacity(LEAK_CAPACITY) else {
                unreachable!("small capacities fit")
            };
            header.layout = layout;
            if header.leak_status == 0 {
                header.leak_status = leak_status::DONE;
            }
        }
        let layout = header.layout;
        let mut file = vec![0u8; layout.file_size as usize];
        let mut frame_words = 0u64;
        let mut put_stack = |id: u64, frames: &[u64], record: &StackRecord| {
            let mut record = *record;
            if id != 0 {
                record.depth = frames.len() as u32;
                record.frames_start = frame_words;
            }
            for &frame in frames {
                put(
                    &mut file,
                    layout.frame_offset(frame_words),
                    &frame.to_le_bytes(),
                );
                frame_words += 1;
            }
            write_stack(&mut file, layout.stack_offset(id) as usize, &record);
        };
        put_stack(0, &[], &self.unknown_stack);
        for (id, (frames, record)) in (1u64..).zip(&self.stacks) {
            put_stack(id, frames, record);
        }
        for (index, module) in (0u64..).zip(&self.modules) {
            write_module(&mut file, layout.module_offset(index) as usize, module);
        }
        for (index, failure) in (0..layout.failure_capacity).zip(&self.failures) {
            write_failure(&mut file, layout.failure_offset(index) as usize, failure);
        }
        for (index, error) in (0..layout.error_capacity).zip(&self.errors) {
            write_error(&mut file, layout.error_offset(index) as usize, error);
        }
        for (index, code) in (0..layout.code_capacity).zip(&self.codes) {
            write_code(&mut file, layout.code_offset(index) as usize, code);
        }
        for (index, leak) in (0..layout.leak_capacity).zip(&self.leaks) {
            write_leak(&mut file, layout.leak_offset(index) as usize, leak);
        }
        put(&mut file, layout.blob_offset, &self.blob);
        header.leak_record_count = header.leak_record_count.max(self.leaks.len() as u64);
        header.code_count = header.code_count.max(self.codes.len() as u64);
        header.blob_used = self.blob.len() as u64;
        header.failure_count = header.failure_count.max(self.failures.len() as u64);
        header.error_count = header.error_count.max(self.errors.len() as u64);
        header.stack_count = 1 + self.stacks.len() as u64;
        header.frame_words_used = frame_words;
        header.module_count = self.modules.len() as u64;
        let argv: Vec<u8> = self
            .argv
            .iter()
            .flat_map(|a| a.bytes().chain([0]))
            .take(ARGV_CAPACITY)
            .collect();
        header.argv_len = argv.len() as u32;
        header.argv[..argv.len()].copy_from_slice(&argv);
        write_header(&mut file, &header);
        file
    }

    /// Builds the bytes and reads them back.
    pub fn build_profile(&self) -> Profile {
        match read_profile(&self.build()[..]) {
            Ok(profile) => profile,
            Err(e) => panic!("synthetic profile rejected: {e}"),
        }
    }
}
