//! Event (guard modes): the set of live blocks, from each block's address to a small value,
//! so a guard can tell a corrupted header from a pointer memwarden never returned, and can
//! check every live block at exit. (Plain profiling needs no such map: the block header
//! carries all it needs.) Open addressing with linear probing and backward-shift deletion,
//! split into shards with a spin lock each; tables live in anonymous mappings, outside the
//! heap being checked.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, AtomicU64};

use crate::spin;
use crate::thread_state::single_threaded;

const SHARD_BITS: u32 = 8;
const SHARDS: usize = 1 << SHARD_BITS;
const INITIAL_SLOT_BITS: u32 = 8;
const SIZE_BITS: u32 = 40;

/// Largest block size the map can hold (1 TiB); larger blocks go untracked.
pub const MAX_BLOCK_SIZE: u64 = (1 << SIZE_BITS) - 1;

/// A live block: the stack that allocated it and its requested size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub stack: u32,
    pub size: u64,
}

impl Block {
    /// The raw word of a block, for `insert_raw` users reading through `for_each`.
    pub fn pack_public(self) -> u64 {
        self.pack()
    }

    fn pack(self) -> u64 {
        (u64::from(self.stack) << SIZE_BITS) | self.size
    }

    fn unpack(word: u64) -> Block {
        Block {
            stack: (word >> SIZE_BITS) as u32,
            size: word & MAX_BLOCK_SIZE,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Slot {
    /// Block address; 0 marks an empty slot (no block lives at address 0).
    address: u64,
    block: u64,
}

struct Table {
    slots: *mut Slot,
    slot_bits: u32,
    used: usize,
}

#[repr(align(64))]
struct Shard {
    lock: AtomicU32,
    table: UnsafeCell<Table>,
}

pub struct AddressMap {
    shards: Box<[Shard]>,
    waits: *const AtomicU64,
}

// SAFETY: each shard's table is only touched while its spin lock is held.
unsafe impl Sync for AddressMap {}
// SAFETY: as above.
unsafe impl Send for AddressMap {}

fn spread(address: u64) -> u64 {
    (address >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn map_slots(slot_bits: u32) -> Option<*mut Slot> {
    let bytes = (1usize << slot_bits) * core::mem::size_of::<Slot>();
    // SAFETY: a fresh private anonymous mapping, zero-filled (all slots empty).
    let slots = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if slots == libc::MAP_FAILED {
        return None;
    }
    crate::own_regions::note(slots.cast(), bytes);
    Some(slots.cast())
}

impl Table {
    fn mask(&self) -> usize {
        (1usize << self.slot_bits) - 1
    }

    fn home(&self, address: u64) -> usize {
        ((spread(address) << SHARD_BITS) >> (64 - self.slot_bits)) as usize
    }

    fn slot(&self, index: usize) -> *mut Slot {
        // SAFETY: callers mask the index with `mask()`, so it is inside the table.
        unsafe { self.slots.add(index) }
    }

    /// Index of `address`, or of the empty slot where it would go.
    fn probe(&self, address: u64) -> usize {
        let mask = self.mask();
        let mut index = self.home(address);
        loop {
            // SAFETY: index is masked; the shard lock is held by the caller.
            let found = unsafe { (*self.slot(index)).address };
            if found == address || found == 0 {
                return index;
            }
            index = (index + 1) & mask;
        }
    }

    fn grow(&mut self) -> bool {
        let bits = self.slot_bits + 1;
        let Some(slots) = map_slots(bits) else {
            return false;
        };
        let old = Table {
            slots: self.slots,
            slot_bits: self.slot_bits,
            used: self.used,
        };
        self.slots = slots;
        self.slot_bits = bits;
        for index in 0..=old.mask() {
            // SAFETY: index within the old table, still mapped until unmapped below.
            let slot = unsafe { *old.slot(index) };
            if slot.address != 0 {
                let at = self.probe(slot.address);
                // SAFETY: `at` is an empty slot of the new table.
                unsafe { *self.slot(at) = slot };
            }
        }
        let bytes = (1usize << old.slot_bits) * core::mem::size_of::<Slot>();
        crate::own_regions::forget(old.slots.cast());
        // SAFETY: the old table was mapped by map_slots with this size and is no longer used.
        unsafe { libc::munmap(old.slots.cast(), bytes) };
        true
    }

    fn remove_at(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut next = hole;
        loop {
            next = (next + 1) & mask;
            // SAFETY: masked indexes; the shard lock is held.
            let slot = unsafe { *self.slot(next) };
            if slot.address == 0 {
                break;
            }
            let home = self.home(slot.address);
            // The entry at `next` may stay where it is if its home lies cyclically in
            // (hole, next]; otherwise it moves back into the hole.
            let stays = if hole <= next {
                hole < home && home <= next
            } else {
                hole < home || home <= next
            };
            if !stays {
                // SAFETY: both indexes masked.
                unsafe { *self.slot(hole) = slot };
                hole = next;
            }
        }
        // SAFETY: masked index.
        unsafe {
            *self.slot(hole) = Slot {
                address: 0,
                block: 0,
            }
        };
        self.used -= 1;
    }
}

impl AddressMap {
    pub fn new(waits: &'static AtomicU64) -> Option<AddressMap> {
        let mut shards = Vec::with_capacity(SHARDS);
        for _ in 0..SHARDS {
            shards.push(Shard {
                lock: AtomicU32::new(0),
                table: UnsafeCell::new(Table {
                    slots: map_slots(INITIAL_SLOT_BITS)?,
                    slot_bits: INITIAL_SLOT_BITS,
                    used: 0,
                }),
            });
        }
        Some(AddressMap {
            shards: shards.into_boxed_slice(),
            waits,
        })
    }

    fn shard(&self, address: u64) -> &Shard {
        &self.shards[(spread(address) >> (64 - SHARD_BITS)) as usize]
    }

    /// A shard's lock; none while the process has one thread (no other thread can race, and
    /// a fork is made by that thread, outside every hook).
    #[inline(always)]
    fn lock<'a>(&self, shard: &'a Shard) -> Option<spin::SpinGuard<'a>> {
        (!single_threaded()).then(|| spin::lock(&shard.lock, self.waits()))
    }

    fn waits(&self) -> &AtomicU64 {
        // SAFETY: points at a header counter of the profile file, mapped for the process's life.
        unsafe { &*self.waits }
    }

    /// Records a new live block. Returns the block that was recorded at the same address
    /// before (freed behind memwarden's back), or `Err` if the map cannot grow.
    pub fn insert(&self, address: u64, block: Block) -> Result<Option<Block>, ()> {
        let shard = self.shard(address);
        let _lock = self.lock(shard);
        // SAFETY: the shard lock is held, so this thread alone uses the table.
        let table = unsafe { &mut *shard.table.get() };
        if (table.used + 1) * 8 > (1usize << table.slot_bits) * 5 && !table.grow() {
            return Err(());
        }
        let index = table.probe(address);
        // SAFETY: `index` comes from probe (masked).
        let slot = unsafe { &mut *table.slot(index) };
        let previous = (slot.address == address).then(|| Block::unpack(slot.block));
        if previous.is_none() {
            table.used += 1;
        }
        *slot = Slot {
            address,
            block: block.pack(),
        };
        Ok(previous)
    }

    /// Records a raw 64-bit value for `address` (callers that keep their own encoding).
    pub fn insert_raw(&self, address: u64, value: u64) -> Result<Option<u64>, ()> {
        self.insert(address, Block::unpack(value))
            .map(|old| old.map(Block::pack))
    }

    /// Forgets `address`, returning its raw value.
    pub fn remove_raw(&self, address: u64) -> Option<u64> {
        self.remove(address).map(Block::pack)
    }

    /// The raw value recorded for `address`, if anything.
    pub fn get_raw(&self, address: u64) -> Option<u64> {
        self.get(address).map(Block::pack)
    }

    /// What is recorded for `address`, if anything.
    pub fn get(&self, address: u64) -> Option<Block> {
        let shard = self.shard(address);
        let _lock = self.lock(shard);
        // SAFETY: the shard lock is held.
        let table = unsafe { &*shard.table.get() };
        let index = table.probe(address);
        // SAFETY: `index` comes from probe.
        let slot = unsafe { *table.slot(index) };
        (slot.address == address).then(|| Block::unpack(slot.block))
    }

    /// Forgets a block, returning what was recorded for it (`None` for a block memwarden
    /// never saw: allocated before tracking began, or while tracking was off).
    pub fn remove(&self, address: u64) -> Option<Block> {
        let shard = self.shard(address);
        let _lock = self.lock(shard);
        // SAFETY: the shard lock is held.
        let table = unsafe { &mut *shard.table.get() };
        let index = table.probe(address);
        // SAFETY: `index` comes from probe.
        let slot = unsafe { *table.slot(index) };
        if slot.address != address {
            return None;
        }
        table.remove_at(index);
        Some(Block::unpack(slot.block))
    }

    /// Takes every shard lock (fork's prepare handler), so no thread is mid-update.
    pub fn lock_all(&self) {
        for shard in self.shards.iter() {
            spin::lock_raw(&shard.lock, self.waits());
        }
    }

    /// Calls `visit` with every recorded address and block, one shard at a time (each shard
    /// locked while it is visited; `visit` must not touch the map).
    pub fn for_each(&self, mut visit: impl FnMut(u64, Block)) {
        for shard in self.shards.iter() {
            let _lock = self.lock(shard);
            // SAFETY: the shard lock is held.
            let table = unsafe { &*shard.table.get() };
            for index in 0..=table.mask() {
                // SAFETY: index within the table.
                let slot = unsafe { *table.slot(index) };
                if slot.address != 0 {
                    visit(slot.address, Block::unpack(slot.block));
                }
            }
        }
    }

    /// Releases every shard lock (after fork, in parent and child).
    pub fn unlock_all(&self) {
        for shard in self.shards.iter() {
            spin::unlock_raw(&shard.lock);
        }
    }
}
