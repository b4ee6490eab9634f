//! Interposed calls: the exported C allocator functions. Each allocating export (and `free`)
//! is a naked entry stub that captures its caller's registers — so stacks start at the
//! program's own frame with nothing of memwarden's to unwind through — then a thin body
//! that calls one of the shared bodies in [`crate::hooks`].

use core::ffi::{c_int, c_void, CStr};

use memwarden_abi::failed_function;

use crate::block_header;
use crate::guard::{self, Family};
use crate::hooks::{allocate, page_size, reallocate, release, valid_posix_alignment, Source};
use crate::hooks_guarded;
use crate::real::{self, SavedErrno};
use crate::unwind::Caller;

/// An allocating export: a naked entry stub that hands the entry stack pointer and frame
/// pointer (the caller's registers, before anything touches them) to the function's body as
/// two extra arguments, in the registers after its own.
#[macro_export]
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
pub(crate) fn array_size(count: usize, size: usize) -> Option<usize> {
    let total = count.checked_mul(size);
    if total.is_none() {
        real::set_errno(libc::ENOMEM);
    }
    total
}

/// The caller, from what an entry stub passed.
#[inline(always)]
pub fn caller(entry_sp: u64, bp: u64) -> Caller {
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

export_with_caller!(
    /// # Safety
    /// The C contract of `free`.
    free => free_body, entry_sp: "rsi", bp: "rdx"
);
extern "C" fn free_body(block: *mut c_void, entry_sp: u64, bp: u64) {
    free_checked(caller(entry_sp, bp), block, Family::Malloc, None);
}

/// `free`, and the C++ deletes: nothing for null, errno kept.
pub fn free_checked(caller: Caller, block: *mut c_void, family: Family, claimed: Option<u64>) {
    if block.is_null() {
        return;
    }
    let errno = SavedErrno::save();
    release(caller, block, family, claimed);
    errno.restore();
}

export_with_caller!(
    /// # Safety
    /// The C contract of C23's `free_sized`: `size` is the size the block was allocated with.
    free_sized => free_sized_body, entry_sp: "rdx", bp: "rcx"
);
extern "C" fn free_sized_body(block: *mut c_void, size: usize, entry_sp: u64, bp: u64) {
    free_checked(
        caller(entry_sp, bp),
        block,
        Family::Malloc,
        Some(size as u64),
    );
}

export_with_caller!(
    /// # Safety
    /// The C contract of C23's `free_aligned_sized`.
    free_aligned_sized => free_aligned_sized_body, entry_sp: "rcx", bp: "r8"
);
extern "C" fn free_aligned_sized_body(
    block: *mut c_void,
    _alignment: usize,
    size: usize,
    entry_sp: u64,
    bp: u64,
) {
    free_checked(
        caller(entry_sp, bp),
        block,
        Family::Malloc,
        Some(size as u64),
    );
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
        hooks_guarded::report_bad_alignment(caller(entry_sp, bp), alignment);
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
/// memalign and aligned_alloc round an alignment that is not a power of two up; the guard
/// reports it all the same.
fn note_odd_alignment(caller: Caller, alignment: usize) {
    if !alignment.is_power_of_two() {
        hooks_guarded::report_bad_alignment(caller, alignment);
    }
}

extern "C" fn aligned_alloc_body(
    alignment: usize,
    size: usize,
    entry_sp: u64,
    bp: u64,
) -> *mut c_void {
    note_odd_alignment(caller(entry_sp, bp), alignment);
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
    note_odd_alignment(caller(entry_sp, bp), alignment);
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
    // pvalloc's block is whole pages, all of them the program's: the rounded size is the
    // one charged, guarded and told by malloc_usable_size.
    let page = page_size();
    let Some(pages) = size
        .checked_next_multiple_of(page)
        .map(|bytes| bytes.max(page))
    else {
        real::set_errno(libc::ENOMEM);
        return core::ptr::null_mut();
    };
    allocate(
        caller(entry_sp, bp),
        failed_function::PVALLOC,
        Source::Valloc,
        pages,
    )
}

#[no_mangle]
pub extern "C" fn malloc_usable_size(block: *mut c_void) -> usize {
    if block.is_null() {
        return 0;
    }
    if let Some(page_guard) = crate::page_guard::page_guard() {
        if let Some(size) = page_guard.usable_size(block) {
            return size;
        }
        if page_guard.claims(block) {
            // Freed, or no block: nothing usable, and nothing before it to read.
            return 0;
        }
    }
    if let Some(header_guard) = guard::header_guard() {
        if let Some(size) = header_guard.usable_size(block) {
            return size;
        }
        return real::malloc_usable_size(block);
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
        b"free_sized" => free_sized as *const () as usize,
        b"free_aligned_sized" => free_aligned_sized as *const () as usize,
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
