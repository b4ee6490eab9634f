//! The store: byte layout of a per-process profile file (`*.mwp`), written in place by the
//! preload through a shared file mapping and read by the core after the run.
//!
//! Declared once here so that writer and reader cannot disagree. Everything is
//! little-endian, `#[repr(C)]`, at fixed offsets computed by [`Layout`].
//!
//! ```text
//! offset 0                 Header            (HEADER_SIZE bytes)
//! layout.modules_offset    ModuleRecord × module_capacity
//! layout.stacks_offset     StackRecord  × stack_capacity     (stack id = index)
//! layout.frames_offset     u64          × frame_capacity     (return addresses)
//! layout.failures_offset   FailureRecord × failure_capacity  (injected allocation failures)
//! layout.errors_offset     ErrorRecord   × error_capacity    (heap errors found by guards)
//! layout.codes_offset      CodeRecord    × code_capacity     (Python code objects seen in stacks)
//! layout.blob_offset       u8            × blob_capacity     (their names and line tables)
//! layout.leaks_offset      LeakRecord    × leak_capacity     (leak check at exit, `leak`)
//! ```
//!
//! A frame word is a native return address unless its top bits tag it: see [`python`].
//!
//! The file is mapped `MAP_SHARED`, so whatever the process has written survives its death
//! (SIGKILL, a crash): the kernel owns the pages. Its size grows with the number of unique
//! stacks and loaded modules, never with the number of allocations.
//!
//! ## The exact peak, in O(1) per event
//! The header holds the pair `heap = [live, peak]`, updated by one 128-bit compare-and-swap
//! per event. `peak` is only *committed* on a falling edge: a free that starts while
//! `live > peak` first sets `peak = live`. Since `peak` strictly increases at every commit
//! it doubles as an epoch: each stack remembers in `snap_peak` the peak value at which it
//! last copied its live figures into `snap_*`. When a stack is touched and `snap_peak`
//! differs from the current peak, its live figures (unchanged since the commit, because
//! the stack was not touched) are the figures at the peak, so they are copied first.
//! A reader therefore computes, for the final `(live, peak)`:
//! - if `live > peak`: the peak is now, and each stack's figures at the peak are its live ones;
//! - else, per stack: `snap_*` if `snap_peak == peak`, otherwise its live figures.
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod python;

/// First eight bytes of every profile file.
pub const MAGIC: [u8; 8] = *b"MWPROF\0\0";
/// Version of this layout; a reader rejects any other.
pub const FORMAT_VERSION: u32 = 4;
/// Bytes reserved for the [`Header`] at the start of the file.
pub const HEADER_SIZE: u64 = 8192;
/// Bytes of the command line kept in the header (NUL-separated arguments).
pub const ARGV_CAPACITY: usize = 4096;
/// Bytes of a module path kept in a [`ModuleRecord`].
pub const MODULE_PATH_CAPACITY: usize = 432;
/// Longest build id kept.
pub const BUILD_ID_CAPACITY: usize = 32;
/// Deepest stack the layout can hold (the preload's depth option is clamped to it).
pub const MAX_DEPTH_LIMIT: u32 = 256;
/// Stack id 0 is reserved: events whose stack could not be stored (table full, unwinding
/// impossible) are counted there, so totals stay exact even when stacks are not.
pub const UNKNOWN_STACK_ID: u32 = 0;
/// Name of the folder, inside the output folder, that holds the `*.mwp` files.
pub const RAW_DIR: &str = "raw";
/// Extension of a profile file.
pub const PROFILE_EXTENSION: &str = "mwp";

/// How a process ended, as far as the process itself could record it.
pub mod exit_kind {
    /// Still running, or killed before it could record anything (SIGKILL, crash).
    pub const UNKNOWN: u32 = 0;
    /// `exit_value` is the exit status given to `exit`/`_exit` or returned from `main`.
    pub const CODE: u32 = 1;
    /// `exit_value` is a signal number (`abort` records SIGABRT).
    pub const SIGNAL: u32 = 2;
}

