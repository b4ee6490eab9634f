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

mod codes;
mod layout;
pub mod python;

pub use codes::*;
pub use layout::Layout;

/// First eight bytes of every profile file.
pub const MAGIC: [u8; 8] = *b"MWPROF\0\0";
/// Version of this layout; a reader rejects any other.
pub const FORMAT_VERSION: u32 = 5;
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
///
/// The first 64 bytes hold everything an allocation or a free of the stack touches (the
/// lock, the live and total figures, the peak its snapshot belongs to, the category the
/// NumPy handler sets), so that each event costs one cache line of the record; the frames'
/// place, the hash and the snapshot itself, written when a stack is made or first touched
/// after a new peak, are in the second. Until format version 5 the event's words spanned
/// both lines.
#[repr(C, align(128))]
#[derive(Clone, Copy)]
pub struct StackRecord {
    /// Spin lock word of the writer (preload only).
    pub lock: u32,
    /// The kind of memory: one of [`python::category`] (set when the stack is created).
    pub category: u32,
    /// Bytes live now.
    pub live_bytes: i64,
    /// Blocks live now.
    pub live_blocks: i64,
    /// The peak value `snap_*` belong to (see the crate docs).
    pub snap_peak: u64,
    /// Bytes ever allocated from this stack (requested sizes).
    pub allocated_bytes: u64,
    /// Allocations ever made from this stack.
    pub allocations: u64,
    /// Blocks from this stack that were freed (or shrunk away by realloc).
    pub frees: u64,
    /// Highest `live_bytes` this stack ever had.
    pub max_live_bytes: i64,
    /// Non-zero once `depth`, `hash` and the frames are written.
    pub published: u32,
    /// Number of frames.
    pub depth: u32,
    /// Unused, 0 in files written now: it held the next id of the writer's hash chain,
    /// which the writer now keeps in its own memory. Readers never used it.
    pub next: u32,
    /// Reserved, zero.
    pub reserved0: u32,
    /// Hash of the frames (preload only).
    pub hash: u64,
    /// Index of the first frame word; frames run innermost first, as return addresses.
    pub frames_start: u64,
    /// Bytes live when the process's peak numbered `snap_peak` was committed.
    pub snap_bytes: i64,
    /// Blocks live at that moment.
    pub snap_blocks: i64,
}

const _: () = assert!(core::mem::size_of::<Header>() as u64 <= HEADER_SIZE);
const _: () = assert!(core::mem::size_of::<StackRecord>() == 128);
const _: () = assert!(core::mem::offset_of!(StackRecord, max_live_bytes) == 56);
const _: () = assert!(core::mem::size_of::<ModuleRecord>() == 512);
const _: () = assert!(core::mem::size_of::<FailureRecord>() == 48);
const _: () = assert!(core::mem::size_of::<ErrorRecord>() == 48);
const _: () = assert!(core::mem::size_of::<LeakRecord>() == 32);
const _: () = assert!(core::mem::offset_of!(Header, heap) % 16 == 0);

/// Capacities the preload uses unless told otherwise.
pub mod defaults {
    /// Modules (executable, shared objects, vDSO).
    pub const MODULE_CAPACITY: u64 = 4096;
    /// Unique stacks. `import torch` alone makes about two million (native and merged),
    /// most of them from its C++ static initializers; the file is sparse, so room costs
    /// nothing until used.
    pub const STACK_CAPACITY: u64 = 1 << 22;
    /// Frame words (about 16 per stack on average; about 20 for `import torch`).
    pub const FRAME_CAPACITY: u64 = 1 << 26;
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
