//! Interposed call (Python): CPython's arena allocator. pymalloc serves every object under
//! 512 bytes from arenas (1 MiB mappings since 3.10, 256 KiB before) that it asks of a
//! replaceable arena allocator (`PyObject_SetArenaAllocator`), from which CPython 3.11+ also
//! takes the 16 KiB-and-up chunks of each thread's frame stack. memwarden's passes each call
//! on to the allocator it replaced and charges every arena to one stack of its own, whose
//! only frame is the `PYMALLOC_ARENAS` marker. The memory of Python's small objects is then
//! in the peak and in what was not freed, as one figure rather than by line: an arena is
//! opened by whichever object found the others full, and charging a megabyte to that line
//! would misplace it (`memwarden run --python-objects` gives each object its line).
//!
//! The allocator is replaced at start-up, before the interpreter is initialized, so that
//! every arena pymalloc ever frees passed through memwarden's `alloc` first. Should one not
//! have (another tool replacing the allocator in between), the bytes released never exceed
//! the bytes charged.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use memwarden_abi::python::PYMALLOC_ARENAS;
use memwarden_abi::UNKNOWN_STACK_ID;

use crate::lifecycle;
use crate::real::{self, SavedErrno};
use crate::recorder::Recorder;
use crate::thread_state::Guard;

type ArenaAllocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type ArenaFreeFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize);
type ArenaAllocatorFn = unsafe extern "C" fn(*mut ArenaAllocator);
type IsInitializedFn = unsafe extern "C" fn() -> c_int;

/// CPython's `PyObjectArenaAllocator` (the same since 3.4).
#[repr(C)]
struct ArenaAllocator {
    context: *mut c_void,
    alloc: Option<ArenaAllocFn>,
    free: Option<ArenaFreeFn>,
}

/// The allocator memwarden's passes calls on to: its context and functions, set once
/// before memwarden's is installed.
static REPLACED_CONTEXT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static REPLACED_ALLOC: AtomicUsize = AtomicUsize::new(0);
static REPLACED_FREE: AtomicUsize = AtomicUsize::new(0);
/// The stack every arena is charged to.
static ARENA_STACK: AtomicU32 = AtomicU32::new(UNKNOWN_STACK_ID);
/// Bytes of arenas charged and not yet released.
static CHARGED: AtomicU64 = AtomicU64::new(0);

/// Replaces the arena allocator of this process's CPython, if there is one and its
/// interpreter has not started yet. Called from the library constructor, holding the
/// guard (`dlsym` may allocate).
pub fn install(recorder: &Recorder) {
    let get = real::global_symbol(c"PyObject_GetArenaAllocator");
    let set = real::global_symbol(c"PyObject_SetArenaAllocator");
    let initialized = real::global_symbol(c"Py_IsInitialized");
    if get == 0 || set == 0 || initialized == 0 {
        return;
    }
    // SAFETY: the addresses are CPython's functions of these names and C signatures.
    let (get, set, initialized) = unsafe {
        (
            core::mem::transmute::<usize, ArenaAllocatorFn>(get),
            core::mem::transmute::<usize, ArenaAllocatorFn>(set),
            core::mem::transmute::<usize, IsInitializedFn>(initialized),
        )
    };
    // SAFETY: Py_IsInitialized only reads a flag, and may be called at any time.
    if unsafe { initialized() } != 0 {
        // Arenas exist already, from the allocator that would be replaced.
        return;
    }
    let mut replaced = ArenaAllocator {
        context: core::ptr::null_mut(),
        alloc: None,
        free: None,
    };
    // SAFETY: copies CPython's current allocator into a struct of its layout.
    unsafe { get(&mut replaced) };
    let (Some(alloc), Some(free)) = (replaced.alloc, replaced.free) else {
        return;
    };
    let stack = recorder.intern(&[PYMALLOC_ARENAS]);
    if stack == UNKNOWN_STACK_ID {
        return;
    }
    ARENA_STACK.store(stack, Ordering::Relaxed);
    REPLACED_CONTEXT.store(replaced.context, Ordering::Relaxed);
    REPLACED_ALLOC.store(alloc as usize, Ordering::Relaxed);
    REPLACED_FREE.store(free as usize, Ordering::Release);
    let mut ours = ArenaAllocator {
        context: core::ptr::null_mut(),
        alloc: Some(arena_alloc),
        free: Some(arena_free),
    };
    // SAFETY: CPython copies the struct; no Python code runs yet, so no arena is being
    // made meanwhile.
    unsafe { set(&mut ours) };
}

/// The replaced allocator's functions and context (set before memwarden's was installed,
/// which is the only way these are called).
fn replaced() -> (ArenaAllocFn, ArenaFreeFn, *mut c_void) {
    let free = REPLACED_FREE.load(Ordering::Acquire);
    let alloc = REPLACED_ALLOC.load(Ordering::Relaxed);
    // SAFETY: both were stored from non-null function pointers of these types by `install`
    // before it installed the functions that call this.
    unsafe {
        (
            core::mem::transmute::<usize, ArenaAllocFn>(alloc),
            core::mem::transmute::<usize, ArenaFreeFn>(free),
            REPLACED_CONTEXT.load(Ordering::Relaxed),
        )
    }
}

/// memwarden's `alloc`: the replaced allocator's arena, charged to the arenas' stack.
unsafe extern "C" fn arena_alloc(_context: *mut c_void, size: usize) -> *mut c_void {
    let (alloc, _, context) = replaced();
    // SAFETY: the replaced allocator's own function, with its own context.
    let arena = unsafe { alloc(context, size) };
    if !arena.is_null() {
        let errno = SavedErrno::save();
        charge(size as u64);
        errno.restore();
    }
    arena
}

/// memwarden's `free`: releases the arena's charge, then hands it to the replaced allocator.
unsafe extern "C" fn arena_free(_context: *mut c_void, arena: *mut c_void, size: usize) {
    let (_, free, context) = replaced();
    if !arena.is_null() {
        let errno = SavedErrno::save();
        release(size as u64);
        errno.restore();
    }
    // SAFETY: an arena of the replaced allocator (memwarden's `alloc` got it from it), given
    // back to it with its own context.
    unsafe { free(context, arena, size) };
}

fn charge(size: u64) {
    let (Some(recorder), Some(_guard)) = (lifecycle::active(), Guard::enter()) else {
        return;
    };
    CHARGED.fetch_add(size, Ordering::Relaxed);
    recorder.charge(ARENA_STACK.load(Ordering::Relaxed), size);
}

fn release(size: u64) {
    let (Some(recorder), Some(guard)) = (lifecycle::active(), Guard::enter()) else {
        return;
    };
    let taken = CHARGED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |charged| {
        charged.checked_sub(size)
    });
    if taken.is_ok() {
        recorder.charge_release(&guard, ARENA_STACK.load(Ordering::Relaxed), size);
    }
}
