//! Interposed calls: the exported malloc family. Each allocating export is a naked entry
//! stub that captures its caller's registers (so stacks start at the program's own frame,
//! with nothing of memwarden's to unwind through), then a thin line into one of three
//! shared bodies — [`allocate`], [`reallocate`], [`release`] — which call glibc's own
//! `__libc_*` functions. A tracked block gets memwarden's header ([`block_header`]) in front
//! of it; glibc's semantics hold because glibc does the work, and every argument check glibc
//! makes before allocating (calloc and reallocarray overflow, posix_memalign's alignment) is
//! made here first, so that a refused call is never recorded.

use core::ffi::{c_int, c_void, CStr};
use core::sync::atomic::{AtomicUsize, Ordering};

use memwarden_abi::failed_function;

use crate::block_header::{self, Tracked, HEADER_SIZE, MAX_TRACKED_SIZE};
use crate::injection;
use crate::lifecycle;
use crate::real::{self, SavedErrno};
use crate::recorder::Recorder;
use crate::thread_state::Guard;
use crate::unwind::Caller;

/// Which glibc function makes the underlying block.
#[derive(Clone, Copy)]
enum Source {
    Malloc,
    Calloc,
    Aligned(usize),
    Valloc,
    Pvalloc,
}

fn page_size() -> usize {
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    let known = PAGE.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    PAGE.store(page, Ordering::Relaxed);
    page
}

/// glibc's own call, untracked.
fn from_glibc(source: Source, size: usize) -> *mut c_void {
    // SAFETY: each is glibc's allocator with the caller's arguments.
    unsafe {
        match source {
            Source::Malloc => real::__libc_malloc(size),
            Source::Calloc => real::__libc_calloc(1, size),
            Source::Aligned(alignment) => real::__libc_memalign(alignment, size),
            Source::Valloc => real::__libc_valloc(size),
            Source::Pvalloc => real::__libc_pvalloc(size),
        }
    }
}

/// For a tracked block: the header offset and the glibc call that makes room for it.
/// `None` where the sums overflow: glibc then decides on the raw request.
fn tracked_layout(source: Source, size: usize) -> Option<(usize, Source, usize)> {
    if size as u64 > MAX_TRACKED_SIZE {
        return None;
    }
    let (offset, glibc, payload) = match source {
        Source::Malloc | Source::Calloc => (HEADER_SIZE, source, size),
        Source::Aligned(alignment) if alignment <= HEADER_SIZE => {
            (HEADER_SIZE, Source::Malloc, size)
        }
        Source::Aligned(alignment) => {
            // glibc rounds an alignment that is not a power of two up to the next one.
            let alignment = alignment.checked_next_power_of_two()?;
            (alignment, Source::Aligned(alignment), size)
        }
        Source::Valloc => (page_size(), Source::Aligned(page_size()), size),
        Source::Pvalloc => {
            let rounded = size.checked_next_multiple_of(page_size())?.max(page_size());
            (page_size(), Source::Aligned(page_size()), rounded)
        }
    };
    Some((offset, glibc, payload.checked_add(offset)?))
}

/// While profiling: the caller's stack id, or `None` if a `--fail` rule makes this call
/// fail (errno is then ENOMEM and the failure is recorded).
#[inline(always)]
fn stack_unless_failed(
    recorder: &Recorder,
    guard: &Guard,
    caller: Caller,
    function: u32,
    size: usize,
) -> Option<u32> {
    let errno = SavedErrno::save();
    let stack = recorder.stack_of(guard, caller);
    if let Some(injector) = injection::injector() {
        if injector.fails(recorder, stack, function, size as u64) {
            real::set_errno(libc::ENOMEM);
            return None;
        }
    }
    errno.restore();
    Some(stack)
}

/// Charges a block glibc just made to `stack`.
#[inline(always)]
fn charge_new_block(recorder: &Recorder, stack: u32, size: usize) {
    recorder.charge(stack, size as u64);
    if let Some(injector) = injection::injector() {
        injector.allocated(size as u64);
    }
}

/// Every allocating entry point: a tracked, headed block while profiling (or a failure a
/// `--fail` rule asks for); glibc's plain answer otherwise.
#[inline(always)]
fn allocate(caller: Caller, function: u32, source: Source, size: usize) -> *mut c_void {
    if let Some(recorder) = lifecycle::active() {
        if let Some(guard) = Guard::enter() {
            if let Some((offset, glibc, total)) = tracked_layout(source, size) {
                let Some(stack) = stack_unless_failed(recorder, &guard, caller, function, size)
                else {
                    return core::ptr::null_mut();
                };
                let base = from_glibc(glibc, total);
                if base.is_null() {
                    return base;
                }
                charge_new_block(recorder, stack, size);
                // SAFETY: `base` has room for `offset + size` bytes; offset is a power of two
                // ≥ 16; size and stack are within the header's limits.
                return unsafe { block_header::write(base, offset, size as u64, stack) };
            }
        }
    }
    from_glibc(source, size)
}

