//! Event (header guard): freed blocks kept back from glibc for a while, up to a byte budget,
//! so that a double free still finds the block's header marked freed and a write after free
//! can be seen in its fill pattern. First in, first out; one spin lock.

use core::cell::UnsafeCell;
use core::sync::atomic::AtomicU32;

use crate::spin;

/// Blocks the ring can hold, whatever their size.
const RING_ENTRIES: usize = 1 << 16;

struct Ring {
    /// User pointers and sizes, oldest at `head`.
    entries: *mut [u64; 2],
    head: usize,
    len: usize,
    bytes: u64,
}

pub struct Quarantine {
    lock: AtomicU32,
    ring: UnsafeCell<Ring>,
    limit: u64,
}

// SAFETY: the ring is only touched while `lock` is held.
unsafe impl Sync for Quarantine {}
// SAFETY: as above.
unsafe impl Send for Quarantine {}

/// What every guard keeps: its set of blocks and its quarantine (`None` without memory).
pub fn guard_store(
    quarantine_bytes: u64,
    waits: &'static core::sync::atomic::AtomicU64,
) -> Option<(crate::address_map::AddressMap, Quarantine)> {
    Some((
        crate::address_map::AddressMap::new(waits)?,
        Quarantine::new(quarantine_bytes)?,
    ))
}

impl Quarantine {
    /// A quarantine holding at most `limit` bytes of blocks.
    pub fn new(limit: u64) -> Option<Quarantine> {
        // SAFETY: a fresh private anonymous mapping for the ring.
        let entries = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                RING_ENTRIES * 16,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if entries != libc::MAP_FAILED {
            crate::own_regions::note(entries.cast(), RING_ENTRIES * 16);
        }
        (entries != libc::MAP_FAILED).then(|| Quarantine {
            lock: AtomicU32::new(0),
            ring: UnsafeCell::new(Ring {
                entries: entries.cast(),
                head: 0,
                len: 0,
                bytes: 0,
            }),
            limit,
        })
    }

    /// Keeps the block `user` of `size` bytes, first handing the oldest blocks to `evict`
    /// until it fits. A block larger than the whole budget is evicted at once.
    pub fn keep(
        &self,
        user: u64,
        size: u64,
        waits: &core::sync::atomic::AtomicU64,
        evict: &mut dyn FnMut(u64, u64),
    ) {
        if size > self.limit {
            evict(user, size);
            return;
        }
        let _lock = spin::lock(&self.lock, waits);
        // SAFETY: the lock is held.
        let ring = unsafe { &mut *self.ring.get() };
        while ring.len > 0 && (ring.len == RING_ENTRIES || ring.bytes + size > self.limit) {
            // SAFETY: head < RING_ENTRIES.
            let [old, old_size] = unsafe { *ring.entries.add(ring.head) };
            ring.head = (ring.head + 1) % RING_ENTRIES;
            ring.len -= 1;
            ring.bytes -= old_size;
            evict(old, old_size);
        }
        let tail = (ring.head + ring.len) % RING_ENTRIES;
        // SAFETY: tail < RING_ENTRIES.
        unsafe { *ring.entries.add(tail) = [user, size] };
        ring.len += 1;
        ring.bytes += size;
    }

    /// Fork: held across the fork, so the child finds it free.
    pub fn lock_for_fork(&self, waits: &core::sync::atomic::AtomicU64) {
        spin::lock_raw(&self.lock, waits);
    }

    pub fn unlock_after_fork(&self) {
        spin::unlock_raw(&self.lock);
    }

    /// Hands every block still kept to `visit` (at exit, for a last check).
    pub fn for_each(&self, waits: &core::sync::atomic::AtomicU64, visit: &mut dyn FnMut(u64, u64)) {
        let _lock = spin::lock(&self.lock, waits);
        // SAFETY: the lock is held.
        let ring = unsafe { &*self.ring.get() };
        for index in 0..ring.len {
            // SAFETY: the index is reduced modulo RING_ENTRIES.
            let [user, size] = unsafe { *ring.entries.add((ring.head + index) % RING_ENTRIES) };
            visit(user, size);
        }
    }
}
