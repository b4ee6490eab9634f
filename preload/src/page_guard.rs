//! Interposed call → event: the page guards (`--guard page`, and `--guard sampled` for the
//! blocks it samples). A guarded block gets pages of its own, flush against an inaccessible
//! page (after it, or before it with `--guard-below`), so the faulting instruction itself is
//! caught by the fault handler (`crash.rs`); a freed block's pages are made inaccessible and
//! kept in a bounded quarantine, so a use after free faults too. Sampled mode sends one
//! block in N here, up to a bounded number at a time; the rest go the normal way.

use core::ffi::c_void;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use memwarden_abi::{error_kind, UNKNOWN_STACK_ID};

use crate::address_map::AddressMap;
use crate::guard_header::{first_changed, Family, BACK_PATTERN};
use crate::guard_region::GuardRegion;
use crate::heap_errors::{self, HeapError};
use crate::hooks::page_size;
use crate::quarantine::Quarantine;
use crate::recorder::Recorder;
use crate::thread_state::fetch_add_unshared;

#[path = "page_guard_faults.rs"]
mod faults;

/// One page-guarded block.
struct PageBlock {
    user: u64,
    size: u64,
    map_start: u64,
    map_len: u64,
    alloc_stack: u32,
    free_stack: u32,
    family: Family,
    freed: bool,
}

/// Options of the page guard.
pub struct PageSettings {
    pub below: bool,
    pub align: usize,
    pub fill_alloc: Option<u8>,
    pub quarantine_bytes: u64,
    /// Sampled mode: one block in `sample_rate` (1 in page mode).
    pub sample_rate: u64,
    /// Sampled mode: at most this many guarded blocks at once (live and in quarantine).
    pub max_blocks: usize,
}

pub struct PageGuard {
    settings: PageSettings,
    /// Where blocks are made, while it has room (`None`: no room could be reserved).
    region: Option<GuardRegion>,
    blocks: AddressMap,
    quarantine: Quarantine,
    /// Calls left until the next sampled one (sampled mode).
    calls_left: AtomicU64,
    guarded: AtomicUsize,
    /// The lowest and highest addresses ever handed out outside the region, so most frees
    /// skip the map.
    lowest: AtomicU64,
    highest: AtomicU64,
    waits: &'static AtomicU64,
}

static FULL_SAID: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

// Read by every hook: beside the other such words (lib.rs, "Hot words").
#[link_section = ".data.memwarden_hot"]
static PAGE_GUARD: core::sync::atomic::AtomicPtr<PageGuard> =
    core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());

/// The page guard, in page or sampled mode.
#[inline(always)]
pub fn page_guard() -> Option<&'static PageGuard> {
    // SAFETY: a leaked Box published once and never freed.
    unsafe { PAGE_GUARD.load(Ordering::Acquire).as_ref() }
}

pub fn install(settings: PageSettings, waits: &'static AtomicU64) -> bool {
    let Some((blocks, quarantine)) =
        crate::quarantine::guard_store(settings.quarantine_bytes, waits)
    else {
        return false;
    };
    let guard = PageGuard {
        calls_left: AtomicU64::new(settings.sample_rate.max(1)),
        settings,
        region: GuardRegion::reserve(),
        blocks,
        quarantine,
        guarded: AtomicUsize::new(0),
        lowest: AtomicU64::new(u64::MAX),
        highest: AtomicU64::new(0),
        waits,
    };
    PAGE_GUARD.store(Box::into_raw(Box::new(guard)), Ordering::Release);
    true
}

/// Counts one call: true for every `rate`-th (the rate-th, 2·rate-th… call of the process).
/// It runs on every allocation, so without a division (or, alone, a locked instruction).
/// With threads, exactly one call takes the count from 1 to 0 and puts it back to `rate`;
/// calls counted by other threads meanwhile are forgotten, which a sample does not mind.
#[inline(always)]
fn count_down(left: &AtomicU64, rate: u64) -> bool {
    // Adding 2^64 − 1 takes one away.
    let before = fetch_add_unshared(left, u64::MAX);
    if before != 1 {
        return false;
    }
    left.store(rate, Ordering::Relaxed);
    true
}

fn map_anonymous(len: usize) -> Option<u64> {
    // Straight to the kernel, not through the interposed mmap: this is memwarden's memory.
    let start = crate::hooks_mmap::kernel_mmap(
        core::ptr::null_mut(),
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
        0,
    );
    (start != libc::MAP_FAILED).then_some(start as u64)
}

fn protect(start: u64, len: u64, protection: i32) {
    // SAFETY: the range is one of this guard's own mappings.
    unsafe { libc::mprotect(start as *mut c_void, len as usize, protection) };
}

impl PageGuard {
    /// Whether this allocation goes to a guarded page (always in page mode; one in N, while
    /// the pool has room, in sampled mode).
    #[inline(always)]
    pub fn takes(&self, size: usize) -> bool {
        let room = self.guarded.load(Ordering::Relaxed) < self.settings.max_blocks;
        let rate = self.settings.sample_rate;
        if rate <= 1 {
            if !room {
                crate::log::say_once(
                    &FULL_SAID,
                    &[b"page guard: as many guarded blocks as the kernel's map limit allows; later blocks are not page-guarded"],
                );
            }
            return room;
        }
        count_down(&self.calls_left, rate) && size <= page_size() * 16 && room
    }

