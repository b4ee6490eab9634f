//! Store (bookkeeping for the leak check): the anonymous memory memwarden itself maps — its
//! indexes, its scratch space, and its own heap blocks large enough for glibc to give them
//! mappings of their own. The leak check must not take this memory for the program's roots:
//! memwarden's caches hold copies of stack words, which would make leaked blocks look
//! reachable. A fixed table of address ranges, lock-free, allocation-free.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Ranges the table can hold; one more is not recorded (and said once).
const SLOTS: usize = 512;
/// memwarden's own heap blocks from this size up are noted: glibc never gives a smaller
/// block a mapping of its own (its mmap threshold is at least 128 KiB).
pub const LARGE_OWN_BLOCK: usize = 64 << 10;

static STARTS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static ENDS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static FULL: AtomicBool = AtomicBool::new(false);

/// Notes `[start, start + len)` as memwarden's own memory.
pub fn note(start: *const u8, len: usize) {
    let start = start as u64;
    if start == 0 || len == 0 {
        return;
    }
    for (slot_start, slot_end) in STARTS.iter().zip(ENDS.iter()) {
        if slot_start
            .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            slot_end.store(start.saturating_add(len as u64), Ordering::Release);
            return;
        }
    }
    FULL.store(true, Ordering::Relaxed);
}

/// Forgets the range that starts at `start` (memory given back).
pub fn forget(start: *const u8) {
    let start = start as u64;
    if start == 0 {
        return;
    }
    for (slot_start, slot_end) in STARTS.iter().zip(ENDS.iter()) {
        if slot_start.load(Ordering::Acquire) == start {
            slot_end.store(0, Ordering::Release);
            slot_start.store(0, Ordering::Release);
            return;
        }
    }
}

/// Calls `each(start, end)` for every range noted now.
pub fn for_each(mut each: impl FnMut(u64, u64)) {
    for (slot_start, slot_end) in STARTS.iter().zip(ENDS.iter()) {
        let start = slot_start.load(Ordering::Acquire);
        let end = slot_end.load(Ordering::Acquire);
        if start != 0 && end > start {
            each(start, end);
        }
    }
}

/// True if some range could not be noted: memwarden's memory may then act as a root, so
/// the leak check could understate leaks (never overstate them).
pub fn overflowed() -> bool {
    FULL.load(Ordering::Relaxed)
}

/// A private anonymous mapping of `len` bytes (reserved, not committed), noted as memwarden's.
pub fn map_scratch(len: usize) -> Option<*mut u8> {
    let start = reserve(len)?;
    note(start, len);
    Some(start)
}

/// `len` bytes of fresh private anonymous memory, reserved, not committed.
fn reserve(len: usize) -> Option<*mut u8> {
    // Straight to the kernel, not through the interposed mmap: this is memwarden's memory.
    let start = crate::hooks_mmap::kernel_mmap(
        core::ptr::null_mut(),
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        -1,
        0,
    );
    (start != libc::MAP_FAILED).then_some(start.cast())
}

/// Size and alignment of a transparent huge page on x86-64.
const HUGE_PAGE: usize = 2 << 20;

/// A zero-filled table of `len` bytes read at random (a hash index), noted as memwarden's:
/// a mapping aligned to 2 MiB that asks for transparent huge pages. Its first touches then
/// cost a page fault per 2 MiB rather than one (or two, read then written) per 4 KiB page,
/// which was most of the page faults the preload added to a Python start, and its lookups
/// miss the TLB less. Without huge pages (the kernel's setting, fragmented memory) it is as
/// `map_scratch` gives it; so it is, unaligned, when the 2 MiB more that aligning it takes
/// for a moment are refused (a tight `ulimit -v`).
pub fn map_table(len: usize) -> Option<*mut u8> {
    let errno = crate::real::SavedErrno::save();
    let table = map_aligned(len).or_else(|| reserve(len));
    if let Some(start) = table {
        note(start, len);
        // SAFETY: advice on the mapping just made, which nothing uses yet; a refusal
        // changes nothing.
        unsafe { libc::madvise(start.cast(), len, libc::MADV_HUGEPAGE) };
    }
    errno.restore();
    table
}

/// `len` bytes of fresh anonymous memory starting at a multiple of 2 MiB: more is mapped,
/// then the ends are given back (kernels before 6.7 align only what they choose to).
fn map_aligned(len: usize) -> Option<*mut u8> {
    let reserved = len.checked_add(HUGE_PAGE)?;
    let mapped = reserve(reserved)? as usize;
    let start = mapped.next_multiple_of(HUGE_PAGE);
    let head = start - mapped;
    let tail = reserved - head - len;
    for (at, bytes) in [(mapped, head), (start + len, tail)] {
        if bytes != 0 {
            // SAFETY: a part of the mapping just made that the table does not use. A
            // failure leaves it mapped and unused, which costs address space only.
            unsafe { libc::syscall(libc::SYS_munmap, at, bytes) };
        }
    }
    Some(start as *mut u8)
}

/// Gives back a mapping from [`map_scratch`].
pub fn unmap_scratch(start: *mut u8, len: usize) {
    forget(start);
    // SAFETY: `start` and `len` describe a mapping made by `map_scratch`, no longer used.
    unsafe { libc::munmap(start.cast(), len) };
}

/// A zero-filled array of `T` in a scratch mapping of its own, given back when dropped.
pub struct ScratchArray<T: Copy> {
    start: *mut T,
    capacity: usize,
    bytes: usize,
}

impl<T: Copy> ScratchArray<T> {
    /// Room for `capacity` elements (reserved, committed as touched); `None` if the kernel
    /// refuses.
    pub fn new(capacity: usize) -> Option<ScratchArray<T>> {
        let bytes = capacity
            .max(1)
            .checked_mul(core::mem::size_of::<T>())?
            .checked_next_multiple_of(4096)?;
        let start = map_scratch(bytes)?;
        Some(ScratchArray {
            start: start.cast(),
            capacity,
            bytes,
        })
    }

    /// The whole array (zero-filled until written; every `T` used here is plain data for
    /// which all-zero bytes are a valid value).
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: the mapping holds `capacity` elements, is aligned to a page (enough for
        // any T used here), zero-filled, and owned by this value alone.
        unsafe { core::slice::from_raw_parts_mut(self.start, self.capacity) }
    }

    pub fn as_slice(&self) -> &[T] {
        // SAFETY: as `as_mut_slice`, shared.
        unsafe { core::slice::from_raw_parts(self.start, self.capacity) }
    }

    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.start
    }
}

impl<T: Copy> Drop for ScratchArray<T> {
    fn drop(&mut self) {
        unmap_scratch(self.start.cast(), self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_starts_on_a_huge_page_and_is_zero_filled_and_writable() {
        for len in [256 << 10, HUGE_PAGE, 2 * HUGE_PAGE] {
            let table = map_table(len).expect("mapped");
            assert_eq!(table as usize % HUGE_PAGE, 0, "{len} bytes");
            // SAFETY: `len` bytes mapped read-write just above, used by nothing else.
            let bytes = unsafe { core::slice::from_raw_parts_mut(table, len) };
            assert!(bytes.iter().step_by(4096).all(|&b| b == 0));
            bytes[len - 1] = 7;
            bytes[0] = 7;
            unmap_scratch(table, len);
        }
    }
}
