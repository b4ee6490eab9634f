//! Interposed calls under `--guard header`: the shared bodies of allocation, release and
//! reallocation when every block is a guarded one (see [`guard`]). The export stubs in
//! `hooks.rs` and `hooks_cxx.rs` route here; accounting and fault injection work as in plain
//! profiling.

use core::ffi::c_void;

use memwarden_abi::{error_kind, failed_function, UNKNOWN_STACK_ID};

use crate::guard::{Family, HeaderGuard};
use crate::heap_errors::{self, HeapError};
use crate::hooks::{charge_new_block, page_size, stack_unless_failed, Outcome, Source};
use crate::lifecycle;
use crate::page_guard::PageGuard;
use crate::real::{self, SavedErrno};
use crate::recorder::Recorder;
use crate::thread_state::Guard;
use crate::unwind::Caller;

/// The allocation family of a call, from the function that made it.
fn family_of(function: u32) -> Family {
    match function {
        failed_function::OPERATOR_NEW => Family::New,
        failed_function::OPERATOR_NEW_ARRAY => Family::NewArray,
        _ => Family::Malloc,
    }
}

/// A guarded allocation.
pub fn allocate(
    recorder: &Recorder,
    guard: &Guard,
    header_guard: &HeaderGuard,
    caller: Caller,
    function: u32,
    source: Source,
    size: usize,
) -> Outcome {
    let Some(stack) = stack_unless_failed(recorder, guard, caller, function, size) else {
        return Outcome::Injected;
    };
    let (alignment, zeroed) = match source {
        Source::Malloc => (16, false),
        Source::Calloc => (16, true),
        // glibc rounds an alignment that is not a power of two up to the next one.
        Source::Aligned(alignment) => match alignment.checked_next_power_of_two() {
            Some(alignment) => (alignment, false),
            None => {
                real::set_errno(libc::EINVAL);
                return Outcome::NoMemory;
            }
        },
        Source::Valloc => (page_size(), false),
    };
    let block = header_guard.allocate(size, alignment, zeroed, family_of(function), stack);
    if block.is_null() {
        return Outcome::NoMemory;
    }
    charge_new_block(recorder, stack, size);
    if header_guard.check_due() {
        let errno = SavedErrno::save();
        header_guard.check_all(recorder, stack);
        errno.restore();
    }
    Outcome::Block(block)
}

/// A guarded release (free, delete, a sized deallocation, realloc's old block).
pub fn release(
    header_guard: &HeaderGuard,
    caller: Caller,
    block: *mut c_void,
    family: Family,
    claimed: Option<u64>,
) {
    let Some(recorder) = lifecycle::recorder() else {
        return;
    };
    let Some(guard) = Guard::enter() else {
        // Re-entered: memwarden's own libc calls free what they made; no checks here.
        header_guard.release_quietly(block);
        return;
    };
    let tracking = lifecycle::active().is_some();
    let stack = || {
        if tracking {
            recorder.stack_of(&guard, caller)
        } else {
            UNKNOWN_STACK_ID
        }
    };
    if let Some((stack, size)) = header_guard.release(recorder, block, family, claimed, &stack) {
        if tracking {
            recorder.charge_release(&guard, stack, size);
        }
    }
}

/// A guarded realloc: a new block, a copy, the old block released (so its redzones are
/// checked and it waits in quarantine like any freed block).
pub fn reallocate(
    header_guard: &HeaderGuard,
    caller: Caller,
    function: u32,
    block: *mut c_void,
    size: usize,
) -> *mut c_void {
    if size == 0 {
        release(header_guard, caller, block, Family::Malloc, None);
        return core::ptr::null_mut();
    }
    match header_guard.usable_size(block) {
        Some(old_size) => move_to_new_block(caller, function, block, old_size, size),
        None => reallocate_foreign(header_guard, caller, block, size),
    }
}

