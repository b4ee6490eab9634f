//! Interposed call → guard (page and sampled modes): the range of addresses the page guard
//! reserves at start-up and carves its blocks from, each block at addresses never handed out
//! before. A free of any address inside it is then the page guard's to judge, whether or not
//! it still knows the block: a block freed long ago (out of quarantine, its pages given back)
//! is still inside the range, never glibc's, and never read; a fault on an address already
//! handed out that no block still spans is a touch of such a block. Without the range, a
//! second free of such a block read a malloc header on pages no longer mapped, and the
//! program died of memwarden's read rather than being told of its double free.

use core::ffi::c_void;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::hooks_mmap::kernel_mmap;

/// Addresses reserved without a limit on the address space: a terabyte costs no memory
/// (nothing is mapped in until a block needs it) and lasts for a quarter of a billion blocks
/// of one page.
const RESERVED_UNLIMITED: u64 = 1 << 40;
/// Under an address-space limit, the range takes at most this fraction (one part in N) of
/// the room left, as the profile's mapping does (`address_room`).
const SHARE_OF_ROOM: u64 = 8;
/// Below this, no range is worth reserving: blocks are mapped wherever the kernel puts them.
const SMALLEST_USEFUL: u64 = 64 << 20;

/// The page guard's reserved addresses: `[start, end)`, handed out from `next` upwards.
pub struct GuardRegion {
    start: u64,
    end: u64,
    next: AtomicU64,
}

impl GuardRegion {
    /// Reserves the range (inaccessible, no memory behind it); `None` if the address space
    /// has no room for a useful one.
    pub fn reserve() -> Option<GuardRegion> {
        let wanted = match crate::address_room::left() {
            None => RESERVED_UNLIMITED,
            Some(room) => (room / SHARE_OF_ROOM).min(RESERVED_UNLIMITED),
        };
        let len = wanted & !(crate::hooks::page_size() as u64 - 1);
        if len < SMALLEST_USEFUL {
            return None;
        }
        Self::reserve_bytes(len)
    }

    /// Reserves `len` bytes (a multiple of the page size).
    fn reserve_bytes(len: u64) -> Option<GuardRegion> {
        let start = kernel_mmap(
            core::ptr::null_mut(),
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if start == libc::MAP_FAILED {
            return None;
        }
        let start = start as u64;
        Some(GuardRegion {
            start,
            end: start + len,
            next: AtomicU64::new(start),
        })
    }

    /// Whether `address` lies in the range.
    #[inline(always)]
    pub fn contains(&self, address: u64) -> bool {
        address >= self.start && address < self.end
    }

    /// Whether `address` lies in the part of the range already handed out.
    pub fn handed_out(&self, address: u64) -> bool {
        address >= self.start && address < self.next.load(Ordering::Acquire)
    }

    /// `len` bytes (a multiple of the page size) of addresses never handed out before,
    /// still inaccessible; `None` once the range is used up.
    pub fn take(&self, len: u64) -> Option<u64> {
        let mut next = self.next.load(Ordering::Relaxed);
        loop {
            let after = next.checked_add(len).filter(|&after| after <= self.end)?;
            match self
                .next
                .compare_exchange_weak(next, after, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(next),
                Err(now) => next = now,
            }
        }
    }

    /// Maps fresh, zeroed, writable pages at `[start, start + len)`, addresses taken from
    /// the range; false if the system has no memory for them.
    pub fn open(&self, start: u64, len: u64) -> bool {
        self.remap(start, len, libc::PROT_READ | libc::PROT_WRITE, 0)
    }

    /// Gives the pages of `[start, start + len)` back to the system and makes the addresses
    /// inaccessible again; they stay reserved, never handed out anew.
    pub fn close(&self, start: u64, len: u64) {
        // Should the kernel refuse (no memory for a new mapping entry), the pages stay as
        // they are: only their memory is not returned.
        let _ = self.remap(start, len, libc::PROT_NONE, libc::MAP_NORESERVE);
    }

    fn remap(&self, start: u64, len: u64, protection: i32, extra_flags: i32) -> bool {
        if !(self.contains(start) && start.checked_add(len).is_some_and(|end| end <= self.end)) {
            return false;
        }
        // MAP_FIXED over the guard's own reservation: nothing else can live there.
        let mapped = kernel_mmap(
            start as *mut c_void,
            len as usize,
            protection,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | extra_flags,
            -1,
            0,
        );
        mapped != libc::MAP_FAILED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_handed_out_once_and_stay_reserved_after_their_pages_go_back() {
        let page = crate::hooks::page_size() as u64;
        let region = GuardRegion::reserve_bytes(8 * page).unwrap();
        let first = region.take(3 * page).unwrap();
        let second = region.take(3 * page).unwrap();
        assert_eq!(second, first + 3 * page);
        assert!(region.take(3 * page).is_none(), "only two pages are left");
        assert_eq!(region.take(2 * page), Some(second + 3 * page));
        assert!(region.take(page).is_none());
        assert!(region.contains(first) && region.contains(second + 5 * page - 1));
        assert!(!region.contains(first + 8 * page) && !region.contains(first - 1));

        assert!(region.open(second, page));
        // SAFETY: the page was just mapped writable.
        unsafe {
            *(second as *mut u64) = 7;
            assert_eq!(*(second as *const u64), 7);
        }
        region.close(second, page);
        assert!(region.open(second, page), "reopened: fresh zero pages");
        // SAFETY: mapped writable again.
        assert_eq!(unsafe { *(second as *const u64) }, 0);
        region.close(second, page);
        assert!(
            !region.open(first + 7 * page, 2 * page),
            "past the range's end"
        );
    }
}