    /// Makes a page-guarded block; null if the system has no memory for it.
    pub fn allocate(
        &self,
        size: usize,
        alignment: usize,
        zeroed: bool,
        family: Family,
        stack: u32,
    ) -> *mut c_void {
        let page = page_size() as u64;
        // malloc's 16-byte alignment is kept (programs rely on it: CPython refuses code objects
        // whose bytes are not 2-aligned, SSE code needs 16), so a block whose size is not a
        // multiple of 16 ends up to 15 bytes before the guard page; that slack is filled with
        // a canary and checked at free, so an overflow into it is still reported.
        let alignment = alignment.max(16).max(self.settings.align) as u64;
        let Some(data_len) = (size as u64)
            .checked_add(alignment)
            .and_then(|n| n.checked_next_multiple_of(page))
        else {
            return core::ptr::null_mut();
        };
        let Some(map_start) = self.map_block(data_len) else {
            return core::ptr::null_mut();
        };
        let (user, guard_page) = if self.settings.below {
            (map_start + page, map_start)
        } else {
            let end = map_start + data_len;
            ((end - size as u64) & !(alignment - 1), end)
        };
        if !self.in_region(map_start) {
            protect(guard_page, page, libc::PROT_NONE);
        }
        // SAFETY: the block's data lies in the fresh writable pages; the slack after it (up
        // to the guard page, or the page end below) is filled with the canary pattern.
        unsafe {
            let data_end = if self.settings.below {
                map_start + page + data_len
            } else {
                guard_page
            };
            let tail = user + size as u64;
            core::ptr::write_bytes(tail as *mut u8, BACK_PATTERN, (data_end - tail) as usize);
            if let (Some(fill), false) = (self.settings.fill_alloc, zeroed) {
                core::ptr::write_bytes(user as *mut u8, fill, size);
            }
        }
        let block = Box::new(PageBlock {
            user,
            size: size as u64,
            map_start,
            map_len: data_len + page,
            alloc_stack: stack,
            free_stack: UNKNOWN_STACK_ID,
            family,
            freed: false,
        });
        if !self.in_region(user) {
            self.lowest.fetch_min(user, Ordering::Relaxed);
            self.highest.fetch_max(user, Ordering::Relaxed);
        }
        let record = Box::into_raw(block);
        if self.blocks.insert_raw(user, record as u64).is_err() {
            // No memory left to remember it: the block is given back and the caller falls
            // back to an unguarded one.
            // SAFETY: the record was just made by Box::into_raw and never shared.
            unsafe { drop(Box::from_raw(record)) };
            self.unmap_block(map_start, data_len + page);
            return core::ptr::null_mut();
        }
        self.guarded.fetch_add(1, Ordering::Relaxed);
        user as *mut c_void
    }

    /// Whether `user` may be a page-guarded block (range tests, no lookup).
    #[inline(always)]
    pub fn may_own(&self, user: *mut c_void) -> bool {
        let address = user as u64;
        self.in_region(address)
            || (address >= self.lowest.load(Ordering::Relaxed)
                && address <= self.highest.load(Ordering::Relaxed))
    }

    /// Whether `address` lies in the guard's reserved range.
    #[inline(always)]
    fn in_region(&self, address: u64) -> bool {
        self.region.as_ref().is_some_and(|r| r.contains(address))
    }

    /// The requested size of a page-guarded block, for `malloc_usable_size`.
    pub fn usable_size(&self, user: *mut c_void) -> Option<usize> {
        let record = self.record(user)?;
        // SAFETY: records in the map are live boxes.
        let block = unsafe { &*(record as *const PageBlock) };
        (!block.freed).then_some(block.size as usize)
    }

    /// Whether a free of `user` is the page guard's to judge: a block it holds (live, or
    /// freed and in quarantine) or any address in its range, which glibc never handed out.
    /// Nothing before such an address may be read as a malloc header: a freed block's pages
    /// are inaccessible, and one out of quarantine has none.
    pub fn claims(&self, user: *mut c_void) -> bool {
        self.in_region(user as u64) || self.record(user).is_some()
    }

    /// The raw record of a page-guarded block, live or freed.
    fn record(&self, user: *mut c_void) -> Option<u64> {
        if !self.may_own(user) {
            return None;
        }
        self.blocks.get_raw(user as u64)
    }