/// Charges the release of a tracked block, if tracking is on.
#[inline(always)]
fn charge_release(tracked: &Tracked) {
    if let Some(recorder) = lifecycle::active() {
        if let Some(guard) = Guard::enter() {
            recorder.charge_release(&guard, tracked.stack, tracked.size);
        }
    }
}

/// Every freeing entry point: a tracked block is charged and handed back to glibc from its
/// real start; any other pointer goes to glibc as it is.
#[inline(always)]
fn release(block: *mut c_void) {
    // SAFETY: `block` is non-null and came from the malloc family (C contract of free).
    match unsafe { block_header::read(block) } {
        Some(tracked) => {
            charge_release(&tracked);
            // SAFETY: a tracked block; its header is erased, then its glibc block freed.
            unsafe {
                block_header::erase(block);
                real::__libc_free(tracked.base);
            }
        }
        // SAFETY: forwards an untracked pointer to glibc.
        None => unsafe { real::__libc_free(block) },
    }
}

/// `realloc` and `reallocarray`: the release of the old block and an allocation of the new
/// size at the caller's stack, or nothing at all if glibc (or a `--fail` rule) refuses.
fn reallocate(caller: Caller, function: u32, block: *mut c_void, size: usize) -> *mut c_void {
    if block.is_null() {
        return allocate(caller, function, Source::Malloc, size);
    }
    // SAFETY: non-null pointer from the malloc family (C contract of realloc).
    let Some(tracked) = (unsafe { block_header::read(block) }) else {
        return reallocate_untracked(caller, function, block, size);
    };
    if size == 0 {
        // glibc's realloc(p, 0) frees the block and returns NULL.
        let errno = SavedErrno::save();
        release(block);
        errno.restore();
        return core::ptr::null_mut();
    }
    if tracked.offset != HEADER_SIZE {
        return move_block(caller, function, block, &tracked, size);
    }
    let Some(total) = size
        .checked_add(HEADER_SIZE)
        .filter(|_| size as u64 <= MAX_TRACKED_SIZE)
    else {
        real::set_errno(libc::ENOMEM);
        return core::ptr::null_mut();
    };
    let tracking = lifecycle::active().zip(Guard::enter());
    let mut stack = tracked.stack;
    if let Some((recorder, guard)) = &tracking {
        match stack_unless_failed(recorder, guard, caller, function, size) {
            Some(new_stack) => stack = new_stack,
            None => return core::ptr::null_mut(),
        }
    }
    // SAFETY: the tracked block's glibc start, resized to hold the header and `size` bytes.
    let moved = unsafe { real::__libc_realloc(tracked.base, total) };
    if moved.is_null() {
        return moved;
    }
    if let Some((recorder, guard)) = &tracking {
        recorder.charge_release(guard, tracked.stack, tracked.size);
        charge_new_block(recorder, stack, size);
    }
    // SAFETY: `moved` holds HEADER_SIZE + size bytes; the header is rewritten in place.
    unsafe { block_header::write(moved, HEADER_SIZE, size as u64, stack) }
}

/// realloc of a block memwarden did not track: it becomes tracked if profiling is on.
fn reallocate_untracked(
    caller: Caller,
    function: u32,
    block: *mut c_void,
    size: usize,
) -> *mut c_void {
    let tracking = lifecycle::active().zip(Guard::enter());
    let total = size
        .checked_add(HEADER_SIZE)
        .filter(|_| size != 0 && size as u64 <= MAX_TRACKED_SIZE);
    let (Some((recorder, guard)), Some(total)) = (tracking, total) else {
        // SAFETY: forwards the caller's arguments.
        return unsafe { real::__libc_realloc(block, size) };
    };
    let Some(stack) = stack_unless_failed(recorder, &guard, caller, function, size) else {
        return core::ptr::null_mut();
    };
    // SAFETY: an untracked glibc block, resized with room for a header.
    let moved = unsafe { real::__libc_realloc(block, total) };
    if moved.is_null() {
        return moved;
    }
    // SAFETY: the old contents are at the start of `moved`, which holds size + 16 bytes;
    // shifting `size` bytes up by 16 stays inside it.
    unsafe {
        core::ptr::copy(
            moved.cast::<u8>(),
            moved.cast::<u8>().add(HEADER_SIZE),
            size,
        )
    };
    charge_new_block(recorder, stack, size);
    // SAFETY: `moved` holds HEADER_SIZE + size bytes.
    unsafe { block_header::write(moved, HEADER_SIZE, size as u64, stack) }
}

