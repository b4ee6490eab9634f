//! Interposed call → stack: the stack the preload's stack capture runs on. Capturing a stack
//! needs up to about 16 KiB of stack of its own: framehop builds its caches by value on first
//! use, a CFI rule miss evaluates gimli rows of kilobytes, and the Python merge assembles
//! frames in fixed arrays. On the program's stack that crashed threads made with small
//! stacks (16 KiB, as `PTHREAD_STACK_MIN` gives, or a coroutine's) and programs close to their
//! stack limit, which run fine without memwarden. Each thread instead gets a slice of one
//! region the preload reserves, with an inaccessible page below it, and the capture switches
//! to it and back: a few instructions per event.
//!
//! The region is reserved a chunk of 64 slices (4 MiB of address space) at a time, as
//! threads come, so a program under a tight `RLIMIT_AS` pays for the threads it has. Slices
//! are claimed by thread id and never freed one by one: when none is free, those of threads
//! that no longer exist are taken back. A forked child's thread re-owns its slice under its
//! new id. A thread without a slice (the kernel refused a chunk, all 4,096 taken) captures on
//! one emergency stack in the library's own data, one such thread at a time.

use core::ffi::c_void;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::thread_state::Guard;

/// Bytes of one slice, its guard page included.
const SLICE_BYTES: u64 = 64 << 10;
const GUARD_BYTES: u64 = 4096;
/// Slices reserved together.
const CHUNK_SLICES: usize = 64;
const CHUNK_BYTES: u64 = SLICE_BYTES * CHUNK_SLICES as u64;
const CHUNKS: usize = 64;
/// Slices in all: as many threads as can capture stacks at once on their own stacks.
const SLICES: usize = CHUNK_SLICES * CHUNKS;

/// Each chunk's start, 0 until reserved.
static CHUNK_STARTS: [AtomicU64; CHUNKS] = [const { AtomicU64::new(0) }; CHUNKS];
/// The thread id owning each slice, 0 when free.
static OWNERS: [AtomicU32; SLICES] = [const { AtomicU32::new(0) }; SLICES];
/// Where the next search for a free slice starts.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// The stack of threads without a slice, and the lock that gives it to one at a time.
#[repr(C, align(16))]
struct EmergencyStack([u8; SLICE_BYTES as usize]);
static mut EMERGENCY: EmergencyStack = EmergencyStack([0; SLICE_BYTES as usize]);
static EMERGENCY_TAKEN: AtomicU32 = AtomicU32::new(0);
/// Whether the emergency stack was noted as memwarden's own (not a leak-check root).
static EMERGENCY_NOTED: AtomicBool = AtomicBool::new(false);
/// How often a thread waited for the emergency stack (not reported; the lock wants a count).
static EMERGENCY_WAITS: AtomicU64 = AtomicU64::new(0);

/// Runs `work` on this thread's own slice, or on the current stack if it has none.
#[inline]
pub fn on_own_stack<F: FnOnce() -> R, R>(guard: &Guard, work: F) -> R {
    let top = slice_top(guard);
    if top == NO_SLICE {
        let bottom = (&raw const EMERGENCY).cast::<u8>();
        if running_below(bottom as u64 + SLICE_BYTES) {
            // Already on it, and holding its lock.
            return work();
        }
        let _taken = crate::spin::lock(&EMERGENCY_TAKEN, &EMERGENCY_WAITS);
        if !EMERGENCY_NOTED.swap(true, Ordering::Relaxed) {
            // Its words are copies of the program's; they must not keep leaks reachable.
            crate::own_regions::note(bottom, SLICE_BYTES as usize);
        }
        let top = bottom as u64 + SLICE_BYTES;
        // SAFETY: the emergency stack is aligned and unused: whoever holds the lock has it.
        return unsafe { switch_to(top, work) };
    }
    if running_below(top) {
        return work();
    }
    // SAFETY: `top` is the aligned top of this thread's slice, which no frame of this thread
    // uses now (not running on it, checked above).
    unsafe { switch_to(top, work) }
}

/// Runs `work` with the stack pointer at `top`.
///
/// # Safety
/// `top` is the 16-byte-aligned top of a writable stack no live frame uses.
#[inline(always)]
unsafe fn switch_to<F: FnOnce() -> R, R>(top: u64, work: F) -> R {
    let mut call = Call {
        work: Some(work),
        result: MaybeUninit::uninit(),
    };
    // SAFETY: the caller's contract; `enter::<F, R>` matches `call`'s type.
    unsafe { switch_and_call((&raw mut call).cast(), enter::<F, R>, top) };
    // SAFETY: `enter` ran `work` to its end and wrote its result (a panic aborts: no
    // unwinding can leave it half done).
    unsafe { call.result.assume_init() }
}