/// Bits of [`Header::flags`].
pub mod flags {
    /// Tracking stopped early (see `degraded_reason`); figures cover the time before that.
    pub const DEGRADED: u64 = 1 << 0;
    /// The stack table or frame area filled up; later new stacks were counted under
    /// [`crate::UNKNOWN_STACK_ID`].
    pub const STACKS_FULL: u64 = 1 << 1;
    /// The process was created by `fork` and started with its parent's live heap.
    pub const FORKED: u64 = 1 << 2;
    /// The main program defines its own `malloc`, so calls to it bypass memwarden.
    pub const OWN_MALLOC: u64 = 1 << 3;
    /// The command line was longer than [`crate::ARGV_CAPACITY`] and was cut.
    pub const ARGV_TRUNCATED: u64 = 1 << 4;
    /// The module table filled up; frames in later modules cannot be symbolized.
    pub const MODULES_FULL: u64 = 1 << 5;
}

/// Why tracking stopped, in [`Header::degraded_reason`].
pub mod degraded_reason {
    /// Tracking did not stop.
    pub const NONE: u32 = 0;
    /// The profile file could not be grown (disk full or quota).
    pub const FILE_GROW_FAILED: u32 = 1;
    /// The address map could not get memory for a new block.
    pub const ADDRESS_MAP_FULL: u32 = 2;
    /// A live-byte sum overflowed 64 bits (a corrupt size or a wild free).
    pub const COUNTER_OVERFLOW: u32 = 3;
}

/// Where each region starts and how many records it holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Byte offset of the first [`ModuleRecord`].
    pub modules_offset: u64,
    /// Number of module records the file has room for.
    pub module_capacity: u64,
    /// Byte offset of the first [`StackRecord`].
    pub stacks_offset: u64,
    /// Number of stack records the file has room for (ids `0..stack_capacity`).
    pub stack_capacity: u64,
    /// Byte offset of the frame area.
    pub frames_offset: u64,
    /// Number of `u64` frame words the file has room for.
    pub frame_capacity: u64,
    /// Byte offset of the first [`FailureRecord`].
    pub failures_offset: u64,
    /// Number of failure records the file has room for.
    pub failure_capacity: u64,
    /// Byte offset of the first [`ErrorRecord`].
    pub errors_offset: u64,
    /// Number of error records the file has room for.
    pub error_capacity: u64,
    /// Byte offset of the first [`python::CodeRecord`].
    pub codes_offset: u64,
    /// Number of code records the file has room for.
    pub code_capacity: u64,
    /// Byte offset of the blob area (bytes that code records point into).
    pub blob_offset: u64,
    /// Bytes the blob area has room for.
    pub blob_capacity: u64,
    /// Total size of the file when every region is full.
    pub file_size: u64,
    /// Byte offset of the first [`LeakRecord`] (see [`Layout::with_leak_capacity`]).
    pub leaks_offset: u64,
    /// Number of leak records the file has room for.
    pub leak_capacity: u64,
}

const PAGE: u64 = 4096;

