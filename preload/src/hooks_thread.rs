//! Interposed call: `pthread_create`, so that a native thread started from Python code is
//! attributed to the Python line that started it. When the creating thread runs Python, its
//! stack is recorded and handed to the new thread, whose stacks without Python frames of
//! their own then continue with it (a BLAS worker's allocations show under `import numpy`).
//! Threads created from anywhere else start exactly as they would without memwarden.

use core::ffi::{c_int, c_void};

use memwarden_abi::python::{decode, FrameWord};

use crate::export_with_caller;
use crate::hooks_exports::caller;
use crate::lifecycle;
use crate::python_runtime;
use crate::real::{self, NextSymbol, SavedErrno};
use crate::thread_state::Guard;
use crate::unwind::Caller;

type StartFn = extern "C" fn(*mut c_void) -> *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartFn,
    *mut c_void,
) -> c_int;

static REAL_PTHREAD_CREATE: NextSymbol = NextSymbol::new(c"pthread_create");

/// What the new thread needs: the program's start routine and the creator's stack.
struct Launch {
    start: StartFn,
    argument: *mut c_void,
    creator: u32,
}

export_with_caller!(
    /// # Safety
    /// The C contract of `pthread_create`.
    pthread_create => pthread_create_body, entry_sp: "r8", bp: "r9"
);
extern "C" fn pthread_create_body(
    thread: *mut libc::pthread_t,
    attributes: *const libc::pthread_attr_t,
    start: StartFn,
    argument: *mut c_void,
    entry_sp: u64,
    bp: u64,
) -> c_int {
    let real = REAL_PTHREAD_CREATE.get();
    if real == 0 {
        return libc::EAGAIN;
    }
    // SAFETY: the address is libc's pthread_create, with this signature.
    let real: CreateFn = unsafe { core::mem::transmute::<usize, CreateFn>(real) };
    let errno = SavedErrno::save();
    let creator = python_creator(caller(entry_sp, bp));
    errno.restore();
    let Some(creator) = creator else {
        // SAFETY: forwards the caller's arguments unchanged.
        return unsafe { real(thread, attributes, start, argument) };
    };
    // glibc's own allocator, not a Box: out of memory, the thread simply starts untouched
    // (Rust's allocation failure would abort the program).
    // SAFETY: plain glibc allocation of a small, suitably aligned (16-byte) block.
    let launch = unsafe { real::__libc_malloc(core::mem::size_of::<Launch>()) }.cast::<Launch>();
    if launch.is_null() {
        // SAFETY: forwards the caller's arguments unchanged.
        return unsafe { real(thread, attributes, start, argument) };
    }
    // SAFETY: `launch` has room for a Launch; `real` starts the thread with it, and that
    // thread takes ownership (or it is freed below if no thread starts).
    let status = unsafe {
        launch.write(Launch {
            start,
            argument,
            creator,
        });
        real(thread, attributes, launch_thread, launch.cast())
    };
    if status != 0 {
        // SAFETY: no thread received `launch`; it is still this function's.
        unsafe { real::__libc_free(launch.cast()) };
    }
    status
}

/// The creator's stack, if it holds Python frames (only then is the thread's start worth
/// recording).
fn python_creator(caller: Caller) -> Option<u32> {
    python_runtime::runtime()?;
    let recorder = lifecycle::active()?;
    let guard = Guard::enter()?;
    let stack = recorder.stack_of(&guard, caller);
    let has_python = recorder
        .frames_of(stack)
        .iter()
        .any(|&word| matches!(decode(word), FrameWord::Python { .. }));
    has_python.then_some(stack)
}

extern "C" fn launch_thread(launch: *mut c_void) -> *mut c_void {
    // SAFETY: `launch` is the block `pthread_create_body` wrote, given to this thread alone;
    // it is read once and handed back to glibc.
    let Launch {
        start,
        argument,
        creator,
    } = unsafe {
        let taken = launch.cast::<Launch>().read();
        real::__libc_free(launch);
        taken
    };
    if let Some(guard) = Guard::enter() {
        guard.set_thread_creator(creator);
    }
    // Not a tail call: this frame must stay on the thread's stack, where stacks are cut.
    core::hint::black_box(start(argument))
}
