//! Interposed call → event: the header-mode heap guard (`--guard header`). Each block gets
//! memwarden's header and a front redzone before it, and a back redzone after it up to the
//! end of glibc's block (the slack of size and alignment rounding included):
//!
//! ```text
//! [ glibc block: padding | header (16) | front redzone (16) | user data (size) | back redzone (≥ 16) ]
//! header: word0 = size (48) | log2(offset) (6) | family (2) | freed (1)
//!         word1 = stack id (24) | check (40), the check binding the pointer and word0
//! ```
//!
//! Redzones are checked when a block is freed or reallocated, every N calls on request and
//! at exit; freed blocks wait in a quarantine, marked freed (and filled, on request), so a
//! double free or a write after free is caught. A set of live blocks tells a corrupted
//! header from a pointer memwarden never returned without reading foreign memory.

use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use memwarden_abi::{error_kind, UNKNOWN_STACK_ID};

use crate::address_map::{AddressMap, Block};
pub use crate::guard_header::Family;
use crate::guard_header::{
    read_header, write_header, BACK_PATTERN, FREED, FRONT_PATTERN, FRONT_REDZONE, GLIBC_LINKS,
    HEADER, LIVE, MIN_BACK_REDZONE, RAW, SIZE_MASK,
};
use crate::heap_errors::{self, HeapError};
use crate::quarantine::Quarantine;
use crate::real;
use crate::recorder::Recorder;

/// Options of the guard, from the environment.
pub struct Settings {
    pub align: usize,
    pub fill_alloc: Option<u8>,
    pub fill_free: Option<u8>,
    pub check_every: u64,
    pub quarantine_bytes: u64,
}

pub struct HeaderGuard {
    pub(crate) settings: Settings,
    pub(crate) live: AddressMap,
    pub(crate) quarantine: Quarantine,
    calls: AtomicU64,
    pub(crate) waits: &'static AtomicU64,
}

static GUARD: AtomicPtr<HeaderGuard> = AtomicPtr::new(core::ptr::null_mut());

/// The header guard, when `--guard header` is on.
#[inline(always)]
pub fn header_guard() -> Option<&'static HeaderGuard> {
    // SAFETY: a leaked Box published once and never freed.
    unsafe { GUARD.load(Ordering::Acquire).as_ref() }
}

/// Turns the header guard on (at start-up, before any tracked allocation).
pub fn install(settings: Settings, waits: &'static AtomicU64) -> bool {
    let Some((live, quarantine)) = crate::quarantine::guard_store(settings.quarantine_bytes, waits)
    else {
        return false;
    };
    let guard = HeaderGuard {
        settings,
        live,
        quarantine,
        calls: AtomicU64::new(0),
        waits,
    };
    GUARD.store(Box::into_raw(Box::new(guard)), Ordering::Release);
    true
}

impl HeaderGuard {
    /// Makes a guarded block of `size` bytes, aligned to `alignment` (a power of two), from
    /// `stack`; null if glibc has no memory (or the sizes overflow).
    pub fn allocate(
        &self,
        size: usize,
        alignment: usize,
        zeroed: bool,
        family: Family,
        stack: u32,
    ) -> *mut c_void {
        let alignment = alignment.max(self.settings.align).max(16);
        // 16 bytes stay free before the header: glibc writes its free-list links there once
        // the block is freed, so the header (and its freed mark) outlives the free.
        let offset = (GLIBC_LINKS + HEADER + FRONT_REDZONE).next_multiple_of(alignment);
        let Some(total) = size
            .checked_add(offset)
            .and_then(|t| t.checked_add(MIN_BACK_REDZONE))
        else {
            real::set_errno(libc::ENOMEM);
            return core::ptr::null_mut();
        };
        if size as u64 > SIZE_MASK {
            real::set_errno(libc::ENOMEM);
            return core::ptr::null_mut();
        }
        // SAFETY: glibc's allocator with a power-of-two alignment and a checked size.
        let base = unsafe {
            match (alignment > 16, zeroed) {
                (false, false) => real::__libc_malloc(total),
                (false, true) => real::__libc_calloc(1, total),
                (true, _) => real::__libc_memalign(alignment, total),
            }
        };
        if base.is_null() {
            return base;
        }
        // The back redzone is the MIN_BACK_REDZONE bytes asked for beyond the data; the
        // slack of rounding the data's size up lies inside it. (Not asking glibc for its
        // usable size keeps a call off every allocation and free.)
        let usable = total;
        let user = base as u64 + offset as u64;
        // SAFETY: the glibc block holds `total` bytes from `base`; the header, redzones and
        // user data all lie inside it.
        unsafe {
            write_header(user, size as u64, offset, family, false, stack);
            core::ptr::write_bytes(
                (user as usize - FRONT_REDZONE) as *mut u8,
                FRONT_PATTERN,
                FRONT_REDZONE,
            );
            let back = user as usize + size;
            core::ptr::write_bytes(back as *mut u8, BACK_PATTERN, base as usize + usable - back);
            if zeroed && alignment > 16 {
                core::ptr::write_bytes(user as *mut u8, 0, size);
            } else if let (Some(fill), false) = (self.settings.fill_alloc, zeroed) {
                core::ptr::write_bytes(user as *mut u8, fill, size);
            }
        }
        if self
            .live
            .insert(
                user,
                Block {
                    stack: LIVE,
                    size: 0,
                },
            )
            .is_err()
        {
            crate::lifecycle::degrade(memwarden_abi::degraded_reason::ADDRESS_MAP_FULL);
        }
        user as *mut c_void
    }

