//! Interposed call → event (Python): learns when each code object dies, so that a code
//! object's address names it exactly. CPython frees every code object through one function,
//! `PyCode_Type.tp_dealloc` (the type cannot be subclassed); at start-up, before Python has
//! made any code object, memwarden puts its own function in that slot. It marks the dead
//! code's entry in the code table dead and moves the deaths epoch, then calls CPython's.
//!
//! Without it, a code object freed and another made for other source at the same address
//! could only be told apart by the objects it owns, and those are freed and reused with it:
//! a loop that `exec`s generated functions of one shape, their lines shifted, had a third
//! of its allocations charged to the lines of the function before.

use core::ffi::c_void;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::leak_maps::{read_maps, vma};

/// `offsetof(PyTypeObject, tp_dealloc)`: after the object header (reference count, type,
/// size) come `tp_name`, `tp_basicsize` and `tp_itemsize`. The same in every CPython
/// memwarden reads (3.9 to 3.13, default builds).
const TYPE_DEALLOC: u64 = 48;

type DeallocFn = unsafe extern "C" fn(*mut c_void);

/// CPython's own `code_dealloc` (0 until installed).
// Read by every hook: beside the other such words (lib.rs, "Hot words").
#[link_section = ".data.memwarden_hot"]
static ORIGINAL: AtomicUsize = AtomicUsize::new(0);
/// Code objects freed since start-up (counted once installed).
// Read by every hook: beside the other such words (lib.rs, "Hot words").
#[link_section = ".data.memwarden_hot"]
static DEATHS: AtomicU64 = AtomicU64::new(0);

/// Puts [`code_dealloc`] in `PyCode_Type` (at `code_type`); whether deaths are now seen.
/// Called once, from the library constructor, before Python runs.
pub fn install(code_type: u64) -> bool {
    let slot = code_type + TYPE_DEALLOC;
    // The type lives in the interpreter's data; should a build ever put it in read-only
    // memory, writing it would kill the program.
    let writable = read_maps().is_some_and(|maps| {
        maps.containing(slot)
            .is_some_and(|m| m.has(vma::READ) && m.has(vma::WRITE))
            && maps.containing(slot + 7).is_some()
    });
    if !writable || !slot.is_multiple_of(8) {
        return false;
    }
    // SAFETY: an aligned word of a live, writable static object (checked above), holding a
    // function pointer that CPython loads for every code object it frees; an aligned
    // 8-byte store is seen whole by any thread loading it.
    let field = unsafe { &*(slot as *const AtomicUsize) };
    let original = field.load(Ordering::Acquire);
    if original == 0 {
        return false;
    }
    ORIGINAL.store(original, Ordering::Release);
    field.store(code_dealloc as *const () as usize, Ordering::Release);
    true
}

/// Whether code deaths are seen (see [`install`]).
#[inline(always)]
pub fn tracked() -> bool {
    ORIGINAL.load(Ordering::Relaxed) != 0
}

/// How many code objects have died: an entry made at one epoch is still the same code
/// object's at the same epoch, since each death moves it before the memory is freed.
#[inline(always)]
pub fn epoch() -> u64 {
    DEATHS.load(Ordering::Acquire)
}

/// Memwarden's `tp_dealloc` for code objects. Runs wherever CPython frees a code object
/// (holding the GIL); allocates nothing and cannot fail.
unsafe extern "C" fn code_dealloc(code: *mut c_void) {
    if let Some(runtime) = crate::python_runtime::runtime() {
        runtime.codes.mark_dead(code as u64);
    }
    // Before the memory can be reused: a thread that reads the epoch after this sees it
    // moved, and one that read it before cannot be running this code object.
    DEATHS.fetch_add(1, Ordering::AcqRel);
    let original = ORIGINAL.load(Ordering::Acquire);
    // SAFETY: `install` stored CPython's own dealloc (non-null) before publishing this
    // function, which is only ever called after that.
    let original = unsafe { core::mem::transmute::<usize, DeallocFn>(original) };
    // SAFETY: CPython's contract for tp_dealloc, passed on unchanged.
    unsafe { original(code) }
}
