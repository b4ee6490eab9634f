//! Interposed call → event (guard modes): the blocks glibc handed out before memwarden
//! started. They carry no header; a guard must still let the program free them rather than
//! report an invalid free. A fixed list, filled without locks, searched only on the slow path.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const CAPACITY: usize = 4096;

static BLOCKS: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Remembers a block allocated before start-up (beyond the capacity, it is forgotten: a later
/// free of it would be reported as invalid under a guard).
pub fn note(block: *mut core::ffi::c_void) {
    if block.is_null() {
        return;
    }
    let index = COUNT.fetch_add(1, Ordering::Relaxed);
    if index < CAPACITY {
        BLOCKS[index].store(block as u64, Ordering::Release);
    }
}

/// Follows a block that start-up code moved (`realloc`): the list holds `moved` instead of
/// `block` (noted anew if `block` was not in it), or drops `block` if it was freed (`moved`
/// null). A guard would otherwise take the block's later free, or `realloc`, for invalid:
/// libraries' constructors that run before memwarden's grow their tables so.
pub fn moved(block: *mut core::ffi::c_void, moved: *mut core::ffi::c_void) {
    let count = COUNT.load(Ordering::Acquire).min(CAPACITY);
    let old = block as u64;
    let held = BLOCKS[..count].iter().find(|b| {
        b.compare_exchange(old, moved as u64, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    if held.is_none() {
        note(moved);
    }
}

/// Whether `address` was handed out before start-up.
pub fn contains(address: u64) -> bool {
    let count = COUNT.load(Ordering::Acquire).min(CAPACITY);
    BLOCKS[..count]
        .iter()
        .any(|b| b.load(Ordering::Acquire) == address)
}