const fn round_up_to_page(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

impl Layout {
    /// The layout for the given capacities; `None` if the file size would overflow.
    pub const fn new(
        module_capacity: u64,
        stack_capacity: u64,
        frame_capacity: u64,
        failure_capacity: u64,
        error_capacity: u64,
        code_capacity: u64,
        blob_capacity: u64,
    ) -> Option<Self> {
        let modules_offset = HEADER_SIZE;
        let Some(modules_bytes) =
            module_capacity.checked_mul(core::mem::size_of::<ModuleRecord>() as u64)
        else {
            return None;
        };
        let Some(stacks_offset) = modules_offset.checked_add(modules_bytes) else {
            return None;
        };
        let stacks_offset = round_up_to_page(stacks_offset);
        let Some(stacks_bytes) =
            stack_capacity.checked_mul(core::mem::size_of::<StackRecord>() as u64)
        else {
            return None;
        };
        let Some(frames_offset) = stacks_offset.checked_add(stacks_bytes) else {
            return None;
        };
        let frames_offset = round_up_to_page(frames_offset);
        let Some(frames_bytes) = frame_capacity.checked_mul(8) else {
            return None;
        };
        let Some(failures_offset) = frames_offset.checked_add(frames_bytes) else {
            return None;
        };
        let failures_offset = round_up_to_page(failures_offset);
        let Some(failures_bytes) =
            failure_capacity.checked_mul(core::mem::size_of::<FailureRecord>() as u64)
        else {
            return None;
        };
        let Some(errors_offset) = failures_offset.checked_add(failures_bytes) else {
            return None;
        };
        let errors_offset = round_up_to_page(errors_offset);
        let Some(errors_bytes) =
            error_capacity.checked_mul(core::mem::size_of::<ErrorRecord>() as u64)
        else {
            return None;
        };
        let Some(codes_offset) = errors_offset.checked_add(errors_bytes) else {
            return None;
        };
        let codes_offset = round_up_to_page(codes_offset);
        let Some(codes_bytes) =
            code_capacity.checked_mul(core::mem::size_of::<python::CodeRecord>() as u64)
        else {
            return None;
        };
        let Some(blob_offset) = codes_offset.checked_add(codes_bytes) else {
            return None;
        };
        let blob_offset = round_up_to_page(blob_offset);
        let Some(file_size) = blob_offset.checked_add(blob_capacity) else {
            return None;
        };
        Some(Layout {
            modules_offset,
            module_capacity,
            stacks_offset,
            stack_capacity,
            frames_offset,
            frame_capacity,
            failures_offset,
            failure_capacity,
            errors_offset,
            error_capacity,
            codes_offset,
            code_capacity,
            blob_offset,
            blob_capacity,
            file_size: round_up_to_page(file_size),
            leaks_offset: round_up_to_page(file_size),
            leak_capacity: 0,
        })
    }

    /// This layout with a leak region of `capacity` records appended at the end of the file;
    /// `None` if the file size would overflow.
    pub const fn with_leak_capacity(self, capacity: u64) -> Option<Self> {
        let leaks_offset = self.leaks_offset;
        let Some(bytes) = capacity.checked_mul(core::mem::size_of::<LeakRecord>() as u64) else {
            return None;
        };
        let Some(end) = leaks_offset.checked_add(bytes) else {
            return None;
        };
        if end > u64::MAX - PAGE {
            return None;
        }
        Some(Layout {
            leak_capacity: capacity,
            file_size: round_up_to_page(end),
            ..self
        })
    }

    /// Byte offset of leak record `index`.
    pub const fn leak_offset(&self, index: u64) -> u64 {
        self.leaks_offset + index * core::mem::size_of::<LeakRecord>() as u64
    }

    /// Byte offset of error record `index`.
    pub const fn error_offset(&self, index: u64) -> u64 {
        self.errors_offset + index * core::mem::size_of::<ErrorRecord>() as u64
    }

    /// Byte offset of code record `index`.
    pub const fn code_offset(&self, index: u64) -> u64 {
        self.codes_offset + index * core::mem::size_of::<python::CodeRecord>() as u64
    }

    /// Byte offset of failure record `index`.
    pub const fn failure_offset(&self, index: u64) -> u64 {
        self.failures_offset + index * core::mem::size_of::<FailureRecord>() as u64
    }

    /// Byte offset of stack record `id`.
    pub const fn stack_offset(&self, id: u64) -> u64 {
        self.stacks_offset + id * core::mem::size_of::<StackRecord>() as u64
    }

    /// Byte offset of module record `index`.
    pub const fn module_offset(&self, index: u64) -> u64 {
        self.modules_offset + index * core::mem::size_of::<ModuleRecord>() as u64
    }

    /// Byte offset of frame word `index`.
    pub const fn frame_offset(&self, index: u64) -> u64 {
        self.frames_offset + index * 8
    }
}

/// The first [`HEADER_SIZE`] bytes of a profile file.
///
/// Fields marked *live* change while the process runs; the preload accesses them
/// atomically, a reader after the run reads them plainly.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`FORMAT_VERSION`].
    pub version: u32,
    /// `size_of::<Header>()` as written, a check against a mismatched reader.
    pub header_size: u32,
    /// Process id.
    pub pid: u32,
    /// Parent process id when tracking started.
    pub ppid: u32,
    /// Deepest stack recorded, in frames.
    pub max_depth: u32,
    /// One of [`exit_kind`] (*live*).
    pub exit_kind: u32,
    /// Exit code or signal number, as `exit_kind` says (*live*).
    pub exit_value: i32,
    /// One of [`degraded_reason`] (*live*).
    pub degraded_reason: u32,
    /// Wall-clock time tracking started, ns since the Unix epoch.
    pub start_realtime_ns: u64,
    /// `CLOCK_MONOTONIC` time tracking started, ns.
    pub start_monotonic_ns: u64,
    /// Where the regions are.
    pub layout: Layout,
    /// `[live bytes, peak bytes]`, one 16-byte-aligned atomic pair (*live*); see the crate docs.
    pub heap: [u64; 2],
    /// `[live blocks, blocks at the peak]`: informational, the per-stack figures are exact.
    pub blocks: [u64; 2],
    /// ns after start when the committed peak was reached (*live*).
    pub peak_time_ns: u64,
    /// ns after start of the latest allocation that raised `live` above `peak` (*live*).
    pub rise_time_ns: u64,
    /// ns after start when the process ended, 0 if it did not record its end (*live*).
    pub end_time_ns: u64,
    /// Stack records in use, including the reserved id 0 (*live*).
    pub stack_count: u64,
    /// Frame words in use (*live*).
    pub frame_words_used: u64,
    /// Module records in use (*live*).
    pub module_count: u64,
    /// Bits of [`flags`] (*live*).
    pub flags: u64,
    /// Allocations made while tracking was off for this process (degraded) (*live*).
    pub untracked_allocations: u64,
    /// Bytes of `argv` in use.
    pub argv_len: u32,
    /// Reserved, zero.
    pub reserved0: u32,
    /// Times a writer found a stack record or address-map shard locked and had to wait
    /// (*live*): the contention figure of the locking strategy.
    pub lock_waits: u64,
    /// Times the 128-bit `heap` compare-and-swap lost a race and retried (*live*).
    pub heap_cas_retries: u64,
    /// Allocation failures injected by `--fail` rules; records beyond `failure_capacity`
    /// are counted here but not stored (*live*).
    pub failure_count: u64,
    /// The fatal signal the process received, 0 if none was caught (*live*). Set only when
    /// fault injection is on (the preload then catches SIGSEGV, SIGBUS, SIGFPE, SIGILL and
    /// SIGABRT to record where the program crashed, and re-raises).
    pub crash_signal: u32,
    /// Frames in `crash_frames`.
    pub crash_depth: u32,
    /// Heap errors found by guards; records beyond `error_capacity` are counted here but not
    /// stored (*live*).
    pub error_count: u64,
    /// The guard mode in force: one of [`guard_mode`].
    pub guard_mode: u32,
    /// Reserved, zero.
    pub reserved1: u32,
    /// Where the crash happened, innermost first. Frame 0 is the faulting instruction's
    /// address (not a return address: symbolize it as is); the others are return addresses.
    pub crash_frames: [u64; CRASH_DEPTH],
    /// Python code records written (*live*).
    pub code_count: u64,
    /// Bytes of the blob area used (*live*).
    pub blob_used: u64,
    /// The Python runtime found in the process, as `PY_VERSION_HEX` (0x030b07f0 for
    /// 3.11.7); 0 if none. Python frames are only captured when this is non-zero.
    pub python_version: u32,
    /// Reserved, zero.
    pub reserved2: u32,
    /// The leak check's outcome: one of [`leak_status`] (*live*, written at exit).
    pub leak_status: u32,
    /// The reachability view the leak check classified with: one of [`leak_view`].
    pub leak_view: u32,
    /// Leak records (one per stack and kind); beyond `leak_capacity` counted, not stored.
    pub leak_record_count: u64,
    /// Bytes of memory the leak check read (roots and heap blocks).
    pub leak_scanned_bytes: u64,
    /// ns the leak check took, threads stopped to threads resumed.
    pub leak_scan_ns: u64,
    /// Threads the leak check stopped (besides the exiting one).
    pub leak_threads_stopped: u32,
    /// Threads that did not answer the stop signal in time (their stacks were scanned
    /// whole, their registers not at all).
    pub leak_threads_missed: u32,
    /// Reserved for later format additions, zero.
    pub reserved: [u64; 22],
    /// The command line, arguments separated by NUL.
    pub argv: [u8; ARGV_CAPACITY],
}