/// A call to make on the own stack: the work, then its result.
struct Call<F, R> {
    work: Option<F>,
    result: MaybeUninit<R>,
}

/// Runs on the own stack: does the work of the `Call` at `call`.
unsafe extern "C" fn enter<F: FnOnce() -> R, R>(call: *mut c_void) {
    // SAFETY: `on_own_stack` passes its own `Call<F, R>`, alive until this returns.
    let call = unsafe { &mut *call.cast::<Call<F, R>>() };
    if let Some(work) = call.work.take() {
        call.result.write(work());
    }
}

/// Calls `entry(data)` with the stack pointer at `top`, then returns on the caller's stack.
///
/// # Safety
/// `top` is the 16-byte-aligned top of a writable stack no live frame uses.
#[inline(always)]
unsafe fn switch_and_call(data: *mut c_void, entry: unsafe extern "C" fn(*mut c_void), top: u64) {
    // SAFETY: the caller's contract; r12 is callee-saved, so `entry` gives it back intact,
    // and the old stack pointer kept in it is restored before anything touches the stack.
    unsafe {
        core::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {top}",
            "call {entry}",
            "mov rsp, r12",
            top = in(reg) top,
            entry = in(reg) entry,
            in("rdi") data,
            out("r12") _,
            clobber_abi("C"),
        );
    }
}

/// True when the stack pointer lies in the slice whose top is `top`: a capture made while
/// already on it goes on where it is.
#[inline(always)]
fn running_below(top: u64) -> bool {
    let sp: u64;
    // SAFETY: reads the stack pointer; touches no memory and no flags.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    top.wrapping_sub(sp) <= SLICE_BYTES
}

/// What a thread's own-stack slot holds once no slice could be had: it is not asked again.
const NO_SLICE: u64 = 1;

/// The top of this thread's slice (claimed on first use), or [`NO_SLICE`].
#[inline]
fn slice_top(guard: &Guard) -> u64 {
    let slot = guard.own_stack_slot();
    // SAFETY: this thread's own slot.
    let known = unsafe { *slot };
    if known != 0 {
        return known;
    }
    let top = claim_slice();
    // SAFETY: as above.
    unsafe { *slot = top };
    top
}

/// Claims a free slice for the calling thread; its top, or [`NO_SLICE`].
#[cold]
fn claim_slice() -> u64 {
    let tid = this_thread_id();
    let start = NEXT.load(Ordering::Relaxed) as usize;
    let free = (0..SLICES)
        .map(|step| (start + step) % SLICES)
        .find(|&i| take(i, 0, tid))
        .or_else(|| (0..SLICES).find(|&i| reclaim(i, tid)));
    let Some(index) = free else {
        return NO_SLICE;
    };
    let Some(chunk) = chunk(index / CHUNK_SLICES) else {
        OWNERS[index].store(0, Ordering::Release);
        return NO_SLICE;
    };
    NEXT.store(((index + 1) % SLICES) as u32, Ordering::Relaxed);
    let base = chunk + (index % CHUNK_SLICES) as u64 * SLICE_BYTES;
    // SAFETY: the lowest page of this thread's slice, inside the region; made inaccessible
    // again each time (a no-op after the first), so a capture overflowing its slice faults
    // instead of writing into the next.
    unsafe { libc::mprotect(base as *mut c_void, GUARD_BYTES as usize, libc::PROT_NONE) };
    base + SLICE_BYTES
}

/// Takes slice `index` for `tid` if its owner is `from`.
fn take(index: usize, from: u32, tid: u32) -> bool {
    OWNERS[index]
        .compare_exchange(from, tid, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}

/// Takes slice `index` for `tid` if the thread owning it no longer exists.
fn reclaim(index: usize, tid: u32) -> bool {
    let owner = OWNERS[index].load(Ordering::Acquire);
    owner != 0 && !thread_exists(owner) && take(index, owner, tid)
}

/// Whether thread `tid` of this process still exists (a signal 0 only checks).
fn thread_exists(tid: u32) -> bool {
    // SAFETY: signal 0 is never delivered; getpid has no preconditions.
    let status = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) };
    status == 0 || crate::profile_file::last_errno() != libc::ESRCH
}

