//! Event → store: turns one interposed call into its effects — capture the stack, intern
//! it, remember or forget the block, and charge the stack's accounting.

use core::ffi::c_void;
use core::sync::atomic::Ordering;

use memwarden_abi::{degraded_reason, exit_kind, flags, Header, Layout, MAX_DEPTH_LIMIT};

use crate::address_map::{AddressMap, Block, MAX_BLOCK_SIZE};
use crate::config::{Config, FRAME_CAPACITY, STACK_CAPACITY};
use crate::profile_file::{self, clock_ns, Identity, ProfileFile};
use crate::stack_table::StackTable;
use crate::thread_state::Guard;
use crate::{accounting, lifecycle, unwind};

pub struct Recorder {
    pub file: ProfileFile,
    pub stacks: StackTable,
    pub blocks: AddressMap,
    pub config: Config,
}

impl Recorder {
    /// Creates the profile file and the in-memory indexes; Err(errno) on failure.
    pub fn create(config: Config, identity: &Identity) -> Result<Recorder, i32> {
        let layout = Layout::new(
            memwarden_abi::defaults::MODULE_CAPACITY,
            config.numeric[STACK_CAPACITY],
            config.numeric[FRAME_CAPACITY],
        )
        .ok_or(libc::EOVERFLOW)?;
        let fd = profile_file::create_file(&config.output_dir, identity, &layout)?;
        let file = ProfileFile::map(fd, layout)?;
        file.write_header(identity);
        let stacks = StackTable::new().ok_or(libc::ENOMEM)?;
        // SAFETY: the lock_waits counter lives in the header for the life of the process;
        // the leak makes the reference 'static without copying.
        let waits =
            unsafe { &*(file.counter(core::mem::offset_of!(Header, lock_waits)) as *const _) };
        let blocks = AddressMap::new(waits).ok_or(libc::ENOMEM)?;
        // Stack id 0 collects events whose stack could not be stored.
        file.counter(core::mem::offset_of!(Header, stack_count))
            .store(1, Ordering::Relaxed);
        if !file.back(
            layout.stack_offset(0),
            core::mem::size_of::<memwarden_abi::StackRecord>() as u64,
        ) {
            return Err(libc::ENOSPC);
        }
        // SAFETY: record 0 is inside the mapping and not yet shared with other threads.
        unsafe { (*file.stack(0)).published = 1 };
        Ok(Recorder {
            file,
            stacks,
            blocks,
            config,
        })
    }

    /// Records a new block of `size` requested bytes at `block`.
    pub fn record_allocation(&self, guard: &Guard, block: *mut c_void, size: usize) {
        let size = size as u64;
        if size > MAX_BLOCK_SIZE {
            self.file
                .counter(core::mem::offset_of!(Header, untracked_allocations))
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut frames = [0u64; MAX_DEPTH_LIMIT as usize];
        let depth = self.config.max_depth().min(frames.len());
        let captured = unwind::capture(guard, &mut frames[..depth]);
        let stack = self.stacks.intern(&self.file, &frames[..captured]);
        match self.blocks.insert(block as u64, Block { stack, size }) {
            Ok(Some(stale)) => accounting::release(&self.file, stale.stack, stale.size),
            Ok(None) => {}
            Err(()) => {
                lifecycle::degrade(degraded_reason::ADDRESS_MAP_FULL);
                return;
            }
        }
        if !accounting::allocate(&self.file, stack, size) {
            lifecycle::degrade(degraded_reason::COUNTER_OVERFLOW);
        }
    }

    /// Forgets `block` and returns what it was, without charging the release yet.
    pub fn forget(&self, _guard: &Guard, block: *mut c_void) -> Option<Block> {
        self.blocks.remove(block as u64)
    }

    /// Puts back a block forgotten by a `realloc` that then failed.
    pub fn restore(&self, _guard: &Guard, block: *mut c_void, recorded: Block) {
        if self.blocks.insert(block as u64, recorded).is_err() {
            lifecycle::degrade(degraded_reason::ADDRESS_MAP_FULL);
        }
    }

    /// Charges the release of a forgotten block to its stack.
    pub fn charge_release(&self, _guard: &Guard, recorded: Block) {
        accounting::release(&self.file, recorded.stack, recorded.size);
    }

    /// Records how the process ends (exit code or signal) and when.
    pub fn record_end(&self, kind: u32, value: i32) {
        let header = self.file.header();
        // SAFETY: plain stores to header fields of the mapping; a racing second exit just
        // overwrites with its own status, as the process's real end would.
        unsafe {
            core::ptr::write_volatile(core::ptr::addr_of_mut!((*header).exit_value), value);
            core::ptr::write_volatile(core::ptr::addr_of_mut!((*header).exit_kind), kind);
        }
        // SAFETY: written once before tracking starts.
        let start = unsafe { (*header).start_monotonic_ns };
        self.file
            .counter(core::mem::offset_of!(Header, end_time_ns))
            .store(
                clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(start).max(1),
                Ordering::Relaxed,
            );
    }

    /// Flags a main program that defines its own `malloc`: the loader binds calls to it
    /// before this library, so memwarden sees none of them.
    pub fn note_own_malloc(&self) {
        let ours = crate::hooks::malloc as *const () as usize;
        let bound = crate::real::next_symbol_default(c"malloc");
        if bound != 0 && bound != ours {
            self.file
                .counter(core::mem::offset_of!(Header, flags))
                .fetch_or(flags::OWN_MALLOC, Ordering::Relaxed);
            crate::log::say(&[b"the program brings its own malloc; its allocations are not seen"]);
        }
    }
}

/// Records the end of the process if it is being profiled (even degraded).
pub fn record_exit(kind: u32, value: i32) {
    if let Some(recorder) = lifecycle::recorder() {
        recorder.record_end(kind, value);
    }
}

pub const EXIT_CODE: u32 = exit_kind::CODE;
pub const EXIT_SIGNAL: u32 = exit_kind::SIGNAL;