    /// Frees a page-guarded block: `None` if `user` is not one; else the (stack, size) to
    /// charge, if it was live.
    pub fn release(
        &self,
        recorder: &Recorder,
        user: *mut c_void,
        family: Family,
        claimed: Option<u64>,
        stack: &dyn Fn() -> u32,
    ) -> Option<Option<(u32, u64)>> {
        if !self.may_own(user) {
            return None;
        }
        let Some(record) = self.blocks.remove_raw(user as u64) else {
            return self.release_unknown(recorder, user, stack);
        };
        // SAFETY: records in the map are live boxes, changed only by the thread that removed
        // them from the map (this one) until reinserted.
        let block = unsafe { &mut *(record as *mut PageBlock) };
        let free_stack = stack();
        let error = |kind, offset| HeapError {
            kind,
            address: user as u64,
            block_size: block.size,
            offset,
            stack: free_stack,
            alloc_stack: block.alloc_stack,
            free_stack: block.free_stack,
        };
        if block.freed {
            heap_errors::report(recorder, &error(error_kind::DOUBLE_FREE, 0));
            let _ = self.blocks.insert_raw(user as u64, record);
            return Some(None);
        }
        let data_end = if self.settings.below {
            block.map_start + block.map_len
        } else {
            block.map_start + block.map_len - page_size() as u64
        };
        let tail = block.user + block.size;
        // SAFETY: the slack between the block's end and the end of its data pages.
        let slack =
            unsafe { core::slice::from_raw_parts(tail as *const u8, (data_end - tail) as usize) };
        if let Some(first) = first_changed(slack, BACK_PATTERN) {
            heap_errors::report(
                recorder,
                &error(
                    error_kind::HEAP_BUFFER_OVERFLOW,
                    (block.size + first as u64) as i64,
                ),
            );
        }
        if block.family != family {
            heap_errors::report(recorder, &error(error_kind::ALLOC_DEALLOC_MISMATCH, 0));
        } else if let Some(claimed) = claimed.filter(|&c| c != block.size) {
            heap_errors::report(recorder, &error(error_kind::SIZE_MISMATCH, claimed as i64));
        }
        block.freed = true;
        block.free_stack = free_stack;
        protect(block.map_start, block.map_len, libc::PROT_NONE);
        let charged = (block.alloc_stack, block.size);
        let _ = self.blocks.insert_raw(user as u64, record);
        self.quarantine
            .keep(user as u64, block.map_len, self.waits, &mut |old, _| {
                self.evict(old)
            });
        Some(Some(charged))
    }

    /// A free of an address that is no block the guard holds: one in its range is an
    /// invalid free (a block freed before and out of quarantine, or not a block's start),
    /// reported without reading it; `None` leaves any other to the other paths.
    fn release_unknown(
        &self,
        recorder: &Recorder,
        user: *mut c_void,
        stack: &dyn Fn() -> u32,
    ) -> Option<Option<(u32, u64)>> {
        let address = user as u64;
        if !self.in_region(address) {
            return None;
        }
        let stack = stack();
        // Inside a block the guard still holds (live, or freed and in quarantine): said as
        // such, with the block's size and stacks. Else a block out of quarantine, or a gap
        // between blocks: no block is known.
        let error = self
            .error_in_block(address, stack, |_, _| Some(error_kind::INVALID_FREE))
            .unwrap_or(HeapError::without_block(
                error_kind::INVALID_FREE,
                address,
                stack,
            ));
        heap_errors::report(recorder, &error);
        Some(None)
    }

    /// Maps a block of `data_len` bytes of data and a page for its guard, inaccessible:
    /// in the region while it has room, else wherever the kernel puts it. Returns the
    /// mapping's start; `None` if the system has no memory for it.
    fn map_block(&self, data_len: u64) -> Option<u64> {
        let page = page_size() as u64;
        let map_len = data_len + page;
        if let Some(region) = &self.region {
            // One page more, left inaccessible on the side away from the guard page, so a
            // neighbour's overflow or underflow never lands in this block's guard page and is
            // taken for an error of this block.
            if let Some(start) = region.take(map_len + page) {
                let (map_start, data_start) = if self.settings.below {
                    (start, start + page)
                } else {
                    (start + page, start + page)
                };
                return region.open(data_start, data_len).then_some(map_start);
            }
        }
        map_anonymous(map_len as usize)
    }

    /// Gives a block's mapping back: in the region its addresses stay reserved.
    fn unmap_block(&self, map_start: u64, map_len: u64) {
        match &self.region {
            Some(region) if region.contains(map_start) => region.close(map_start, map_len),
            // SAFETY: the block's own mapping, made by `map_block`, no longer reachable.
            _ => unsafe {
                libc::munmap(map_start as *mut c_void, map_len as usize);
            },
        }
    }

    /// A freed block leaves quarantine: its pages go back to the system.
    fn evict(&self, user: u64) {
        let Some(record) = self.blocks.remove_raw(user) else {
            return;
        };
        // SAFETY: the record was made by `allocate` with Box::into_raw and is no longer in
        // the map, so this is its last use.
        let block = unsafe { Box::from_raw(record as *mut PageBlock) };
        self.unmap_block(block.map_start, block.map_len);
        self.guarded.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn lock_for_fork(&self) {
        self.quarantine.lock_for_fork(self.waits);
        self.blocks.lock_all();
    }

    pub fn unlock_after_fork(&self) {
        self.blocks.unlock_all();
        self.quarantine.unlock_after_fork();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rate_th_call_is_sampled() {
        let left = AtomicU64::new(3);
        let due: Vec<bool> = (0..9).map(|_| count_down(&left, 3)).collect();
        assert_eq!(
            due,
            [false, false, true, false, false, true, false, false, true]
        );
    }
}