/// realloc of an aligned block: a new block, a copy, a free (glibc does not keep the
/// alignment across realloc either).
fn move_block(
    caller: Caller,
    function: u32,
    block: *mut c_void,
    tracked: &Tracked,
    size: usize,
) -> *mut c_void {
    let fresh = allocate(caller, function, Source::Malloc, size);
    if fresh.is_null() {
        return fresh;
    }
    let keep = size.min(tracked.size as usize);
    // SAFETY: both blocks hold at least `keep` bytes and are distinct.
    unsafe { core::ptr::copy_nonoverlapping(block.cast::<u8>(), fresh.cast::<u8>(), keep) };
    let errno = SavedErrno::save();
    release(block);
    errno.restore();
    fresh
}

/// glibc's rule for posix_memalign: a power-of-two multiple of `sizeof(void *)`.
pub fn valid_posix_alignment(alignment: usize) -> bool {
    let word = core::mem::size_of::<*const c_void>();
    alignment != 0 && alignment.is_multiple_of(word) && (alignment / word).is_power_of_two()
}

/// An allocating export: a naked entry stub that hands the entry stack pointer and frame
/// pointer (the caller's registers, before anything touches them) to the function's body as
/// two extra arguments, in the registers after its own.
macro_rules! export_with_caller {
    ($(#[$doc:meta])* $name:ident => $body:ident, entry_sp: $sp:literal, bp: $bp:literal) => {
        $(#[$doc])*
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                concat!("mov ", $sp, ", rsp"),
                concat!("mov ", $bp, ", rbp"),
                "jmp {body}",
                body = sym $body,
            )
        }
    };
}

/// `count × size` for calloc and reallocarray; on overflow errno is ENOMEM and glibc is not
/// called (it would refuse too).
fn array_size(count: usize, size: usize) -> Option<usize> {
    let total = count.checked_mul(size);
    if total.is_none() {
        real::set_errno(libc::ENOMEM);
    }
    total
}

/// The caller, from what an entry stub passed.
#[inline(always)]
fn caller(entry_sp: u64, bp: u64) -> Caller {
    // SAFETY: `entry_sp` is the stack pointer at an export's first instruction (the stubs
    // above), so it points at the return address of the call.
    unsafe { Caller::at_entry(entry_sp, bp) }
}

export_with_caller!(
    /// # Safety
    /// The C contract of `malloc`.
    malloc => malloc_body, entry_sp: "rsi", bp: "rdx"
);
extern "C" fn malloc_body(size: usize, entry_sp: u64, bp: u64) -> *mut c_void {
    allocate(
        caller(entry_sp, bp),
        failed_function::MALLOC,
        Source::Malloc,
        size,
    )
}

export_with_caller!(
    /// # Safety
    /// The C contract of `calloc`.
    calloc => calloc_body, entry_sp: "rdx", bp: "rcx"
);
extern "C" fn calloc_body(count: usize, size: usize, entry_sp: u64, bp: u64) -> *mut c_void {
    match array_size(count, size) {
        Some(total) => allocate(
            caller(entry_sp, bp),
            failed_function::CALLOC,
            Source::Calloc,
            total,
        ),
        None => core::ptr::null_mut(),
    }
}

export_with_caller!(
    /// # Safety
    /// The C contract of `realloc`.
    realloc => realloc_body, entry_sp: "rdx", bp: "rcx"
);
extern "C" fn realloc_body(block: *mut c_void, size: usize, entry_sp: u64, bp: u64) -> *mut c_void {
    reallocate(caller(entry_sp, bp), failed_function::REALLOC, block, size)
}

export_with_caller!(
    /// # Safety
    /// The C contract of `reallocarray`.
    reallocarray => reallocarray_body, entry_sp: "rcx", bp: "r8"
);
extern "C" fn reallocarray_body(
    block: *mut c_void,
    count: usize,
    size: usize,
    entry_sp: u64,
    bp: u64,
) -> *mut c_void {
    match array_size(count, size) {
        Some(total) => reallocate(
            caller(entry_sp, bp),
            failed_function::REALLOCARRAY,
            block,
            total,
        ),
        None => core::ptr::null_mut(),
    }
}

#[no_mangle]
pub extern "C" fn free(block: *mut c_void) {
    if block.is_null() {
        return;
    }
    let errno = SavedErrno::save();
    release(block);
    errno.restore();
}

