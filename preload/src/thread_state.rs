//! Interposed call: the per-thread state every hook consults first — the reentrancy guard,
//! the thread's stack bounds and its unwind cache — kept in initial-exec TLS (csrc/).

use core::marker::PhantomData;
use core::sync::atomic::{AtomicU64, Ordering};

extern "C" {
    fn memwarden_thread_slots() -> *mut u64;
}

const SLOT_BUSY: usize = 0;
const SLOT_UNWIND_CACHE: usize = 1;
const SLOT_STACK_TOP: usize = 2;
const SLOT_THREAD_CREATOR: usize = 3;
const SLOT_OWN_STACK: usize = 4;

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
        // SAFETY: the C side returns this thread's array of MEMWARDEN_THREAD_SLOTS (5) words.
        let slots = unsafe { memwarden_thread_slots() };
        // SAFETY: SLOT_BUSY is below 5; the slot is this thread's own.
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
        // SAFETY: every index used in this module is below MEMWARDEN_THREAD_SLOTS (5).
        unsafe { self.slots.add(index) }
    }

    /// The thread's unwind-cache slot (a pointer, 0 until the cache is made).
    #[inline(always)]
    pub fn unwind_cache_slot(&self) -> *mut u64 {
        self.slot(SLOT_UNWIND_CACHE)
    }

    /// The thread's own-stack slot: the top of its slice of `own_stack`'s region, 0 until
    /// claimed.
    pub fn own_stack_slot(&self) -> *mut u64 {
        self.slot(SLOT_OWN_STACK)
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

    /// One past the highest address of this thread's stack that unwinding may read, 0 if
    /// unknown; `sp` is a stack pointer of the calling thread's current frame.
    pub fn stack_top(&self, sp: u64) -> u64 {
        let cached = self.slot(SLOT_STACK_TOP);
        // SAFETY: this thread's own slot.
        let known = unsafe { *cached };
        // A top below `sp` was found on another stack (a coroutine's, say, whose block lies
        // elsewhere): found again from here.
        if known > sp {
            return known;
        }
        let top = query_stack_top(sp);
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

/// The top of the calling thread's stack, found without asking glibc: its
/// `pthread_getattr_np` takes the thread's own lock and then allocates, so a hook entered from
/// inside it (Rust's runtime calls it as every thread starts) would wait on that lock forever.
///
/// glibc places a thread's control block (what `pthread_self` returns) at the top of the
/// block it runs on, above the thread's static TLS and its stack, so for every thread but the
/// main one the words from `sp` up to it are the thread's own stack and TLS, all readable. The
/// main thread's control block lies elsewhere (below its stack); its stack ends where the
/// kernel put `argc`, which the loader records in `__libc_stack_end`.
fn query_stack_top(sp: u64) -> u64 {
    // SAFETY: pthread_self has no preconditions.
    let control_block = unsafe { libc::pthread_self() } as u64;
    if control_block > sp {
        return control_block;
    }
    // SAFETY: a word the loader writes before any library runs, and never changes.
    let main_stack_end = unsafe { core::ptr::read_volatile(&raw const __libc_stack_end) } as u64;
    // SAFETY: gettid and getpid have no preconditions.
    let main_thread = unsafe { libc::gettid() == libc::getpid() };
    // Another thread on a stack above its control block (a coroutine's) gets no top: its
    // stacks end there rather than reading across what lies between.
    if main_thread && sp < main_stack_end {
        main_stack_end
    } else {
        0
    }
}

extern "C" {
    /// The loader's: where the main thread's stack began at start-up (its `argc`).
    static __libc_stack_end: *const libc::c_void;
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

/// `counter.fetch_add(amount)`, wrapping, but without a locked instruction while the
/// process has one thread (no other thread can race then): for counters every allocation
/// moves. Returns the value before.
#[inline(always)]
pub fn fetch_add_unshared(counter: &AtomicU64, amount: u64) -> u64 {
    if single_threaded() {
        let before = counter.load(Ordering::Relaxed);
        counter.store(before.wrapping_add(amount), Ordering::Relaxed);
        before
    } else {
        counter.fetch_add(amount, Ordering::Relaxed)
    }
}
