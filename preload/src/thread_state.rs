//! Interposed call: the per-thread state every hook consults first — the reentrancy guard,
//! the thread's stack bounds and its unwind cache — kept in initial-exec TLS (csrc/).

use core::marker::PhantomData;

extern "C" {
    fn memwarden_thread_slots() -> *mut u64;
}

const SLOT_BUSY: usize = 0;
const SLOT_UNWIND_CACHE: usize = 1;
const SLOT_STACK_TOP: usize = 2;
const SLOT_THREAD_CREATOR: usize = 3;

/// Proof that the calling thread is inside a hook and not yet recording: recording
/// functions take `&Guard`, so an unguarded (reentrant) path cannot call them.
pub struct Guard {
    /// This thread's slots, looked up once per hook.
    slots: *mut u64,
    // Not Send: the guard belongs to the thread that took it.
    _thread_bound: PhantomData<*const ()>,
}

impl Guard {
    /// Takes the guard, or `None` if this thread is already recording (the preload's own
    /// allocations, or libc calls it makes, re-enter the hooks).
    #[inline(always)]
    pub fn enter() -> Option<Guard> {
        // SAFETY: the C side returns this thread's array of MEMWARDEN_THREAD_SLOTS (4) words.
        let slots = unsafe { memwarden_thread_slots() };
        // SAFETY: SLOT_BUSY is below 4; the slot is this thread's own.
        unsafe {
            let busy = slots.add(SLOT_BUSY);
            if *busy != 0 {
                return None;
            }
            *busy = 1;
        }
        Some(Guard {
            slots,
            _thread_bound: PhantomData,
        })
    }

    #[inline(always)]
    fn slot(&self, index: usize) -> *mut u64 {
        // SAFETY: every index used in this module is below MEMWARDEN_THREAD_SLOTS (4).
        unsafe { self.slots.add(index) }
    }

    /// The thread's unwind-cache slot (a pointer, 0 until the cache is made).
    pub fn unwind_cache_slot(&self) -> *mut u64 {
        self.slot(SLOT_UNWIND_CACHE)
    }

    /// The stack that created this thread, when Python code did (see `hooks_thread`).
    pub fn thread_creator(&self) -> Option<u32> {
        // SAFETY: this thread's own slot.
        let stored = unsafe { *self.slot(SLOT_THREAD_CREATOR) };
        stored.checked_sub(1).map(|stack| stack as u32)
    }

    /// Records the stack that created this thread.
    pub fn set_thread_creator(&self, stack: u32) {
        // SAFETY: this thread's own slot.
        unsafe { *self.slot(SLOT_THREAD_CREATOR) = u64::from(stack) + 1 };
    }

    /// One past the highest address of this thread's stack, 0 if unknown.
    pub fn stack_top(&self) -> u64 {
        let cached = self.slot(SLOT_STACK_TOP);
        // SAFETY: this thread's own slot.
        let known = unsafe { *cached };
        if known != 0 {
            return known;
        }
        let top = query_stack_top();
        // SAFETY: this thread's own slot.
        unsafe { *cached = top };
        top
    }
}

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: this thread's own slot, set by `enter`.
        unsafe { *self.slot(SLOT_BUSY) = 0 }
    }
}

/// Asks glibc for the calling thread's stack. It may allocate (it reads /proc/self/maps for
/// the main thread); that is safe here because the caller holds the guard, so those
/// allocations pass through unrecorded.
fn query_stack_top() -> u64 {
    // SAFETY: pthread_attr_t is plain data that pthread_getattr_np initializes; the
    // attribute is destroyed after use; the out-pointers are valid locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return 0;
        }
        let mut low: *mut libc::c_void = core::ptr::null_mut();
        let mut size: usize = 0;
        let status = libc::pthread_attr_getstack(&attr, &mut low, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if status != 0 {
            return 0;
        }
        (low as u64).saturating_add(size as u64)
    }
}

extern "C" {
    /// glibc (2.32+): non-zero until the process creates its first thread.
    static __libc_single_threaded: libc::c_char;
}

/// True while no second thread has ever existed. Only this thread could create one, and it
/// is inside a hook, so the answer holds for the whole event.
#[inline(always)]
pub fn single_threaded() -> bool {
    // SAFETY: a byte glibc exports for exactly this purpose; read-only here.
    unsafe { core::ptr::read_volatile(&raw const __libc_single_threaded) != 0 }
}