export_with_caller!(
    /// # Safety
    /// The C contract of `posix_memalign`: `out` is valid for a pointer-sized write.
    posix_memalign => posix_memalign_body, entry_sp: "rcx", bp: "r8"
);
/// # Safety
/// `out` must be valid for a pointer-sized write, as the C contract requires.
unsafe extern "C" fn posix_memalign_body(
    out: *mut *mut c_void,
    alignment: usize,
    size: usize,
    entry_sp: u64,
    bp: u64,
) -> c_int {
    if !valid_posix_alignment(alignment) {
        return libc::EINVAL;
    }
    let errno = SavedErrno::save();
    let block = allocate(
        caller(entry_sp, bp),
        failed_function::POSIX_MEMALIGN,
        Source::Aligned(alignment),
        size,
    );
    errno.restore();
    if block.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a writable pointer slot (C contract).
    unsafe { *out = block };
    0
}

export_with_caller!(
    /// # Safety
    /// The C contract of `aligned_alloc`.
    aligned_alloc => aligned_alloc_body, entry_sp: "rdx", bp: "rcx"
);
/// `aligned_alloc`, which is memalign in glibc 2.36 (same rounding of odd alignments).
extern "C" fn aligned_alloc_body(
    alignment: usize,
    size: usize,
    entry_sp: u64,
    bp: u64,
) -> *mut c_void {
    allocate(
        caller(entry_sp, bp),
        failed_function::ALIGNED_ALLOC,
        Source::Aligned(alignment),
        size,
    )
}
export_with_caller!(
    /// # Safety
    /// The C contract of `memalign`.
    memalign => memalign_body, entry_sp: "rdx", bp: "rcx"
);
extern "C" fn memalign_body(alignment: usize, size: usize, entry_sp: u64, bp: u64) -> *mut c_void {
    allocate(
        caller(entry_sp, bp),
        failed_function::MEMALIGN,
        Source::Aligned(alignment),
        size,
    )
}

export_with_caller!(
    /// # Safety
    /// The C contract of `valloc`.
    valloc => valloc_body, entry_sp: "rsi", bp: "rdx"
);
extern "C" fn valloc_body(size: usize, entry_sp: u64, bp: u64) -> *mut c_void {
    allocate(
        caller(entry_sp, bp),
        failed_function::VALLOC,
        Source::Valloc,
        size,
    )
}

export_with_caller!(
    /// # Safety
    /// The C contract of `pvalloc`.
    pvalloc => pvalloc_body, entry_sp: "rsi", bp: "rdx"
);
extern "C" fn pvalloc_body(size: usize, entry_sp: u64, bp: u64) -> *mut c_void {
    allocate(
        caller(entry_sp, bp),
        failed_function::PVALLOC,
        Source::Pvalloc,
        size,
    )
}

#[no_mangle]
pub extern "C" fn malloc_usable_size(block: *mut c_void) -> usize {
    if block.is_null() {
        return 0;
    }
    // SAFETY: a non-null pointer from the malloc family (C contract).
    match unsafe { block_header::read(block) } {
        Some(tracked) => real::malloc_usable_size(tracked.base).saturating_sub(tracked.offset),
        None => real::malloc_usable_size(block),
    }
}

/// The interposed function for an allocator symbol name, for `dlsym` redirection.
pub fn hooked_symbol(name: &CStr) -> Option<usize> {
    let address = match name.to_bytes() {
        b"malloc" => malloc as *const () as usize,
        b"calloc" => calloc as *const () as usize,
        b"realloc" => realloc as *const () as usize,
        b"reallocarray" => reallocarray as *const () as usize,
        b"free" => free as *const () as usize,
        b"posix_memalign" => posix_memalign as *const () as usize,
        b"aligned_alloc" => aligned_alloc as *const () as usize,
        b"memalign" => memalign as *const () as usize,
        b"valloc" => valloc as *const () as usize,
        b"pvalloc" => pvalloc as *const () as usize,
        b"malloc_usable_size" => malloc_usable_size as *const () as usize,
        _ => return None,
    };
    Some(address)
}

#[cfg(test)]
mod tests {
    use super::valid_posix_alignment;

    #[test]
    fn posix_alignment_follows_glibc() {
        for bad in [0usize, 1, 2, 3, 4, 31, 33, 4095, 4097, usize::MAX] {
            assert!(!valid_posix_alignment(bad), "{bad} accepted");
        }
        for good in [8usize, 16, 32, 4096, 4 << 20, 16 << 20] {
            assert!(valid_posix_alignment(good), "{good} refused");
        }
    }
}