/// A module (executable or shared object) mapped in the process, for symbolization.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleRecord {
    /// Non-zero once every other field is written.
    pub published: u32,
    /// Bytes of `path` in use.
    pub path_len: u32,
    /// Load bias: runtime address minus the address stated in the ELF file.
    pub base: u64,
    /// Lowest runtime address of its loaded segments.
    pub start: u64,
    /// One past the highest runtime address of its loaded segments.
    pub end: u64,
    /// `CLOCK_MONOTONIC` ns after start when it was seen loaded.
    pub loaded_ns: u64,
    /// Bytes of `build_id` in use.
    pub build_id_len: u32,
    /// Bits: 1 = the main executable, 2 = the vDSO, 4 = path was cut.
    pub module_flags: u32,
    /// GNU build id, if the module has one.
    pub build_id: [u8; BUILD_ID_CAPACITY],
    /// Path of the file mapped (absolute where the loader knew it).
    pub path: [u8; MODULE_PATH_CAPACITY],
}

/// Frames kept for the crash stack.
pub const CRASH_DEPTH: usize = 64;

/// One allocation that a `--fail` rule made fail.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailureRecord {
    /// 1 for the process's first injected failure, 2 for the second…
    pub seq: u64,
    /// The call's number among the calls the rule matched (1-based).
    pub call: u64,
    /// Requested size in bytes (for mmap: the length).
    pub size: u64,
    /// ns after start when the call failed.
    pub time_ns: u64,
    /// The calling stack's id (see [`StackRecord`]); [`UNKNOWN_STACK_ID`] if not stored.
    pub stack: u32,
    /// Which function failed: one of [`failed_function`].
    pub function: u32,
    /// Index of the `--fail` rule that fired (0-based, in command-line order).
    pub rule: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// One heap error found by a guard, reported once.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorRecord {
    /// One of [`error_kind`].
    pub kind: u32,
    /// The stack of the access or call that found the error (the bad free, the faulting
    /// access, the allocation call with a bad argument); [`UNKNOWN_STACK_ID`] if unknown.
    pub stack: u32,
    /// The address involved (the pointer freed, the faulting address).
    pub address: u64,
    /// Requested size of the block involved, 0 if no block is known.
    pub block_size: u64,
    /// Offset of `address` from the block's first byte (negative: before it; ≥ block_size:
    /// after its end), or for a size mismatch the size the deallocation claimed; for a bad
    /// alignment argument, the alignment.
    pub offset: i64,
    /// The block's allocation stack, [`UNKNOWN_STACK_ID`] if unknown.
    pub alloc_stack: u32,
    /// The block's free stack (use after free, double free), [`UNKNOWN_STACK_ID`] if none.
    pub free_stack: u32,
    /// ns after start when it was found.
    pub time_ns: u64,
}

