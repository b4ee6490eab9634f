//! Interposed call (NumPy): memwarden's data-memory handler (NEP 49). NumPy allocates every
//! array's data through the handler in force when the array is made; memwarden's handler
//! sends each call through the same bodies as the C functions, with the stack marked as
//! NumPy array data, and checks the size NumPy gives back at free against the block's.
//!
//! `memwarden run` installs it when NumPy is imported (its `sitecustomize` calls
//! `memwarden_numpy_handler` and `PyDataMem_SetHandler`, then `memwarden_numpy_adopt` so
//! that contexts that never set a handler — every new thread — allocate through memwarden's
//! functions too, under NumPy's default handler's own name). The handler is a static: NumPy
//! keeps a reference to it in every array, so it must never go away.

use core::ffi::{c_int, c_void};

use memwarden_abi::python::NUMPY_DATA;
use memwarden_abi::{error_kind, failed_function};

use crate::block_header;
use crate::block_header::Tracked;
use crate::export_with_caller;
use crate::guard::{self, Family};
use crate::heap_errors::{self, HeapError};
use crate::hooks::{allocate, reallocate, release, release_unguarded, Source};
use crate::hooks_exports::{array_size, caller};
use crate::lifecycle;
use crate::page_guard;
use crate::real;
use crate::thread_state::Guard;
use crate::unwind::Caller;

/// The handler's functions, as the naked entry stubs are typed (their real C signatures
/// are NumPy's: see each stub).
type HandlerFn = unsafe extern "C" fn();

/// NumPy's `PyDataMemAllocator`: the four functions take the context first.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DataMemAllocator {
    context: *mut c_void,
    malloc: HandlerFn,
    calloc: HandlerFn,
    realloc: HandlerFn,
    free: HandlerFn,
}

/// NumPy's `PyDataMem_Handler`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DataMemHandler {
    name: [u8; 127],
    version: u8,
    allocator: DataMemAllocator,
}

/// The version of `PyDataMem_Handler` this layout is.
const HANDLER_VERSION: u8 = 1;

const fn handler_name() -> [u8; 127] {
    let mut name = [0u8; 127];
    let text = b"memwarden";
    let mut i = 0;
    while i < text.len() {
        name[i] = text[i];
        i += 1;
    }
    name
}

struct SharedHandler(DataMemHandler);
// SAFETY: never written after start-up; NumPy only reads it (the pointers are code).
unsafe impl Sync for SharedHandler {}

static HANDLER: SharedHandler = SharedHandler(DataMemHandler {
    name: handler_name(),
    version: HANDLER_VERSION,
    allocator: DataMemAllocator {
        context: core::ptr::null_mut(),
        malloc: memwarden_numpy_malloc,
        calloc: memwarden_numpy_calloc,
        realloc: memwarden_numpy_realloc,
        free: memwarden_numpy_free,
    },
});

/// The address of memwarden's `PyDataMem_Handler`, to wrap in a `mem_handler` capsule.
#[no_mangle]
pub extern "C" fn memwarden_numpy_handler() -> *mut c_void {
    core::ptr::addr_of!(HANDLER.0).cast_mut().cast()
}

/// Makes NumPy's default handler (the one a context without a handler uses) allocate
/// through memwarden: copies memwarden's functions into it. Its name stays NumPy's
/// (`default_allocator`): NumPy promises that name to a new thread and after
/// `PyDataMem_SetHandler(NULL)`, and its own tests (`test_mem_policy.py`) check it, so a
/// program sees the default handler it would see bare while memwarden sees its arrays.
/// 0 on success, -1 if `default_handler` is null or not a version-1 handler.
///
/// # Safety
/// `default_handler` is the pointer inside NumPy's default `mem_handler` capsule (a
/// writable static of NumPy's), and no array is being allocated through it meanwhile.
#[no_mangle]
pub unsafe extern "C" fn memwarden_numpy_adopt(default_handler: *mut c_void) -> c_int {
    let target = default_handler.cast::<DataMemHandler>();
    // SAFETY: the caller passes NumPy's handler struct (or null, refused here).
    if target.is_null() || unsafe { (*target).version } != HANDLER_VERSION {
        return -1;
    }
    // SAFETY: as above; the struct is NumPy's writable static, its functions written as one
    // field.
    unsafe {
        (*target).allocator = HANDLER.0.allocator;
    }
    0
}

/// The caller as an entry stub saw it, marked as NumPy array data.
fn numpy_caller(entry_sp: u64, bp: u64) -> Caller {
    Caller {
        marker: NUMPY_DATA,
        ..caller(entry_sp, bp)
    }
}

