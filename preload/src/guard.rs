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
//! double free or a write after free is caught. A bit per possible block start
//! ([`BlockStarts`]) tells memwarden's blocks from pointers it never returned without
//! reading foreign memory; blocks glibc made while memwarden was re-entered (no header)
//! are kept in a small map of their own.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use memwarden_abi::{error_kind, UNKNOWN_STACK_ID};

use crate::address_map::{AddressMap, Block};
use crate::block_starts::BlockStarts;
pub use crate::guard_header::Family;
use crate::guard_header::{
    mark_freed, read_header, write_header, Guarded, BACK_PATTERN, FRONT_PATTERN, FRONT_REDZONE,
    GLIBC_LINKS, HEADER, MIN_BACK_REDZONE, SIZE_MASK,
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
    /// Where memwarden's blocks start, live or in quarantine (their headers say which).
    pub(crate) starts: &'static BlockStarts,
    /// Blocks glibc made while memwarden was re-entered: they have no header.
    raw: AddressMap,
    pub(crate) quarantine: Quarantine,
    calls: AtomicU64,
    pub(crate) waits: &'static AtomicU64,
    /// Set once a block could not be marked in `starts` (no memory for its leaf): from
    /// then on a genuine live header is taken as the block's own word.
    unmarked: AtomicBool,
}

// Read by every hook: beside the other such words (lib.rs, "Hot words").
#[link_section = ".data.memwarden_hot"]
static GUARD: AtomicPtr<HeaderGuard> = AtomicPtr::new(core::ptr::null_mut());
static STARTS: BlockStarts = BlockStarts::new();
static UNMARKED_SAID: AtomicBool = AtomicBool::new(false);

/// The header guard, when `--guard header` is on.
#[inline(always)]
pub fn header_guard() -> Option<&'static HeaderGuard> {
    // SAFETY: a leaked Box published once and never freed.
    unsafe { GUARD.load(Ordering::Acquire).as_ref() }
}

