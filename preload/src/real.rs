//! Interposed call → the original: glibc's allocator entry points, called directly by their
//! `__libc_*` names so that the malloc family never depends on `dlsym` (which can itself
//! allocate), plus the few originals that must be looked up (`dlsym`, `malloc_usable_size`).

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

extern "C" {
    pub fn __libc_malloc(size: usize) -> *mut c_void;
    pub fn __libc_calloc(count: usize, size: usize) -> *mut c_void;
    pub fn __libc_realloc(block: *mut c_void, size: usize) -> *mut c_void;
    pub fn __libc_free(block: *mut c_void);
    pub fn __libc_memalign(alignment: usize, size: usize) -> *mut c_void;
    pub fn __libc_valloc(size: usize) -> *mut c_void;
    pub fn __libc_pvalloc(size: usize) -> *mut c_void;
    fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void;
}

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type UsableSizeFn = unsafe extern "C" fn(*mut c_void) -> usize;

/// glibc's `dlsym`, read by the naked `dlsym` hook as a plain word, hence `AtomicUsize`.
/// Not exported, so the hook can address it relative to its own code.
pub(crate) static MEMWARDEN_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// glibc's `dlsym`, found through `dlvsym(RTLD_NEXT)` (which this library does not
/// interpose). Returns 0 if it cannot be found. Called by the naked hook, so `extern "C"`.
pub extern "C" fn resolve_dlsym() -> usize {
    let known = MEMWARDEN_REAL_DLSYM.load(Ordering::Acquire);
    if known != 0 {
        return known;
    }
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated names; the caller is this
        // library, so "next" is the library after it in the search order (libc).
        let found = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !found.is_null() {
            MEMWARDEN_REAL_DLSYM.store(found as usize, Ordering::Release);
            return found as usize;
        }
    }
    0
}

/// Looks `symbol` up after this library in the search order, through the real `dlsym`.
pub fn next_symbol(symbol: &core::ffi::CStr) -> usize {
    let real = resolve_dlsym();
    if real == 0 {
        return 0;
    }
    // SAFETY: `real` is glibc's dlsym (non-zero, resolved above).
    let dlsym: DlsymFn = unsafe { core::mem::transmute::<usize, DlsymFn>(real) };
    // SAFETY: valid handle constant and NUL-terminated name.
    unsafe { dlsym(libc::RTLD_NEXT, symbol.as_ptr()) as usize }
}

/// A symbol looked up once, lazily, after this library in the search order.
pub struct NextSymbol {
    name: &'static core::ffi::CStr,
    address: AtomicUsize,
}

impl NextSymbol {
    pub const fn new(name: &'static core::ffi::CStr) -> Self {
        NextSymbol {
            name,
            address: AtomicUsize::new(0),
        }
    }

    /// The symbol's address, or 0 if it does not exist.
    pub fn get(&self) -> usize {
        let known = self.address.load(Ordering::Acquire);
        if known != 0 {
            return known;
        }
        let found = next_symbol(self.name);
        self.address.store(found, Ordering::Release);
        found
    }
}

static USABLE_SIZE: NextSymbol = NextSymbol::new(c"malloc_usable_size");

/// glibc's `malloc_usable_size`; 0 if it cannot be found (as glibc answers for NULL).
pub fn malloc_usable_size(block: *mut c_void) -> usize {
    let address = USABLE_SIZE.get();
    if address == 0 {
        return 0;
    }
    // SAFETY: the address is glibc's malloc_usable_size, with its C signature.
    let usable: UsableSizeFn = unsafe { core::mem::transmute::<usize, UsableSizeFn>(address) };
    // SAFETY: forwards the caller's pointer as the caller passed it.
    unsafe { usable(block) }
}

/// The calling thread's errno, saved on entry to a hook and restored on exit.
pub struct SavedErrno(c_int);

impl SavedErrno {
    #[inline]
    pub fn save() -> Self {
        // SAFETY: __errno_location always returns the calling thread's errno slot.
        SavedErrno(unsafe { *libc::__errno_location() })
    }

    #[inline]
    pub fn restore(self) {
        // SAFETY: as in `save`.
        unsafe { *libc::__errno_location() = self.0 }
    }
}

/// Sets the calling thread's errno.
#[inline]
pub fn set_errno(value: c_int) {
    // SAFETY: __errno_location always returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = value }
}

/// Looks `symbol` up in the global scope (what an unqualified call would bind to).
pub fn next_symbol_default(symbol: &core::ffi::CStr) -> usize {
    let real = resolve_dlsym();
    if real == 0 {
        return 0;
    }
    // SAFETY: `real` is glibc's dlsym.
    let dlsym: DlsymFn = unsafe { core::mem::transmute::<usize, DlsymFn>(real) };
    // SAFETY: valid handle constant and NUL-terminated name.
    unsafe { dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) as usize }
}