fn this_thread_id() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// The start of chunk `number`, reserved on first use; `None` if the kernel refused it
/// (asked again by the next thread that needs it).
fn chunk(number: usize) -> Option<u64> {
    let start = CHUNK_STARTS.get(number)?;
    let known = start.load(Ordering::Acquire);
    if known != 0 {
        return Some(known);
    }
    // Address space only: pages are committed as a slice's stack touches them, and the leak
    // check never takes them for the program's roots (`map_scratch` notes them).
    let mapped = crate::own_regions::map_scratch(CHUNK_BYTES as usize)? as u64;
    match start.compare_exchange(0, mapped, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(mapped),
        Err(winner) => {
            // Another thread reserved it first: ours goes back.
            crate::own_regions::unmap_scratch(mapped as *mut u8, CHUNK_BYTES as usize);
            Some(winner)
        }
    }
}

/// Fork (child): the one thread of the child owns its slice under its new thread id; the
/// parent's other threads do not exist here, so their slices are taken back when needed and
/// the emergency stack is free.
pub fn adopt_after_fork(guard: &Guard) {
    // A thread of the parent may have held the emergency stack; none is left to free it.
    crate::spin::unlock_raw(&EMERGENCY_TAKEN);
    let top = {
        let slot = guard.own_stack_slot();
        // SAFETY: this thread's own slot.
        unsafe { *slot }
    };
    if top == 0 || top == NO_SLICE {
        return;
    }
    let base = top - SLICE_BYTES;
    let chunks = CHUNK_STARTS
        .iter()
        .map(|start| start.load(Ordering::Acquire));
    for (number, chunk) in chunks.enumerate() {
        let offset = base.wrapping_sub(chunk);
        if chunk != 0 && offset < CHUNK_BYTES {
            let index = number * CHUNK_SLICES + (offset / SLICE_BYTES) as usize;
            if let Some(owner) = OWNERS.get(index) {
                owner.store(this_thread_id(), Ordering::Release);
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_a_slice_and_returns_its_result() {
        let guard = Guard::enter().expect("no hook is running in a unit test");
        let top = slice_top(&guard);
        assert_ne!(top, 0);
        let (on_slice, value) = on_own_stack(&guard, || (running_below(top), 40 + 2));
        assert!(on_slice);
        assert_eq!(value, 42);
        assert!(!running_below(top));
        // Nested: goes on where it is.
        let nested = on_own_stack(&guard, || on_own_stack(&guard, || running_below(top)));
        assert!(nested);
    }

    #[test]
    fn a_slice_holds_a_deep_call() {
        fn depth(n: u32) -> u64 {
            let pad = core::hint::black_box([n as u64; 64]);
            if n == 0 {
                pad[3]
            } else {
                depth(n - 1) + pad[n as usize % 64]
            }
        }
        let guard = Guard::enter().expect("no hook is running in a unit test");
        // About 22 KiB of frames in a release build (more than a 16 KiB thread stack holds),
        // and within the slice in a debug build too, whose frames are larger.
        assert_eq!(on_own_stack(&guard, || depth(40)), (1..=40).sum::<u64>());
    }

    #[test]
    fn the_emergency_stack_serves_a_thread_without_a_slice() {
        std::thread::spawn(|| {
            let guard = Guard::enter().expect("no hook is running in a unit test");
            // SAFETY: this thread's own slot: it now says no slice could be had.
            unsafe { *guard.own_stack_slot() = NO_SLICE };
            let emergency = (&raw const EMERGENCY) as u64;
            let on_it = || {
                let sp: u64;
                // SAFETY: reads the stack pointer.
                unsafe { core::arch::asm!("mov {}, rsp", out(reg) sp) };
                sp.wrapping_sub(emergency) < SLICE_BYTES
            };
            assert!(on_own_stack(&guard, on_it));
            // Nested: goes on where it is, without waiting for its own lock.
            assert!(on_own_stack(&guard, || on_own_stack(&guard, on_it)));
            assert_eq!(EMERGENCY_TAKEN.load(Ordering::Relaxed), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn slices_of_threads_gone_are_taken_back() {
        let gone = std::thread::spawn(this_thread_id).join().unwrap();
        assert!(!thread_exists(gone));
        assert!(thread_exists(this_thread_id()));
        let index = SLICES - 1;
        assert!(take(index, 0, gone));
        assert!(reclaim(index, this_thread_id()));
        assert_eq!(OWNERS[index].load(Ordering::Relaxed), this_thread_id());
        assert!(take(index, this_thread_id(), 0));
    }
}