/// Turns the header guard on (at start-up, before any tracked allocation).
pub fn install(settings: Settings, waits: &'static AtomicU64) -> bool {
    let Some((raw, quarantine)) = crate::quarantine::guard_store(settings.quarantine_bytes, waits)
    else {
        return false;
    };
    let guard = HeaderGuard {
        settings,
        starts: &STARTS,
        raw,
        quarantine,
        calls: AtomicU64::new(0),
        waits,
        unmarked: AtomicBool::new(false),
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
        if !self.starts.insert(user) {
            self.unmarked.store(true, Ordering::Release);
            crate::log::say_once(
                &UNMARKED_SAID,
                &[b"guard: no memory for the map of block starts; blocks are known by their headers alone from now on"],
            );
        }
        user as *mut c_void
    }

    /// Remembers a block made outside the guard (while re-entered), so its free is not taken
    /// for an invalid one.
    pub fn note_raw(&self, block: *mut c_void) {
        if !block.is_null() {
            let _ = self.raw.insert(block as u64, Block { stack: 0, size: 0 });
        }
    }

    /// Counts an allocation call; true when `--check-every` asks for a full check now.
    pub fn check_due(&self) -> bool {
        let every = self.settings.check_every;
        every > 0 && (self.calls.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(every)
    }

    /// The requested size of a block memwarden made, for `malloc_usable_size`.
    pub fn usable_size(&self, user: *mut c_void) -> Option<usize> {
        self.live_block(user as u64)
            .map(|block| block.size as usize)
    }

    /// The header of `user` if it is one of memwarden's blocks and not freed.
    pub(crate) fn live_block(&self, user: u64) -> Option<Guarded> {
        self.is_guarded(user)
            // SAFETY: a guarded block's header lies inside its glibc block.
            .then(|| unsafe { read_header(user) })?
            .filter(|block| !block.freed)
    }

    /// Whether `user` is one of memwarden's blocks (live or in quarantine).
    #[inline(always)]
    fn is_guarded(&self, user: u64) -> bool {
        self.starts.contains(user)
            || (self.unmarked.load(Ordering::Acquire)
                // SAFETY: read as glibc's own free would read the bytes before the pointer.
                && unsafe { read_header(user) }.is_some_and(|block| !block.freed))
    }

    /// Whether `block` was made outside the guard (while re-entered).
    pub fn is_raw(&self, block: *mut c_void) -> bool {
        self.raw.get(block as u64).is_some()
    }

    /// Forgets a block made outside the guard (glibc resized or freed it).
    pub fn forget(&self, block: *mut c_void) {
        self.raw.remove(block as u64);
    }

    /// Frees a block without checks (called while re-entered): a live guarded block goes to
    /// glibc from its real start, one in quarantine stays there, anything else goes to glibc.
    pub fn release_quietly(&self, block: *mut c_void) {
        let address = block as u64;
        if self.is_guarded(address) {
            // SAFETY: a guarded block's header lies inside its glibc block.
            if let Some(guarded) = unsafe { read_header(address) }.filter(|g| !g.freed) {
                // SAFETY: as above; the block is live until marked freed here.
                if unsafe { mark_freed(address, &guarded) } {
                    self.give_back(address, guarded.base);
                }
            }
            return;
        }
        self.raw.remove(address);
        // SAFETY: a glibc block.
        unsafe { real::__libc_free(block) };
    }

    /// Hands a guarded block, marked freed and out of quarantine, back to glibc.
    fn give_back(&self, user: u64, base: *mut c_void) {
        self.starts.remove(user);
        // SAFETY: the glibc block the guarded block was carved from; nothing else holds it.
        unsafe { real::__libc_free(base) };
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
        if self.is_guarded(address) {
            // SAFETY: a guarded block's header lies inside its glibc block.
            return match unsafe { read_header(address) } {
                Some(block) if block.freed => {
                    self.report_double_free(recorder, address, stack());
                    None
                }
                Some(block) => self.release_live(recorder, user, block, family, claimed, stack),
                None => {
                    self.report_broken_header(recorder, address, stack());
                    None
                }
            };
        }
        if self.raw.remove(address).is_some() {
            // SAFETY: a glibc block made while memwarden was re-entered.
            unsafe { real::__libc_free(user) };
            return None;
        }
        // Not a block memwarden holds: freed already (its header, which glibc leaves alone
        // until it reuses the memory, still says so), made before start-up, or never
        // returned at all.
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

    /// The header of a guarded block was overwritten: an underflow deeper than the front
    /// redzone. The block cannot be freed safely; it is left as it is.
    fn report_broken_header(&self, recorder: &Recorder, address: u64, stack: u32) {
        heap_errors::report(
            recorder,
            &HeapError {
                offset: -((FRONT_REDZONE + HEADER) as i64),
                ..HeapError::without_block(
                    error_kind::HEAP_BUFFER_UNDERFLOW,
                    address - (FRONT_REDZONE + HEADER) as u64,
                    stack,
                )
            },
        );
    }

    fn report_double_free(&self, recorder: &Recorder, address: u64, stack: u32) {
        // SAFETY: a block whose header the caller found marked freed (or that is marked as
        // memwarden's in the block starts).
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
        block: Guarded,
        family: Family,
        claimed: Option<u64>,
        stack: &dyn Fn() -> u32,
    ) -> Option<(u32, u64)> {
        let address = user as u64;
        // SAFETY: a guarded block (its header was just read).
        if !unsafe { mark_freed(address, &block) } {
            // Another thread's free of the same block came first.
            self.report_double_free(recorder, address, stack());
            return None;
        }
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
        // SAFETY: the block is memwarden's and now marked freed by this call: the free stack
        // is kept in its front redzone, its data filled on request.
        unsafe {
            ((address as usize - FRONT_REDZONE) as *mut u32).write_unaligned(free_stack);
            if let Some(fill) = self.settings.fill_free {
                core::ptr::write_bytes(user.cast::<u8>(), fill, size as usize);
            }
        }
        if self.settings.quarantine_bytes == 0 {
            self.give_back(address, block.base);
        } else {
            self.quarantine
                .keep(address, size, self.waits, &mut |old, old_size| {
                    self.evict(recorder, old, old_size)
                });
        }
        Some((block.stack, size))
    }

    /// A block leaves quarantine: its fill pattern is checked, then glibc gets it back.
    fn evict(&self, recorder: &Recorder, user: u64, size: u64) {
        self.check_freed(recorder, user, size);
        // SAFETY: a quarantined block: memwarden's header gives glibc's block start.
        if let Some(block) = unsafe { read_header(user) } {
            self.give_back(user, block.base);
        }
    }

    /// Fork: every lock held, so the child finds none held by a thread it does not have.
    pub fn lock_for_fork(&self) {
        self.quarantine.lock_for_fork(self.waits);
        self.raw.lock_all();
    }

    pub fn unlock_after_fork(&self) {
        self.raw.unlock_all();
        self.quarantine.unlock_after_fork();
    }
}

/// The free stack kept in a freed block's front redzone.
pub(crate) fn free_stack_of(user: u64) -> u32 {
    // SAFETY: only called for blocks in quarantine, whose front redzone is memwarden's.
    unsafe { ((user as usize - FRONT_REDZONE) as *const u32).read_unaligned() }
}
