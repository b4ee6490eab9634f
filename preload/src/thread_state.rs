//! Interposed call: the per-thread state every hook consults first — the reentrancy guard,
//! the thread's stack bounds and its unwind cache — kept in initial-exec TLS (csrc/).

use core::marker::PhantomData;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::readable_span::{readable_pages, Span, PAGE};

extern "C" {
    fn memwarden_thread_slots() -> *mut u64;
}

const SLOT_BUSY: usize = 0;
const SLOT_UNWIND_CACHE: usize = 1;
const SLOT_STACK_TOP: usize = 2;
const SLOT_THREAD_CREATOR: usize = 3;
const SLOT_OWN_STACK: usize = 4;
/// The lowest page of the thread's own stack shown readable up to `SLOT_STACK_TOP`.
const SLOT_STACK_LOW: usize = 5;
/// A stack the thread ran on apart from its own (a coroutine's): its readable span.
const SLOT_OTHER_LOW: usize = 6;
const SLOT_OTHER_TOP: usize = 7;
/// The slots (csrc/thread_slots.c: MEMWARDEN_THREAD_SLOTS).
const SLOTS: usize = 8;
/// How far up from a stack pointer a stack whose top is not known is read at most: the
/// default stack size of a thread.
const OTHER_STACK_REACH: u64 = 8 << 20;

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
        // SAFETY: the C side returns this thread's array of MEMWARDEN_THREAD_SLOTS (SLOTS)
        // words.
        let slots = unsafe { memwarden_thread_slots() };
        // SAFETY: SLOT_BUSY is below SLOTS; the slot is this thread's own.
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
        debug_assert!(index < SLOTS);
        // SAFETY: every index used in this module is below MEMWARDEN_THREAD_SLOTS (SLOTS).
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

    /// One past the highest address of the stack the calling thread runs on that unwinding
    /// may read, 0 if none; `sp` is a stack pointer of the calling thread's current frame.
    /// Every page from `sp`'s up to it can be read (the kernel said so once, and stacks in
    /// use stay mapped).
    #[inline(always)]
    pub fn stack_top(&self, sp: u64) -> u64 {
        // SAFETY: this thread's own slots.
        let (low, top) = unsafe { (*self.slot(SLOT_STACK_LOW), *self.slot(SLOT_STACK_TOP)) };
        if low <= sp && sp < top {
            return top;
        }
        // SAFETY: as above.
        let (other_low, other_top) =
            unsafe { (*self.slot(SLOT_OTHER_LOW), *self.slot(SLOT_OTHER_TOP)) };
        if other_low <= sp && sp < other_top {
            return other_top;
        }
        self.find_stack_top(sp)
    }

    /// `stack_top` for a stack pointer outside the spans known readable: the thread's own
    /// stack grown deeper, its first capture, or another stack. The thread's own top
    /// (`query_stack_top`) is kept only once every page up to it is shown readable;
    /// otherwise the span ends at the first page that is not (a coroutine's stack mapped
    /// apart, below the thread's own, has a gap or a guard page above it). Where the
    /// kernel cannot be asked, the own top is taken on trust, as before such checks.
    #[cold]
    #[inline(never)]
    fn find_stack_top(&self, sp: u64) -> u64 {
        let page = sp & !(PAGE - 1);
        let own_top = query_stack_top(sp);
        // SAFETY: this thread's own slots.
        let (low, top) = unsafe { (*self.slot(SLOT_STACK_LOW), *self.slot(SLOT_STACK_TOP)) };
        if own_top > sp {
            // Only what lies below the part already shown readable is asked about.
            let ask_up_to = if own_top == top && sp < low {
                low
            } else {
                own_top
            };
            let reach = ask_up_to.min(page.saturating_add(OTHER_STACK_REACH));
            let low = match readable_pages(page, reach) {
                Span::Readable if reach == ask_up_to => page,
                // Cannot be checked: taken on trust, for every stack pointer below it.
                Span::Unknown => 0,
                // Readable only as far as asked, or not all readable.
                readable => return self.other_stack(page, readable, reach),
            };
            // SAFETY: as above.
            unsafe {
                *self.slot(SLOT_STACK_LOW) = low;
                *self.slot(SLOT_STACK_TOP) = own_top;
            }
            return own_top;
        }
        let reach = page.saturating_add(OTHER_STACK_REACH);
        self.other_stack(page, readable_pages(page, reach), reach)
    }

    /// Remembers and returns the readable span from `page` on a stack that is not the
    /// thread's own (or not all of it readable): up to the first page `readable` says
    /// cannot be read, or to `reach`; 0 (no reads) if the kernel cannot say.
    fn other_stack(&self, page: u64, readable: Span, reach: u64) -> u64 {
        let top = match readable {
            Span::Readable => reach,
            Span::StopsAt(unreadable) => unreadable,
            Span::Unknown => return 0,
        };
        // SAFETY: this thread's own slots.
        unsafe {
            *self.slot(SLOT_OTHER_LOW) = page;
            *self.slot(SLOT_OTHER_TOP) = top;
        }
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
/// main one the words from `sp` up to it are the thread's own stack and TLS when `sp` is on
/// that stack. The main thread's control block lies elsewhere (below its stack); its stack
/// ends where the kernel put `argc`, which the loader records in `__libc_stack_end`. A
/// stack pointer on another stack below that top gets the same answer, across whatever lies
/// between: `Guard::find_stack_top` checks the span before trusting it.
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
    // Another thread on a stack above its control block (a coroutine's) gets no top here:
    // `Guard::find_stack_top` reads up from `sp` as far as the pages can be read.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `pages` fresh readable pages, the one at `guard_at` made unreadable.
    fn stack_with_guard_page(pages: u64, guard_at: u64) -> u64 {
        let bytes = (pages * PAGE) as usize;
        // SAFETY: a fresh anonymous mapping, then a page of it protected; nothing else uses
        // it.
        unsafe {
            let start = libc::mmap(
                core::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(start, libc::MAP_FAILED);
            let guard = start.cast::<u8>().add((guard_at * PAGE) as usize);
            assert_eq!(
                libc::mprotect(guard.cast(), PAGE as usize, libc::PROT_NONE),
                0
            );
            start as u64
        }
    }

    #[test]
    fn the_threads_own_stack_reaches_its_top_and_is_asked_about_once() {
        let guard = Guard::enter().expect("not inside a hook");
        let local = 0u64;
        let sp = &raw const local as u64;
        let top = guard.stack_top(sp);
        assert!(top > sp);
        assert_eq!(top, query_stack_top(sp));
        // SAFETY: this thread's own slots.
        let low = unsafe { *guard.slot(SLOT_STACK_LOW) };
        assert_eq!(low, sp & !(PAGE - 1));
        assert_eq!(guard.stack_top(sp + 8), top);
    }

    #[test]
    fn a_stack_mapped_apart_ends_at_the_guard_page_above_it_and_is_remembered() {
        let guard = Guard::enter().expect("not inside a hook");
        let start = stack_with_guard_page(12, 9);
        let sp = start + 3 * PAGE + 40;
        let expected = start + 9 * PAGE;
        assert_eq!(guard.stack_top(sp), expected);
        // SAFETY: this thread's own slots.
        let (low, top) = unsafe { (*guard.slot(SLOT_OTHER_LOW), *guard.slot(SLOT_OTHER_TOP)) };
        assert_eq!((low, top), (start + 3 * PAGE, expected));
        assert_eq!(guard.stack_top(sp + PAGE), expected);
        // The thread's own stack keeps its own top.
        let local = 0u64;
        let own = &raw const local as u64;
        assert_eq!(guard.stack_top(own), query_stack_top(own));
    }
}