/// realloc of a block the guard did not make: glibc's own (made before start-up, or while
/// re-entered) is resized by glibc; anything else is reported as an invalid free.
fn reallocate_foreign(
    header_guard: &HeaderGuard,
    caller: Caller,
    block: *mut c_void,
    size: usize,
) -> *mut c_void {
    if header_guard.is_raw(block) || crate::preinit::contains(block as u64) {
        // SAFETY: a glibc block.
        let moved = unsafe { real::__libc_realloc(block, size) };
        header_guard.forget(block);
        header_guard.note_raw(moved);
        return moved;
    }
    release(header_guard, caller, block, Family::Malloc, None);
    real::set_errno(libc::ENOMEM);
    core::ptr::null_mut()
}

/// Reports an alignment argument glibc refuses (the call still returns what glibc returns).
pub fn report_bad_alignment(caller: Caller, alignment: usize) {
    let guarded =
        crate::guard::header_guard().is_some() || crate::page_guard::page_guard().is_some();
    let (true, Some(recorder)) = (guarded, lifecycle::active()) else {
        return;
    };
    let Some(guard) = Guard::enter() else {
        return;
    };
    let errno = SavedErrno::save();
    let stack = recorder.stack_of(&guard, caller);
    heap_errors::report(
        recorder,
        &HeapError {
            offset: alignment as i64,
            ..HeapError::without_block(error_kind::INVALID_ALIGNMENT, 0, stack)
        },
    );
    errno.restore();
}

/// An allocation sent to a guarded page (page mode, or a sampled one).
pub fn allocate_paged(
    recorder: &Recorder,
    guard: &Guard,
    page_guard: &PageGuard,
    caller: Caller,
    function: u32,
    source: Source,
    size: usize,
) -> Outcome {
    let Some(stack) = stack_unless_failed(recorder, guard, caller, function, size) else {
        return Outcome::Injected;
    };
    let alignment = match source {
        Source::Aligned(alignment) => alignment.checked_next_power_of_two().unwrap_or(usize::MAX),
        Source::Valloc => page_size(),
        Source::Malloc | Source::Calloc => 16,
    };
    // Fresh pages are zeroed, so calloc needs nothing more.
    let block = page_guard.allocate(
        size,
        alignment,
        matches!(source, Source::Calloc),
        family_of(function),
        stack,
    );
    if block.is_null() {
        // Out of mappings (the kernel's limit) rather than memory, most likely: an unguarded
        // block keeps the program going.
        return crate::hooks::allocate_unguarded(recorder, guard, stack, source, size);
    }
    charge_new_block(recorder, stack, size);
    Outcome::Block(block)
}

/// Frees `block` if it is page-guarded (true); false leaves it to the other paths.
pub fn release_paged(
    page_guard: &PageGuard,
    caller: Caller,
    block: *mut c_void,
    family: Family,
    claimed: Option<u64>,
) -> bool {
    if !page_guard.may_own(block) {
        return false;
    }
    let Some(recorder) = lifecycle::recorder() else {
        return false;
    };
    let guard = Guard::enter();
    let tracking = guard.is_some() && lifecycle::active().is_some();
    let stack = || match &guard {
        Some(guard) if tracking => recorder.stack_of(guard, caller),
        _ => UNKNOWN_STACK_ID,
    };
    match page_guard.release(recorder, block, family, claimed, &stack) {
        None => false,
        Some(charged) => {
            if let (Some((stack, size)), Some(guard)) = (charged, &guard) {
                if tracking {
                    recorder.charge_release(guard, stack, size);
                }
            }
            true
        }
    }
}

/// realloc of a guarded block: a new block (guarded as the mode decides), a copy, the old one
/// released (so its redzones are checked and it waits in quarantine like any freed block).
pub fn move_to_new_block(
    caller: Caller,
    function: u32,
    block: *mut c_void,
    old_size: usize,
    size: usize,
) -> *mut c_void {
    if size == 0 {
        crate::hooks::release(caller, block, Family::Malloc, None);
        return core::ptr::null_mut();
    }
    let fresh = crate::hooks::allocate_outcome(caller, function, Source::Malloc, size).block();
    if fresh.is_null() {
        return fresh;
    }
    // SAFETY: both blocks hold at least the smaller size and are distinct.
    unsafe {
        core::ptr::copy_nonoverlapping(block.cast::<u8>(), fresh.cast::<u8>(), old_size.min(size))
    };
    let errno = SavedErrno::save();
    crate::hooks::release(caller, block, Family::Malloc, None);
    errno.restore();
    fresh
}
