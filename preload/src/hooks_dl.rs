//! Interposed calls of the dynamic loader: `dlsym`, so that an allocator function looked up
//! through a handle on libc itself (Python's `ctypes.CDLL("libc.so.6").malloc`) is still the
//! interposed one; `dlopen`, which drops `RTLD_DEEPBIND` (a library opened so binds its own
//! `malloc` and `free` to glibc's, past the preload, and then frees the program's blocks,
//! which carry memwarden's header, with glibc's `free`: an abort); and `dlclose`, after which
//! the unwinder forgets unloaded modules.
//!
//! `dlsym(RTLD_NEXT, …)` depends on who calls it, so that case jumps straight into glibc's
//! `dlsym` with the caller's return address untouched (a naked tail jump): another preload
//! library's `RTLD_NEXT` lookups keep meaning "after that library".

use core::ffi::{c_char, c_int, c_void, CStr};
use core::sync::atomic::AtomicBool;

use crate::real::{self, NextSymbol};
use crate::thread_state::Guard;
use crate::{hooks_exports, lifecycle, snapshot};

/// # Safety
/// The C contract of `dlsym`: a valid handle and a NUL-terminated name.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // RTLD_NEXT is (void *)-1.
        "cmp rdi, -1",
        "jne {filtered}",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jnz 2f",
        // Not resolved yet: resolve, keeping the arguments and 16-byte stack alignment.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 3f",
        "2:",
        "jmp rax",
        "3:",
        "ret",
        filtered = sym dlsym_filtered,
        real = sym real::MEMWARDEN_REAL_DLSYM,
        resolve = sym real::resolve_dlsym,
    )
}

/// `dlsym` for every handle but RTLD_NEXT: glibc's answer, except that libc's own
/// allocator functions are swapped for the interposed ones.
extern "C" fn dlsym_filtered(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let Some(glibc_dlsym) = real::glibc_dlsym() else {
        return core::ptr::null_mut();
    };
    // SAFETY: forwards the caller's arguments.
    let found = unsafe { glibc_dlsym(handle, symbol) };
    if found.is_null() || symbol.is_null() {
        return found;
    }
    // SAFETY: dlsym's contract: `symbol` is NUL-terminated (glibc just read it).
    let name = unsafe { CStr::from_ptr(symbol) };
    match hooks_exports::hooked_symbol(name) {
        Some(ours) if ours as *mut c_void != found && in_libc(found) => ours as *mut c_void,
        _ => found,
    }
}

/// True if `address` lies in libc (found with dladdr: this path is rare and not hot).
fn in_libc(address: *mut c_void) -> bool {
    // SAFETY: Dl_info is plain data; dladdr fills it or returns 0.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dladdr sets dli_fname to the module's NUL-terminated path.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    let file = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    file.starts_with(b"libc.so")
}

static REAL_DLOPEN: NextSymbol = NextSymbol::new(c"dlopen");
static DEEPBIND_SAID: AtomicBool = AtomicBool::new(false);

/// # Safety
/// The C contract of `dlopen`: a NUL-terminated path (or null) and a mode.
///
/// A naked stub that tail-jumps into glibc's `dlopen`: glibc finds the library's search
/// path (the caller's `RUNPATH`) and namespace from its return address, which must stay the
/// caller's.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        "test esi, {deepbind}",
        "jz 2f",
        "and esi, {other_flags}",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {say}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "2:",
        // glibc's dlopen, keeping the arguments and 16-byte stack alignment.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {real}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "ret",
        deepbind = const libc::RTLD_DEEPBIND,
        other_flags = const !libc::RTLD_DEEPBIND,
        say = sym say_deepbind_dropped,
        real = sym real_dlopen,
    )
}

/// glibc's `dlopen` (0 if it cannot be found: the stub then returns null).
extern "C" fn real_dlopen() -> usize {
    REAL_DLOPEN.get()
}

extern "C" fn say_deepbind_dropped() {
    let errno = real::SavedErrno::save();
    crate::log::say_once(
        &DEEPBIND_SAID,
        &[b"a library was opened with RTLD_DEEPBIND, which would bind its malloc and free past memwarden (freeing the program's blocks with glibc's free aborts); it is opened without it"],
    );
    errno.restore();
}

static REAL_DLCLOSE: NextSymbol = NextSymbol::new(c"dlclose");
type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// # Safety
/// The C contract of `dlclose`: a handle from `dlopen`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let address = REAL_DLCLOSE.get();
    if address == 0 {
        return -1;
    }
    // SAFETY: the address is glibc's dlclose.
    let glibc_dlclose: DlcloseFn = unsafe { core::mem::transmute::<usize, DlcloseFn>(address) };
    // SAFETY: forwards the caller's handle.
    let status = unsafe { glibc_dlclose(handle) };
    if let Some(recorder) = lifecycle::active() {
        if let Some(guard) = Guard::enter() {
            let errno = real::SavedErrno::save();
            snapshot::rebuild(&guard, Some(&recorder.file));
            errno.restore();
        }
    }
    status
}