/// Codes of [`ErrorRecord::kind`].
pub mod error_kind {
    /// Bytes after the end of a block were written.
    pub const HEAP_BUFFER_OVERFLOW: u32 = 1;
    /// Bytes before a block (its header or front redzone) were written.
    pub const HEAP_BUFFER_UNDERFLOW: u32 = 2;
    /// A block was freed twice.
    pub const DOUBLE_FREE: u32 = 3;
    /// A pointer memwarden never returned (or the inside of a block) was freed.
    pub const INVALID_FREE: u32 = 4;
    /// Allocation and deallocation functions do not match (`new[]` freed with `free`…).
    pub const ALLOC_DEALLOC_MISMATCH: u32 = 5;
    /// A sized deallocation named another size than the block's.
    pub const SIZE_MISMATCH: u32 = 6;
    /// A freed block was accessed (page mode: faulting access; header mode: its free
    /// pattern was overwritten while it waited in quarantine).
    pub const USE_AFTER_FREE: u32 = 7;
    /// An alignment argument glibc refuses (posix_memalign, aligned_alloc, memalign).
    pub const INVALID_ALIGNMENT: u32 = 8;

    /// The name shown in reports, as sanitizers spell them.
    pub const fn name(code: u32) -> &'static str {
        match code {
            HEAP_BUFFER_OVERFLOW => "heap-buffer-overflow",
            HEAP_BUFFER_UNDERFLOW => "heap-buffer-underflow",
            DOUBLE_FREE => "double-free",
            INVALID_FREE => "invalid-free",
            ALLOC_DEALLOC_MISMATCH => "alloc-dealloc-mismatch",
            SIZE_MISMATCH => "size-mismatch",
            USE_AFTER_FREE => "heap-use-after-free",
            INVALID_ALIGNMENT => "invalid-alignment",
            _ => "unknown",
        }
    }
}

