//! Interposed call: anonymous `mmap`, only so that `--fail calls=mmap` rules can make it fail
//! (MAP_FAILED, errno ENOMEM). Mappings are not profiled; every other call goes straight to
//! the kernel, as glibc's own `mmap` does.

use core::ffi::c_void;

use memwarden_abi::failed_function;

use crate::injection;
use crate::lifecycle;
use crate::real::{self, SavedErrno};
use crate::thread_state::Guard;
use crate::unwind;

/// The system call itself (glibc's `mmap` is this, with errno set on failure).
pub fn kernel_mmap(
    address: *mut c_void,
    length: usize,
    protection: i32,
    flags: i32,
    fd: i32,
    offset: i64,
) -> *mut c_void {
    // SAFETY: forwards the caller's arguments to the mmap system call; on failure it
    // returns -1 (MAP_FAILED) with errno set, like glibc's mmap.
    unsafe {
        libc::syscall(
            libc::SYS_mmap,
            address,
            length,
            protection,
            flags,
            fd,
            offset,
        ) as *mut c_void
    }
}

/// Whether a `--fail` rule makes this anonymous mapping fail (recorded if so).
fn injected_failure(length: usize) -> bool {
    let Some(injector) = injection::injector().filter(|i| i.fails_mmap()) else {
        return false;
    };
    let (Some(recorder), Some(guard)) = (lifecycle::active(), Guard::enter()) else {
        return false;
    };
    let errno = SavedErrno::save();
    let stack = unwind::caller_here(&guard).map_or(memwarden_abi::UNKNOWN_STACK_ID, |caller| {
        recorder.stack_of(&guard, caller)
    });
    errno.restore();
    injector.fails(recorder, stack, failed_function::MMAP, length as u64)
}

/// # Safety
/// The C contract of `mmap`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    address: *mut c_void,
    length: usize,
    protection: i32,
    flags: i32,
    fd: i32,
    offset: i64,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS != 0 && injected_failure(length) {
        real::set_errno(libc::ENOMEM);
        return libc::MAP_FAILED;
    }
    kernel_mmap(address, length, protection, flags, fd, offset)
}

/// # Safety
/// The C contract of `mmap64` (the same as `mmap` on 64-bit Linux).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    address: *mut c_void,
    length: usize,
    protection: i32,
    flags: i32,
    fd: i32,
    offset: i64,
) -> *mut c_void {
    // SAFETY: the same contract.
    unsafe { mmap(address, length, protection, flags, fd, offset) }
}