    /// Remembers a block made outside the guard (while re-entered), so its free is not taken
    /// for an invalid one.
    pub fn note_raw(&self, block: *mut c_void) {
        if !block.is_null() {
            let _ = self.live.insert(
                block as u64,
                Block {
                    stack: RAW,
                    size: 0,
                },
            );
        }
    }

    /// Counts an allocation call; true when `--check-every` asks for a full check now.
    pub fn check_due(&self) -> bool {
        let every = self.settings.check_every;
        every > 0 && (self.calls.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(every)
    }

    /// The requested size of a block memwarden made, for `malloc_usable_size`.
    pub fn usable_size(&self, user: *mut c_void) -> Option<usize> {
        // SAFETY: only read after the live set vouches for the block.
        self.is_live(user as u64)
            .then(|| unsafe { read_header(user as u64) }.map(|g| g.size as usize))?
    }

    /// Whether `block` was made outside the guard (while re-entered).
    pub fn is_raw(&self, block: *mut c_void) -> bool {
        self.live
            .get(block as u64)
            .is_some_and(|found| found.stack == RAW)
    }

    /// Drops `block` from the live set.
    pub fn forget(&self, block: *mut c_void) {
        self.live.remove(block as u64);
    }

    /// Frees a block without checks (called while re-entered): a raw block goes to glibc, a
    /// guarded one to glibc from its real start.
    pub fn release_quietly(&self, block: *mut c_void) {
        match self.live.remove(block as u64).map(|b| b.stack) {
            // SAFETY: a live guarded block: its header gives glibc's block start.
            Some(LIVE) => {
                if let Some(guarded) = unsafe { read_header(block as u64) } {
                    // SAFETY: the glibc block it was carved from.
                    unsafe { real::__libc_free(guarded.base) };
                }
            }
            Some(FREED) => {
                let _ = self.live.insert(
                    block as u64,
                    Block {
                        stack: FREED,
                        size: 0,
                    },
                );
            }
            // SAFETY: a glibc block.
            _ => unsafe { real::__libc_free(block) },
        }
    }

    fn is_live(&self, user: u64) -> bool {
        self.live.get(user).is_some_and(|block| block.stack == LIVE)
    }

    /// Frees `user` as `family` says, checking it first. `claimed` is the size a sized
    /// deallocation passed; `stack` finds where it was freed (only used when needed).
    /// Returns the charged (stack, size) for accounting, if the block was a live one.
    pub fn release(
        &self,
        recorder: &Recorder,
        user: *mut c_void,
        family: Family,
        claimed: Option<u64>,
        stack: &dyn Fn() -> u32,
    ) -> Option<(u32, u64)> {
        let address = user as u64;
        let quarantining = self.settings.quarantine_bytes > 0;
        // One lookup: a live block becomes freed (kept in quarantine) or is forgotten.
        let previous = self.live.update(address, |block| match block.stack {
            LIVE if quarantining => Some(Block {
                stack: FREED,
                size: 0,
            }),
            FREED => Some(block),
            _ => None,
        });
        match previous.map(|b| b.stack) {
            Some(RAW) => {
                // SAFETY: a glibc block made while memwarden was re-entered.
                unsafe { real::__libc_free(user) };
                None
            }
            Some(FREED) => {
                self.report_double_free(recorder, address, stack());
                None
            }
            Some(_) => self.release_live(recorder, user, family, claimed, stack),
            None => {
                // Not a block memwarden holds: freed already (its header, which glibc leaves
                // alone, still says so), made before start-up, or never returned at all.
                // SAFETY: the bytes before the pointer are read as glibc's own free would.
                if unsafe { read_header(address) }.is_some_and(|block| block.freed) {
                    self.report_double_free(recorder, address, stack());
                } else if crate::preinit::contains(address) {
                    // SAFETY: a glibc block allocated before memwarden started.
                    unsafe { real::__libc_free(user) };
                } else {
                    self.report_invalid_free(recorder, address, stack());
                }
                None
            }
        }
    }

    fn report_double_free(&self, recorder: &Recorder, address: u64, stack: u32) {
        // SAFETY: a freed block whose header is memwarden's (checked by the caller or by
        // the live set).
        let header = unsafe { read_header(address) };
        let (block_size, alloc_stack) = header.map_or((0, UNKNOWN_STACK_ID), |g| (g.size, g.stack));
        heap_errors::report(
            recorder,
            &HeapError {
                kind: error_kind::DOUBLE_FREE,
                address,
                block_size,
                offset: 0,
                stack,
                alloc_stack,
                free_stack: free_stack_of(address),
            },
        );
    }

    fn report_invalid_free(&self, recorder: &Recorder, address: u64, stack: u32) {
        // The inside of a live block, if it is one: said as such.
        let (block_size, offset, alloc_stack) = self
            .containing(address)
            .map_or((0, 0, UNKNOWN_STACK_ID), |(user, block)| {
                (block.size, (address - user) as i64, block.stack)
            });
        heap_errors::report(
            recorder,
            &HeapError {
                kind: error_kind::INVALID_FREE,
                address,
                block_size,
                offset,
                stack,
                alloc_stack,
                free_stack: UNKNOWN_STACK_ID,
            },
        );
    }

    fn release_live(
        &self,
        recorder: &Recorder,
        user: *mut c_void,
        family: Family,
        claimed: Option<u64>,
        stack: &dyn Fn() -> u32,
    ) -> Option<(u32, u64)> {
        let address = user as u64;
        // SAFETY: the live set vouched for the block, so its header bytes are readable.
        let Some(block) = (unsafe { read_header(address) }) else {
            // The header itself was overwritten: an underflow deeper than the front redzone.
            // The block cannot be freed safely; it is left as it is.
            heap_errors::report(
                recorder,
                &HeapError {
                    kind: error_kind::HEAP_BUFFER_UNDERFLOW,
                    address: address - (FRONT_REDZONE + HEADER) as u64,
                    block_size: 0,
                    offset: -((FRONT_REDZONE + HEADER) as i64),
                    stack: stack(),
                    alloc_stack: UNKNOWN_STACK_ID,
                    free_stack: UNKNOWN_STACK_ID,
                },
            );
            return None;
        };
        let free_stack = stack();
        self.check_redzones(recorder, address, &block, free_stack);
        let error = |kind, offset| HeapError {
            kind,
            address,
            block_size: block.size,
            offset,
            stack: free_stack,
            alloc_stack: block.stack,
            free_stack: UNKNOWN_STACK_ID,
        };
        if block.family != family {
            heap_errors::report(recorder, &error(error_kind::ALLOC_DEALLOC_MISMATCH, 0));
        }
        // A size is only worth checking with the right deallocation function.
        if let Some(claimed) = claimed.filter(|&c| c != block.size && block.family == family) {
            heap_errors::report(recorder, &error(error_kind::SIZE_MISMATCH, claimed as i64));
        }
        let size = block.size;
        // SAFETY: the block is memwarden's and live; its header is rewritten as freed, the
        // free stack kept in the front redzone, the data filled on request.
        unsafe {
            let offset = address - block.base as u64;
            write_header(
                address,
                size,
                offset as usize,
                block.family,
                true,
                block.stack,
            );
            ((address as usize - FRONT_REDZONE) as *mut u32).write_unaligned(free_stack);
            if let Some(fill) = self.settings.fill_free {
                core::ptr::write_bytes(user.cast::<u8>(), fill, size as usize);
            }
        }
        let _ = self.live.insert(
            address,
            Block {
                stack: FREED,
                size: 0,
            },
        );
        self.quarantine
            .keep(address, size, self.waits, &mut |old, old_size| {
                self.evict(recorder, old, old_size)
            });
        Some((block.stack, size))
    }

    /// A block leaves quarantine: its fill pattern is checked, then glibc gets it back.
    fn evict(&self, recorder: &Recorder, user: u64, size: u64) {
        self.check_freed(recorder, user, size);
        self.live.remove(user);
        // SAFETY: a quarantined block: memwarden's header gives glibc's block start.
        if let Some(block) = unsafe { read_header(user) } {
            // SAFETY: the glibc block this guarded block was carved from.
            unsafe { real::__libc_free(block.base) };
        }
    }

    /// Fork: every lock held, so the child finds none held by a thread it does not have.
    pub fn lock_for_fork(&self) {
        self.quarantine.lock_for_fork(self.waits);
        self.live.lock_all();
    }

    pub fn unlock_after_fork(&self) {
        self.live.unlock_all();
        self.quarantine.unlock_after_fork();
    }
}

/// The free stack kept in a freed block's front redzone.
pub(crate) fn free_stack_of(user: u64) -> u32 {
    // SAFETY: only called for blocks in quarantine, whose front redzone is memwarden's.
    unsafe { ((user as usize - FRONT_REDZONE) as *const u32).read_unaligned() }
}
