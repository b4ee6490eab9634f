//! The store: the codes the profile file's fields hold (exit kinds, flags, heap-error and
//! leak kinds, guard modes, the failed function of an injected failure), with their names.

/// How a process ended, as far as the process itself could record it.
pub mod exit_kind {
    /// Still running, or killed before it could record anything (SIGKILL, crash).
    pub const UNKNOWN: u32 = 0;
    /// `exit_value` is the exit status given to `exit`/`_exit` or returned from `main`.
    pub const CODE: u32 = 1;
    /// `exit_value` is a signal number (`abort` records SIGABRT).
    pub const SIGNAL: u32 = 2;
}

/// Bits of [`crate::Header::flags`].
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

/// Why tracking stopped, in [`crate::Header::degraded_reason`].
pub mod degraded_reason {
    /// Tracking did not stop.
    pub const NONE: u32 = 0;
    /// The profile file could not be grown (disk full or quota).
    pub const FILE_GROW_FAILED: u32 = 1;
    /// The address map could not get memory for a new block.
    pub const ADDRESS_MAP_FULL: u32 = 2;
    /// A live-byte sum overflowed 64 bits (a corrupt size or a wild free).
    pub const COUNTER_OVERFLOW: u32 = 3;
    /// memwarden's own heap could not get memory (the address space was used up, as under
    /// a `ulimit -v` the program set itself).
    pub const OWN_MEMORY_EXHAUSTED: u32 = 4;
}

/// Codes of [`crate::ErrorRecord::kind`].
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

/// Codes of [`crate::LeakRecord::kind`], as Valgrind memcheck names them.
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

/// Codes of [`crate::Header::leak_status`].
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

/// Codes of [`crate::Header::leak_view`].
pub mod leak_view {
    /// Valgrind memcheck's: a block reached only through interior pointers is "possible".
    pub const MEMCHECK: u32 = 0;
    /// LeakSanitizer's: interior pointers count as pointers to the block.
    pub const LSAN: u32 = 1;
}

/// Codes of [`crate::Header::guard_mode`].
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

/// Codes of [`crate::FailureRecord::function`].
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