/// The figures of one (allocation stack, leak kind) pair found by the leak check.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeakRecord {
    /// The blocks' allocation stack (see [`StackRecord`]).
    pub stack: u32,
    /// One of [`leak_kind`].
    pub kind: u32,
    /// Blocks of this stack in this kind.
    pub blocks: u64,
    /// Their requested bytes.
    pub bytes: u64,
    /// Reserved, zero.
    pub reserved: u64,
}

/// Codes of [`LeakRecord::kind`], as Valgrind memcheck names them.
pub mod leak_kind {
    /// Nothing points to the block.
    pub const DEFINITE: u32 = 1;
    /// Pointed to only from lost blocks.
    pub const INDIRECT: u32 = 2;
    /// Reached only through pointers into its inside.
    pub const POSSIBLE: u32 = 3;
    /// A chain of pointers to block starts leads to it from a root.
    pub const REACHABLE: u32 = 4;

    /// The name used in reports and options.
    pub const fn name(code: u32) -> &'static str {
        match code {
            DEFINITE => "definite",
            INDIRECT => "indirect",
            POSSIBLE => "possible",
            REACHABLE => "reachable",
            _ => "unknown",
        }
    }
}

/// Codes of [`Header::leak_status`].
pub mod leak_status {
    /// No leak check was asked for.
    pub const NOT_RUN: u32 = 0;
    /// The check ran at exit; the leak records hold its result.
    pub const DONE: u32 = 1;
    /// The check was asked for but could not run (no scratch memory, a guard mode, a
    /// `vfork` child); nothing is known about leaks.
    pub const SKIPPED: u32 = 2;
    /// The check was asked for and is due at exit; a process that ended without it (`_exit`,
    /// a signal) or still runs keeps this status.
    pub const PENDING: u32 = 3;
}

/// Codes of [`Header::leak_view`].
pub mod leak_view {
    /// Valgrind memcheck's: a block reached only through interior pointers is "possible".
    pub const MEMCHECK: u32 = 0;
    /// LeakSanitizer's: interior pointers count as pointers to the block.
    pub const LSAN: u32 = 1;
}

/// Codes of [`Header::guard_mode`].
pub mod guard_mode {
    /// No guard: plain profiling.
    pub const NONE: u32 = 0;
    /// Headers and canary redzones, checked at free and at exit.
    pub const HEADER: u32 = 1;
    /// Every block against an inaccessible page; freed blocks kept inaccessible.
    pub const PAGE: u32 = 2;
    /// One block in N in a guarded slot of a bounded pool.
    pub const SAMPLED: u32 = 3;
}

