//! Store: the short spin locks that order updates to one stack record or one address-map
//! shard. Critical sections are a few dozen instructions, so spinning beats a futex; a
//! waiter yields the CPU after a while in case the holder was preempted.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const SPINS_BEFORE_YIELD: u32 = 64;

/// Holds the lock word until dropped.
pub struct SpinGuard<'a> {
    word: &'a AtomicU32,
}

/// Locks `word`, counting in `waits` each acquisition that had to wait (the contention figure).
#[inline]
pub fn lock<'a>(word: &'a AtomicU32, waits: &AtomicU64) -> SpinGuard<'a> {
    if word
        .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        lock_contended(word, waits);
    }
    SpinGuard { word }
}

#[cold]
#[inline(never)]
fn lock_contended(word: &AtomicU32, waits: &AtomicU64) {
    waits.fetch_add(1, Ordering::Relaxed);
    let mut spins = 0u32;
    loop {
        while word.load(Ordering::Relaxed) != 0 {
            spins += 1;
            if spins >= SPINS_BEFORE_YIELD {
                spins = 0;
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            } else {
                core::hint::spin_loop();
            }
        }
        if word
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// Locks `word` without a guard object (fork's prepare handler holds many at once).
pub fn lock_raw(word: &AtomicU32, waits: &AtomicU64) {
    core::mem::forget(lock(word, waits));
}

/// Releases a lock taken with [`lock_raw`], or resets a lock whose holder no longer exists
/// (in a forked child, only the forking thread survives).
pub fn unlock_raw(word: &AtomicU32) {
    word.store(0, Ordering::Release);
}

impl Drop for SpinGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.word.store(0, Ordering::Release);
    }
}
