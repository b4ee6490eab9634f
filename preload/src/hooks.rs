//! Interposed calls: the exported malloc family. Each allocating export is a naked entry
//! stub that captures its caller's registers (so stacks start at the program's own frame,
//! with nothing of memwarden's to unwind through), then a thin line into one of three
//! shared bodies — [`allocate`], [`reallocate`], [`release`] — which call glibc's own
//! `__libc_*` functions. A tracked block gets memwarden's header ([`block_header`]) in front
//! of it; glibc's semantics hold because glibc does the work, and every argument check glibc
//! makes before allocating (calloc and reallocarray overflow, posix_memalign's alignment) is
//! made here first, so that a refused call is never recorded.

use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::guard::{self, Family};
use crate::hooks_guarded;
use crate::page_guard;

use crate::block_header::{self, Tracked, HEADER_SIZE, MAX_TRACKED_SIZE};
use crate::injection;
use crate::lifecycle;
use crate::real::{self, SavedErrno};
use crate::recorder::Recorder;
use crate::thread_state::Guard;
use crate::unwind::Caller;

/// Which glibc function makes the underlying block.
#[derive(Clone, Copy)]
pub enum Source {
    Malloc,
    Calloc,
    Aligned(usize),
    Valloc,
}

pub fn page_size() -> usize {
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
pub fn from_glibc(source: Source, size: usize) -> *mut c_void {
    // SAFETY: each is glibc's allocator with the caller's arguments.
    unsafe {
        match source {
            Source::Malloc => real::__libc_malloc(size),
            Source::Calloc => real::__libc_calloc(1, size),
            Source::Aligned(alignment) => real::__libc_memalign(alignment, size),
            Source::Valloc => real::__libc_valloc(size),
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
    };
    Some((offset, glibc, payload.checked_add(offset)?))
}

/// While profiling: the caller's stack id, or `None` if a `--fail` rule makes this call
/// fail (errno is then ENOMEM and the failure is recorded).
#[inline(always)]
pub fn stack_unless_failed(
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
pub fn charge_new_block(recorder: &Recorder, stack: u32, size: usize) {
    recorder.charge(stack, size as u64);
    if let Some(injector) = injection::injector() {
        injector.allocated(size as u64);
    }
}

/// What an allocation came to: a block, a failure a `--fail` rule asked for, or glibc out of
/// memory. (`operator new` treats the last two differently.)
pub enum Outcome {
    Block(*mut c_void),
    Injected,
    NoMemory,
}

impl Outcome {
    fn from_block(block: *mut c_void) -> Outcome {
        if block.is_null() {
            Outcome::NoMemory
        } else {
            Outcome::Block(block)
        }
    }

    pub fn block(self) -> *mut c_void {
        match self {
            Outcome::Block(block) => block,
            _ => core::ptr::null_mut(),
        }
    }
}

/// `--align N` (0: glibc's own alignment), set once at start-up.
static ALIGN: AtomicUsize = AtomicUsize::new(0);

/// Applies `--align` to every block from now on.
pub fn set_alignment(alignment: usize) {
    ALIGN.store(alignment, Ordering::Relaxed);
}

/// An untracked block from glibc, with `--align` applied. A calloc that `--align` turns
/// into memalign is zeroed here, since memalign does not zero.
fn untracked_block(source: Source, size: usize) -> *mut c_void {
    let glibc = aligned(source);
    let block = from_glibc(glibc, size);
    if !block.is_null() && matches!((source, glibc), (Source::Calloc, Source::Aligned(_))) {
        // SAFETY: glibc just made `block` with room for `size` bytes.
        unsafe { core::ptr::write_bytes(block.cast::<u8>(), 0, size) };
    }
    block
}

/// The source, with `--align` applied.
#[inline(always)]
fn aligned(source: Source) -> Source {
    let align = ALIGN.load(Ordering::Relaxed);
    if align <= HEADER_SIZE {
        return source;
    }
    match source {
        Source::Malloc | Source::Calloc => Source::Aligned(align),
        Source::Aligned(requested) => Source::Aligned(requested.max(align)),
        other => other,
    }
}

/// Every allocating entry point: a tracked, headed block while profiling (or a failure a
/// `--fail` rule asks for), a guarded block under `--guard header`; glibc's plain answer
/// otherwise.
#[inline(always)]
pub fn allocate_outcome(caller: Caller, function: u32, source: Source, size: usize) -> Outcome {
    if let Some(recorder) = lifecycle::active() {
        let Some(guard) = Guard::enter() else {
            // Re-entered (memwarden's own calls into libc): a plain block, known as such.
            let block = untracked_block(source, size);
            if let Some(header_guard) = guard::header_guard() {
                header_guard.note_raw(block);
            }
            return Outcome::from_block(block);
        };
        if let Some(page_guard) = page_guard::page_guard().filter(|g| g.takes(size)) {
            return hooks_guarded::allocate_paged(
                recorder, &guard, page_guard, caller, function, source, size,
            );
        }
        if let Some(header_guard) = guard::header_guard() {
            return hooks_guarded::allocate(
                recorder,
                &guard,
                header_guard,
                caller,
                function,
                source,
                size,
            );
        }
        let zeroed = matches!(source, Source::Calloc);
        if let Some((offset, glibc, total)) = tracked_layout(aligned(source), size) {
            let Some(stack) = stack_unless_failed(recorder, &guard, caller, function, size) else {
                return Outcome::Injected;
            };
            let glibc = match glibc {
                // An aligned calloc: memalign, then zeroed here.
                Source::Aligned(_) if zeroed => glibc,
                other => other,
            };
            let base = from_glibc(glibc, total);
            if base.is_null() {
                return Outcome::NoMemory;
            }
            if zeroed && matches!(glibc, Source::Aligned(_)) {
                // SAFETY: the block holds `total` bytes from `base`.
                unsafe { core::ptr::write_bytes(base.cast::<u8>(), 0, total) };
            }
            charge_new_block(recorder, stack, size);
            // SAFETY: `base` has room for `offset + size` bytes; offset is a power of two
            // ≥ 16; size and stack are within the header's limits.
            return Outcome::Block(unsafe {
                block_header::write(base, offset, size as u64, stack)
            });
        }
    }
    let block = untracked_block(source, size);
    if lifecycle::starting() {
        crate::preinit::note(block);
    }
    Outcome::from_block(block)
}

/// A plain tracked block for an already captured stack (the page guard's fallback).
pub fn allocate_unguarded(
    recorder: &Recorder,
    _guard: &Guard,
    stack: u32,
    source: Source,
    size: usize,
) -> Outcome {
    let Some((offset, glibc, total)) = tracked_layout(aligned(source), size) else {
        return Outcome::from_block(untracked_block(source, size));
    };
    let base = from_glibc(glibc, total);
    if base.is_null() {
        return Outcome::NoMemory;
    }
    if matches!(source, Source::Calloc) && matches!(glibc, Source::Aligned(_)) {
        // SAFETY: the block holds `total` bytes from `base`.
        unsafe { core::ptr::write_bytes(base.cast::<u8>(), 0, total) };
    }
    charge_new_block(recorder, stack, size);
    // SAFETY: `base` has room for `offset + size` bytes; offset is a power of two ≥ 16.
    Outcome::Block(unsafe { block_header::write(base, offset, size as u64, stack) })
}

/// [`allocate_outcome`] for the C functions: the block, or null.
#[inline(always)]
pub fn allocate(caller: Caller, function: u32, source: Source, size: usize) -> *mut c_void {
    allocate_outcome(caller, function, source, size).block()
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

/// Every freeing entry point: under `--guard header` the guard checks and keeps the block;
/// otherwise a tracked block is charged and handed back to glibc from its real start, and
/// any other pointer goes to glibc as it is. `family` and `claimed` (a sized deallocation's
/// size) only matter to the guard.
#[inline(always)]
pub fn release(caller: Caller, block: *mut c_void, family: Family, claimed: Option<u64>) {
    if let Some(page_guard) = page_guard::page_guard() {
        if hooks_guarded::release_paged(page_guard, caller, block, family, claimed) {
            return;
        }
    }
    if let Some(header_guard) = guard::header_guard() {
        hooks_guarded::release(header_guard, caller, block, family, claimed);
        return;
    }
    // SAFETY: `block` is non-null and came from the malloc family (C contract of free).
    release_unguarded(block, unsafe { block_header::read(block) });
}

/// The end of `release` with no guard in force, for a caller that has read the block's
/// header already (`tracked`, `None` for a block memwarden does not track).
#[inline(always)]
pub fn release_unguarded(block: *mut c_void, tracked: Option<Tracked>) {
    match tracked {
        Some(tracked) => {
            charge_release(&tracked);
            // SAFETY: a tracked block; its header is erased, then its glibc block freed.
            unsafe {
                block_header::erase(block);
                real::__libc_free(tracked.base);
            }
        }
        None => {
            if lifecycle::starting() {
                crate::preinit::moved(block, core::ptr::null_mut());
            }
            // SAFETY: forwards an untracked pointer to glibc.
            unsafe { real::__libc_free(block) }
        }
    }
}

/// `realloc` and `reallocarray`: the release of the old block and an allocation of the new
/// size at the caller's stack, or nothing at all if glibc (or a `--fail` rule) refuses.
pub fn reallocate(caller: Caller, function: u32, block: *mut c_void, size: usize) -> *mut c_void {
    if block.is_null() {
        return allocate(caller, function, Source::Malloc, size);
    }
    if let Some(page_guard) = page_guard::page_guard() {
        if let Some(old_size) = page_guard.usable_size(block) {
            return hooks_guarded::move_to_new_block(caller, function, block, old_size, size);
        }
        if page_guard.claims(block) {
            // A block it freed, or an address in its range that is no block: reported as
            // its free would be, and the call fails as a realloc that cannot move it does.
            release(caller, block, Family::Malloc, None);
            real::set_errno(libc::ENOMEM);
            return core::ptr::null_mut();
        }
    }
    if let Some(header_guard) = guard::header_guard() {
        return hooks_guarded::reallocate(header_guard, caller, function, block, size);
    }
    // SAFETY: non-null pointer from the malloc family (C contract of realloc).
    let Some(tracked) = (unsafe { block_header::read(block) }) else {
        return reallocate_untracked(caller, function, block, size);
    };
    if size == 0 {
        // glibc's realloc(p, 0) frees the block and returns NULL.
        let errno = SavedErrno::save();
        release(caller, block, Family::Malloc, None);
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
    // The header is erased first: if glibc moves the block, the old place must not keep a
    // valid header (the leak check finds live blocks by their headers).
    // SAFETY: a tracked block (its header was just read).
    unsafe { block_header::erase(block) };
    // SAFETY: the tracked block's glibc start, resized to hold the header and `size` bytes.
    let moved = unsafe { real::__libc_realloc(tracked.base, total) };
    if moved.is_null() {
        // glibc kept the old block: its header goes back.
        // SAFETY: the block is unchanged, with room for its header at offset 16.
        unsafe { block_header::write(tracked.base, HEADER_SIZE, tracked.size, tracked.stack) };
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
        let moved = unsafe { real::__libc_realloc(block, size) };
        if lifecycle::starting() && (!moved.is_null() || size == 0) {
            crate::preinit::moved(block, moved);
        }
        return moved;
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
    release(caller, block, Family::Malloc, None);
    errno.restore();
    fresh
}

/// glibc's rule for posix_memalign: a power-of-two multiple of `sizeof(void *)`.
pub fn valid_posix_alignment(alignment: usize) -> bool {
    let word = core::mem::size_of::<*const c_void>();
    alignment != 0 && alignment.is_multiple_of(word) && (alignment / word).is_power_of_two()
}