/// Codes of [`FailureRecord::function`].
pub mod failed_function {
    /// `malloc`.
    pub const MALLOC: u32 = 1;
    /// `calloc`.
    pub const CALLOC: u32 = 2;
    /// `realloc`.
    pub const REALLOC: u32 = 3;
    /// `reallocarray`.
    pub const REALLOCARRAY: u32 = 4;
    /// `posix_memalign`.
    pub const POSIX_MEMALIGN: u32 = 5;
    /// `aligned_alloc`.
    pub const ALIGNED_ALLOC: u32 = 6;
    /// `memalign`.
    pub const MEMALIGN: u32 = 7;
    /// `valloc`.
    pub const VALLOC: u32 = 8;
    /// `pvalloc`.
    pub const PVALLOC: u32 = 9;
    /// C++ `operator new` (any form but array).
    pub const OPERATOR_NEW: u32 = 10;
    /// C++ `operator new[]`.
    pub const OPERATOR_NEW_ARRAY: u32 = 11;
    /// Anonymous `mmap`.
    pub const MMAP: u32 = 12;

    /// The name shown in reports.
    pub const fn name(code: u32) -> &'static str {
        match code {
            MALLOC => "malloc",
            CALLOC => "calloc",
            REALLOC => "realloc",
            REALLOCARRAY => "reallocarray",
            POSIX_MEMALIGN => "posix_memalign",
            ALIGNED_ALLOC => "aligned_alloc",
            MEMALIGN => "memalign",
            VALLOC => "valloc",
            PVALLOC => "pvalloc",
            OPERATOR_NEW => "operator new",
            OPERATOR_NEW_ARRAY => "operator new[]",
            MMAP => "mmap",
            _ => "unknown",
        }
    }
}

/// Module flag: the main executable.
pub const MODULE_MAIN: u32 = 1;
/// Module flag: the kernel's vDSO (no file on disk).
pub const MODULE_VDSO: u32 = 2;
/// Module flag: the path did not fit and was cut.
pub const MODULE_PATH_TRUNCATED: u32 = 4;

/// One unique call stack and its accounting. Its index in the stack region is its id.
///
/// Byte and block counts are signed so that a free of a block that a forked child
/// inherited mid-update cannot wrap; a reader clamps them at zero.
#[repr(C, align(128))]
#[derive(Clone, Copy)]
pub struct StackRecord {
    /// Spin lock word of the writer (preload only).
    pub lock: u32,
    /// Non-zero once `depth`, `hash` and the frames are written.
    pub published: u32,
    /// Number of frames.
    pub depth: u32,
    /// Next id in the writer's hash chain (preload only).
    pub next: u32,
    /// Hash of the frames (preload only).
    pub hash: u64,
    /// Index of the first frame word; frames run innermost first, as return addresses.
    pub frames_start: u64,
    /// Bytes live now.
    pub live_bytes: i64,
    /// Blocks live now.
    pub live_blocks: i64,
    /// Bytes live when the process's peak numbered `snap_peak` was committed.
    pub snap_bytes: i64,
    /// Blocks live at that moment.
    pub snap_blocks: i64,
    /// The peak value `snap_*` belong to (see the crate docs).
    pub snap_peak: u64,
    /// Highest `live_bytes` this stack ever had.
    pub max_live_bytes: i64,
    /// Bytes ever allocated from this stack (requested sizes).
    pub allocated_bytes: u64,
    /// Allocations ever made from this stack.
    pub allocations: u64,
    /// Blocks from this stack that were freed (or shrunk away by realloc).
    pub frees: u64,
    /// The kind of memory: one of [`python::category`] (set when the stack is created).
    pub category: u32,
    /// Reserved, zero.
    pub reserved0: u32,
}

const _: () = assert!(core::mem::size_of::<Header>() as u64 <= HEADER_SIZE);
const _: () = assert!(core::mem::size_of::<StackRecord>() == 128);
const _: () = assert!(core::mem::size_of::<ModuleRecord>() == 512);
const _: () = assert!(core::mem::size_of::<FailureRecord>() == 48);
const _: () = assert!(core::mem::size_of::<ErrorRecord>() == 48);
const _: () = assert!(core::mem::size_of::<LeakRecord>() == 32);
const _: () = assert!(core::mem::offset_of!(Header, heap) % 16 == 0);

