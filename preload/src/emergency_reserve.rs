//! The preload's own heap, when glibc's is out: a fixed reserve that serves memwarden's
//! allocations after glibc refuses one.
//!
//! A program can run out of memory under the preload where memwarden needs a little more of
//! its own: a thread's first walk makes its rule caches (8 KiB each), a new stack grows a
//! memo. Under `ulimit -v` set by the program itself (the shell's `ulimit` before `exec`),
//! glibc refuses once the address space is used up. Rust's answer to a refused allocation is
//! to abort, which would kill the program for memwarden's sake. Instead the allocator stops
//! tracking (`lifecycle::degrade`) and takes the block from here, so the hook in flight
//! finishes and the program goes on untracked. The reserve only grows: its blocks are never
//! given back, and after tracking stops little more is asked of it.

use core::alloc::Layout;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::own_regions;

/// Enough for every rule cache of a few walks in flight at once, with room to spare.
const RESERVE_BYTES: usize = 1 << 20;

#[repr(C, align(4096))]
struct Reserve(UnsafeCell<[u8; RESERVE_BYTES]>);

// SAFETY: bytes are handed out once each, by an atomic bump of `USED`, so no two callers
// ever get the same byte; the reserve itself is never read or written here.
unsafe impl Sync for Reserve {}

/// Zero-initialized, so it sits in `.bss`: mapped with the library (before any limit the
/// program sets) and given pages only where touched.
static RESERVE: Reserve = Reserve(UnsafeCell::new([0; RESERVE_BYTES]));
/// Bytes of the reserve handed out so far.
static USED: AtomicUsize = AtomicUsize::new(0);

/// A block of `layout` from the reserve, or null when the reserve cannot hold it. Its bytes
/// are zero: the reserve starts zeroed and no byte is handed out twice.
pub fn take(layout: Layout) -> *mut u8 {
    let base = RESERVE.0.get() as usize;
    let mut used = USED.load(Ordering::Relaxed);
    loop {
        let Some((offset, end)) = place(base, used, layout) else {
            return core::ptr::null_mut();
        };
        match USED.compare_exchange_weak(used, end, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => {
                if used == 0 {
                    // The reserve may now hold copies of stack words: the leak check must not
                    // take it for the program's roots.
                    own_regions::note(base as *const u8, RESERVE_BYTES);
                }
                return (base + offset) as *mut u8;
            }
            Err(now) => used = now,
        }
    }
}

/// Whether `block` was taken from the reserve (and so must never reach glibc's `free`).
pub fn holds(block: *const u8) -> bool {
    let base = RESERVE.0.get() as usize;
    (base..base + RESERVE_BYTES).contains(&(block as usize))
}

/// Where a block of `layout` goes in a reserve at `base` of which `used` bytes are taken:
/// its offset and the new `used`, or `None` if it does not fit.
fn place(base: usize, used: usize, layout: Layout) -> Option<(usize, usize)> {
    let start = base
        .checked_add(used)?
        .checked_next_multiple_of(layout.align())?;
    let offset = start - base;
    let end = offset.checked_add(layout.size().max(1))?;
    (end <= RESERVE_BYTES).then_some((offset, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn blocks_are_aligned_from_the_reserve_base_and_follow_each_other() {
        assert_eq!(place(4096, 0, layout(100, 16)), Some((0, 100)));
        assert_eq!(place(4096, 100, layout(8, 16)), Some((112, 120)));
        assert_eq!(place(4096, 120, layout(1, 1)), Some((120, 121)));
        // An empty block still takes a byte, so no two blocks share an address.
        assert_eq!(place(4096, 121, layout(0, 1)), Some((121, 122)));
    }

    #[test]
    fn a_block_that_does_not_fit_or_overflows_is_refused() {
        assert_eq!(
            place(4096, RESERVE_BYTES - 8, layout(8, 8)),
            Some((RESERVE_BYTES - 8, RESERVE_BYTES))
        );
        assert_eq!(place(4096, RESERVE_BYTES - 8, layout(9, 8)), None);
        assert_eq!(place(usize::MAX - 2, 1, layout(8, 8)), None);
        assert_eq!(place(4096, 0, layout(RESERVE_BYTES + 1, 1)), None);
    }

    #[test]
    fn taken_blocks_are_zeroed_distinct_and_held() {
        let first = take(layout(64, 16));
        let second = take(layout(64, 16));
        assert!(!first.is_null() && !second.is_null());
        assert_ne!(first, second);
        assert!(holds(first) && holds(second));
        assert_eq!(first as usize % 16, 0);
        // SAFETY: `first` is 64 bytes of the reserve, handed to this test alone.
        let bytes = unsafe { core::slice::from_raw_parts(first, 64) };
        assert!(bytes.iter().all(|&b| b == 0));
        let on_the_stack = 0u8;
        assert!(!holds(&on_the_stack));
    }
}
