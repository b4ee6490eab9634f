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

/// glibc's `dlsym` as a function, if it can be found.
pub fn glibc_dlsym() -> Option<DlsymFn> {
    let real = resolve_dlsym();
    // SAFETY: a non-zero `real` is glibc's dlsym, with this signature.
    (real != 0).then(|| unsafe { core::mem::transmute::<usize, DlsymFn>(real) })
}

/// `symbol`'s address as glibc's `dlsym` finds it through `handle`; 0 if not found.
fn symbol_through(handle: *mut c_void, symbol: &core::ffi::CStr) -> usize {
    let Some(dlsym) = glibc_dlsym() else {
        return 0;
    };
    // SAFETY: a handle constant and a NUL-terminated name.
    unsafe { dlsym(handle, symbol.as_ptr()) as usize }
}

/// Looks `symbol` up after this library in the search order.
pub fn next_symbol(symbol: &core::ffi::CStr) -> usize {
    symbol_through(libc::RTLD_NEXT, symbol)
}

/// Looks `symbol` up in the global scope (what an unqualified call would bind to).
pub fn global_symbol(symbol: &core::ffi::CStr) -> usize {
    symbol_through(libc::RTLD_DEFAULT, symbol)
}

/// `dladdr1`'s request for the symbol table entry (glibc's `RTLD_DL_SYMENT`).
const RTLD_DL_SYMENT: c_int = 1;
/// `st_shndx` of an undefined symbol.
const SHN_UNDEF: u16 = 0;

/// Whether a symbol the dynamic loader exports is *defined* at `address`. A non-PIE program
/// that takes a function's address (CPython 3.11 stores `&malloc`) gets a canonical PLT
/// entry: its dynamic symbol table lists `malloc` as undefined but with the stub's address,
/// and lookups in the global scope return that stub, while calls through it still reach
/// the first definition (this library). `dladdr` alone names the stub `malloc` too, so the
/// symbol's table entry is asked for and its section checked.
pub fn symbol_defined_at(address: usize) -> bool {
    let mut info = libc::Dl_info {
        dli_fname: core::ptr::null(),
        dli_fbase: core::ptr::null_mut(),
        dli_sname: core::ptr::null(),
        dli_saddr: core::ptr::null_mut(),
    };
    let mut entry: *mut c_void = core::ptr::null_mut();
    // SAFETY: `info` and `entry` are valid and writable; dladdr1 only reads the loader's
    // tables.
    let found = unsafe {
        libc::dladdr1(
            address as *const c_void,
            &mut info,
            &mut entry,
            RTLD_DL_SYMENT,
        )
    };
    if found == 0 || entry.is_null() || info.dli_saddr as usize != address {
        return false;
    }
    // SAFETY: with RTLD_DL_SYMENT, a found symbol's `entry` points at its Elf64_Sym in the
    // module's dynamic symbol table, mapped as long as the module is.
    let section = unsafe { (*entry.cast::<libc::Elf64_Sym>()).st_shndx };
    section != SHN_UNDEF
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