/// Capacities the preload uses unless told otherwise.
pub mod defaults {
    /// Modules (executable, shared objects, vDSO).
    pub const MODULE_CAPACITY: u64 = 4096;
    /// Unique stacks.
    pub const STACK_CAPACITY: u64 = 1 << 20;
    /// Frame words (about 16 per stack on average).
    pub const FRAME_CAPACITY: u64 = 1 << 24;
    /// Frames per stack.
    pub const MAX_DEPTH: u32 = 64;
    /// Injected failures stored (more are counted).
    pub const FAILURE_CAPACITY: u64 = 4096;
    /// Heap errors stored (more are counted).
    pub const ERROR_CAPACITY: u64 = 4096;
    /// Python code objects recorded.
    pub const CODE_CAPACITY: u64 = 1 << 20;
    /// Bytes for their names and line tables.
    pub const BLOB_CAPACITY: u64 = 1 << 28;
    /// Leak records (stack, kind) stored (more are counted).
    pub const LEAK_CAPACITY: u64 = 1 << 16;
}

/// The figures of one stack at the process's peak, by the rule in the crate docs.
///
/// Returns `(bytes, blocks)`, clamped at zero.
pub fn at_peak(stack: &StackRecord, live: u64, peak: u64) -> (u64, u64) {
    let (bytes, blocks) = if live > peak || stack.snap_peak != peak {
        (stack.live_bytes, stack.live_blocks)
    } else {
        (stack.snap_bytes, stack.snap_blocks)
    };
    (bytes.max(0) as u64, blocks.max(0) as u64)
}

/// The process's peak live bytes, by the rule in the crate docs.
pub fn peak_bytes(live: u64, peak: u64) -> u64 {
    live.max(peak)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_is_page_aligned_and_ordered() {
        let l = Layout::new(
            defaults::MODULE_CAPACITY,
            defaults::STACK_CAPACITY,
            defaults::FRAME_CAPACITY,
            defaults::FAILURE_CAPACITY,
            defaults::ERROR_CAPACITY,
            defaults::CODE_CAPACITY,
            defaults::BLOB_CAPACITY,
        )
        .unwrap();
        assert_eq!(l.modules_offset, HEADER_SIZE);
        assert!(l.stacks_offset >= l.modules_offset + l.module_capacity * 512);
        assert_eq!(l.stacks_offset % 4096, 0);
        assert_eq!(l.frames_offset % 4096, 0);
        assert!(l.failures_offset >= l.frames_offset + l.frame_capacity * 8);
        assert!(l.errors_offset >= l.failures_offset + l.failure_capacity * 48);
        assert!(l.codes_offset >= l.errors_offset + l.error_capacity * 48);
        assert!(l.blob_offset >= l.codes_offset + l.code_capacity * 64);
        assert!(l.file_size >= l.blob_offset + l.blob_capacity);
    }

    #[test]
    fn layout_overflow_is_refused() {
        assert!(Layout::new(u64::MAX, 1, 1, 1, 1, 1, 1).is_none());
        assert!(Layout::new(1, u64::MAX / 2, 1, 1, 1, 1, 1).is_none());
        assert!(Layout::new(1, 1, 1, u64::MAX / 2, 1, 1, 1).is_none());
        assert!(Layout::new(1, 1, 1, 1, u64::MAX / 2, 1, 1).is_none());
        assert!(Layout::new(1, 1, 1, 1, 1, u64::MAX / 2, 1).is_none());
        assert!(Layout::new(1, 1, 1, 1, 1, 1, u64::MAX).is_none());
        let l = Layout::new(1, 1, 1, 1, 1, 1, 1).unwrap();
        assert!(l.with_leak_capacity(u64::MAX / 2).is_none());
    }

    #[test]
    fn the_leak_region_comes_last() {
        let l = Layout::new(1, 1, 1, 1, 1, 1, 1).unwrap();
        let with = l.with_leak_capacity(100).unwrap();
        assert_eq!(with.leaks_offset, l.file_size);
        assert_eq!(with.leak_offset(1), l.file_size + 32);
        assert!(with.file_size >= with.leak_offset(100));
        assert_eq!(with.leaks_offset % 4096, 0);
        assert_eq!(l.leak_capacity, 0);
    }
}