export_with_caller!(
    /// # Safety
    /// NumPy's handler `malloc(ctx, size)`.
    memwarden_numpy_malloc => numpy_malloc_body, entry_sp: "rdx", bp: "rcx"
);
extern "C" fn numpy_malloc_body(
    _context: *mut c_void,
    size: usize,
    entry_sp: u64,
    bp: u64,
) -> *mut c_void {
    let block = allocate(
        numpy_caller(entry_sp, bp),
        failed_function::MALLOC,
        Source::Malloc,
        size,
    );
    ask_for_huge_pages(block, size);
    block
}

export_with_caller!(
    /// # Safety
    /// NumPy's handler `calloc(ctx, count, size)`.
    memwarden_numpy_calloc => numpy_calloc_body, entry_sp: "rcx", bp: "r8"
);
extern "C" fn numpy_calloc_body(
    _context: *mut c_void,
    count: usize,
    size: usize,
    entry_sp: u64,
    bp: u64,
) -> *mut c_void {
    let Some(total) = array_size(count, size) else {
        return core::ptr::null_mut();
    };
    let block = allocate(
        numpy_caller(entry_sp, bp),
        failed_function::CALLOC,
        Source::Calloc,
        total,
    );
    ask_for_huge_pages(block, total);
    block
}

/// Arrays of this size and more get transparent huge pages, as NumPy's own handler asks.
const HUGE_PAGE_THRESHOLD: usize = 1 << 22;

/// Does what NumPy's default handler does for big arrays (fewer page faults and TLB
/// misses), so that profiling does not change how the program's memory behaves.
fn ask_for_huge_pages(block: *mut c_void, size: usize) {
    if block.is_null() || size < HUGE_PAGE_THRESHOLD {
        return;
    }
    let page = crate::hooks::page_size();
    let start = (block as usize).next_multiple_of(page);
    let length = size - (start - block as usize);
    let errno = real::SavedErrno::save();
    // SAFETY: the range lies inside the block just allocated; madvise only advises (its
    // failure on kernels without huge pages is ignored, as NumPy ignores it).
    unsafe { libc::madvise(start as *mut c_void, length, libc::MADV_HUGEPAGE) };
    errno.restore();
}

export_with_caller!(
    /// # Safety
    /// NumPy's handler `realloc(ctx, ptr, size)`.
    memwarden_numpy_realloc => numpy_realloc_body, entry_sp: "rcx", bp: "r8"
);
extern "C" fn numpy_realloc_body(
    _context: *mut c_void,
    block: *mut c_void,
    size: usize,
    entry_sp: u64,
    bp: u64,
) -> *mut c_void {
    reallocate(
        numpy_caller(entry_sp, bp),
        failed_function::REALLOC,
        block,
        size,
    )
}

export_with_caller!(
    /// # Safety
    /// NumPy's handler `free(ctx, ptr, size)`: `size` is what NumPy believes the block holds.
    memwarden_numpy_free => numpy_free_body, entry_sp: "rcx", bp: "r8"
);
extern "C" fn numpy_free_body(
    _context: *mut c_void,
    block: *mut c_void,
    size: usize,
    entry_sp: u64,
    bp: u64,
) {
    if block.is_null() {
        return;
    }
    let errno = real::SavedErrno::save();
    let caller = caller(entry_sp, bp);
    // A block the page guard claims (live, freed, or anywhere in its range) has no header
    // to read.
    let kept_by_guard = guard::header_guard().is_some()
        || page_guard::page_guard().is_some_and(|g| g.claims(block));
    if kept_by_guard {
        // A guard checks the size of a block it keeps itself.
        release(caller, block, Family::Malloc, Some(size as u64));
    } else {
        // SAFETY: `block` came from this handler (NumPy's contract), i.e. from the malloc
        // family, and no guard keeps it: the 16 bytes before it are readable.
        let tracked = unsafe { block_header::read(block) };
        check_size(caller, block, tracked.as_ref(), size as u64);
        // The header, read once, serves the release too.
        release_unguarded(block, tracked);
    }
    errno.restore();
}

/// Compares the size NumPy gives back (`claimed`) with the tracked block's.
#[inline(always)]
fn check_size(caller: Caller, block: *mut c_void, tracked: Option<&Tracked>, claimed: u64) {
    if let Some(tracked) = tracked.filter(|tracked| tracked.size != claimed) {
        report_size_mismatch(caller, block, tracked, claimed);
    }
}

/// Without a guard: reports that NumPy gave back a size (`claimed`) other than the
/// block's, with both stacks.
#[cold]
fn report_size_mismatch(caller: Caller, block: *mut c_void, tracked: &Tracked, claimed: u64) {
    let (Some(recorder), Some(guard)) = (lifecycle::active(), Guard::enter()) else {
        return;
    };
    let free_stack = recorder.stack_of(&guard, caller);
    heap_errors::report(
        recorder,
        &HeapError {
            kind: error_kind::SIZE_MISMATCH,
            address: block as u64,
            block_size: tracked.size,
            offset: claimed as i64,
            stack: free_stack,
            alloc_stack: tracked.stack,
            free_stack,
        },
    );
}
