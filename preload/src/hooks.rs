//! Interposed calls: the exported malloc family. Each export is a thin line into one of
//! three shared bodies — [`allocated`], [`reallocate`], [`release`] — which call glibc's own
//! `__libc_*` functions and record the result. glibc's semantics hold because glibc does the
//! work; only argument checks glibc makes before allocating are repeated here (calloc and
//! reallocarray overflow, posix_memalign's alignment rule) so that a refused call is never
//! recorded.

use core::ffi::{c_int, c_void, CStr};

use crate::lifecycle;
use crate::real::{self, SavedErrno};
use crate::thread_state::Guard;

/// Records a block that glibc just returned (null: nothing to record).
#[inline(always)]
fn allocated(block: *mut c_void, size: usize) -> *mut c_void {
    if block.is_null() {
        return block;
    }
    if let Some(recorder) = lifecycle::active() {
        if let Some(guard) = Guard::enter() {
            let errno = SavedErrno::save();
            recorder.record_allocation(&guard, block, size);
            errno.restore();
        }
    }
    block
}

/// Forgets and charges a block about to be freed.
#[inline(always)]
fn release(block: *mut c_void) {
    if let Some(recorder) = lifecycle::active() {
        if let Some(guard) = Guard::enter() {
            if let Some(recorded) = recorder.forget(&guard, block) {
                recorder.charge_release(&guard, recorded);
            }
        }
    }
}

/// `realloc` and `reallocarray`: a release of the old block and an allocation of the new
/// size at the caller's stack, or nothing at all if glibc fails.
fn reallocate(block: *mut c_void, size: usize) -> *mut c_void {
    if block.is_null() {
        // SAFETY: glibc malloc.
        return allocated(unsafe { real::__libc_malloc(size) }, size);
    }
    let tracking = lifecycle::active().zip(Guard::enter());
    let Some((recorder, guard)) = tracking else {
        // SAFETY: forwards the caller's arguments.
        return unsafe { real::__libc_realloc(block, size) };
    };
    let errno = SavedErrno::save();
    let recorded = recorder.forget(&guard, block);
    // SAFETY: forwards the caller's arguments.
    let moved = unsafe { real::__libc_realloc(block, size) };
    if moved.is_null() {
        if size == 0 {
            // glibc frees the block and returns NULL for realloc(p, 0).
            if let Some(recorded) = recorded {
                recorder.charge_release(&guard, recorded);
            }
            errno.restore();
        } else if let Some(recorded) = recorded {
            // Failed: the old block is untouched, so it stays recorded. errno is ENOMEM.
            recorder.restore(&guard, block, recorded);
        }
        return moved;
    }
    if let Some(recorded) = recorded {
        recorder.charge_release(&guard, recorded);
    }
    recorder.record_allocation(&guard, moved, size);
    errno.restore();
    moved
}

/// glibc's rule for posix_memalign: a power-of-two multiple of `sizeof(void *)`.
pub fn valid_posix_alignment(alignment: usize) -> bool {
    let word = core::mem::size_of::<*const c_void>();
    alignment != 0 && alignment.is_multiple_of(word) && (alignment / word).is_power_of_two()
}

#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    // SAFETY: glibc malloc.
    allocated(unsafe { real::__libc_malloc(size) }, size)
}

#[no_mangle]
pub extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    let Some(total) = count.checked_mul(size) else {
        real::set_errno(libc::ENOMEM);
        return core::ptr::null_mut();
    };
    // SAFETY: glibc calloc with a product known not to overflow.
    allocated(unsafe { real::__libc_calloc(count, size) }, total)
}

#[no_mangle]
pub extern "C" fn realloc(block: *mut c_void, size: usize) -> *mut c_void {
    reallocate(block, size)
}

#[no_mangle]
pub extern "C" fn reallocarray(block: *mut c_void, count: usize, size: usize) -> *mut c_void {
    let Some(total) = count.checked_mul(size) else {
        real::set_errno(libc::ENOMEM);
        return core::ptr::null_mut();
    };
    reallocate(block, total)
}

#[no_mangle]
pub extern "C" fn free(block: *mut c_void) {
    if block.is_null() {
        return;
    }
    let errno = SavedErrno::save();
    release(block);
    // SAFETY: forwards the caller's pointer to glibc free.
    unsafe { real::__libc_free(block) };
    errno.restore();
}

/// # Safety
/// `out` must be valid for a pointer-sized write, as the C contract requires.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    alignment: usize,
    size: usize,
) -> c_int {
    if !valid_posix_alignment(alignment) {
        return libc::EINVAL;
    }
    let errno = SavedErrno::save();
    // SAFETY: glibc memalign with a valid alignment.
    let block = unsafe { real::__libc_memalign(alignment, size) };
    errno.restore();
    if block.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a writable pointer slot (C contract).
    unsafe { *out = allocated(block, size) };
    0
}

#[no_mangle]
pub extern "C" fn aligned_alloc(alignment: usize, size: usize) -> *mut c_void {
    // glibc 2.36's aligned_alloc is memalign: same rounding of odd alignments.
    // SAFETY: glibc memalign.
    allocated(unsafe { real::__libc_memalign(alignment, size) }, size)
}

#[no_mangle]
pub extern "C" fn memalign(alignment: usize, size: usize) -> *mut c_void {
    // SAFETY: glibc memalign.
    allocated(unsafe { real::__libc_memalign(alignment, size) }, size)
}

#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    // SAFETY: glibc valloc.
    allocated(unsafe { real::__libc_valloc(size) }, size)
}

#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    // SAFETY: glibc pvalloc.
    allocated(unsafe { real::__libc_pvalloc(size) }, size)
}

#[no_mangle]
pub extern "C" fn malloc_usable_size(block: *mut c_void) -> usize {
    real::malloc_usable_size(block)
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
