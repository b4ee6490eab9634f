//! Event → store: turns one interposed call into its effects — capture the stack, intern
//! it, and charge the stack's accounting.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memwarden_abi::python::{category, NUMPY_DATA};
use memwarden_abi::{degraded_reason, exit_kind, flags, Header, Layout};

use crate::config::{Config, FRAME_CAPACITY, LEAK_CHECK, STACK_CAPACITY};
use crate::profile_file::{self, clock_ns, Identity, ProfileFile};
use crate::stack_table::StackTable;
use crate::thread_state::Guard;
use crate::unwind::Caller;
use crate::walk_limit::WalkLimit;
use crate::{
    accounting, address_room, lifecycle, own_stack, python_native_cut, python_runtime,
    python_stack, unwind,
};

pub struct Recorder {
    pub file: ProfileFile,
    pub stacks: StackTable,
    pub config: Config,
}

impl Recorder {
    /// Creates the profile file and the in-memory indexes; Err(errno) on failure.
    pub fn create(config: Config, identity: &Identity) -> Result<Recorder, i32> {
        let full = layout_for(&config, 0).ok_or(libc::EOVERFLOW)?;
        let first = shrink_within_file_limit(&config)?;
        let first = match address_room::left() {
            Some(room) => address_room::shrink_for_room(room, first..=MAX_SHRINK, |shrink| {
                layout_for(&config, shrink).map(|layout| layout.file_size)
            }),
            None => first,
        };
        let layout = layout_for(&config, first).ok_or(libc::EOVERFLOW)?;
        let fd = profile_file::create_file(&config.output_dir, identity, &layout)?;
        let mapped = map_within_address_space(fd, &config, first, identity);
        // SAFETY: closes the fd opened above: the mapping keeps the file, and backing it
        // opens it again by its path (`profile_fd`).
        unsafe { libc::close(fd) };
        let (file, shrink) = match mapped {
            Ok(mapped) => mapped,
            Err(errno) => {
                profile_file::remove_file(&config.output_dir, identity);
                return Err(errno);
            }
        };
        if shrink > 0 {
            say_capacity(file.layout().stack_capacity, full.stack_capacity);
        }
        let layout = *file.layout();
        file.write_header(identity);
        let stacks = StackTable::new(layout.stack_capacity).ok_or(libc::ENOMEM)?;
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
            config,
        })
    }

    /// The id of the caller's stack (captured and interned), with the thread's Python
    /// frames put in where it runs Python, and the caller's marker first.
    ///
    /// A stack met before (the memos' hits, nearly every allocation of a loop) is found on
    /// the caller's own stack, in a few hundred bytes of it. The work that needs kilobytes
    /// — a walk, interning, the merge with Python frames, a thread's first tables — moves
    /// to the thread's own stack where it is done (`own_stack`). Switching for every
    /// allocation cost the switch itself and the own stack's lines, written anew each time
    /// after the program had pushed them out of the caches.
    pub fn stack_of(&self, guard: &Guard, caller: Caller) -> u32 {
        let native = match unwind::remembered_stack(guard, caller) {
            unwind::Remembered::Stack(native) => native,
            unwind::Remembered::Missed(missed) => self.walked(guard, caller, Some(missed)),
            unwind::Remembered::Unknown => self.walked(guard, caller, None),
        };
        if caller.marker == 0 && python_runtime::runtime().is_none() {
            return native;
        }
        let marker = (caller.marker != 0).then_some(caller.marker);
        let stack = python_stack::with_python_frames(self, guard, native, marker);
        if caller.marker == NUMPY_DATA {
            self.set_category(stack, category::NUMPY);
        }
        stack
    }

    /// The caller's native stack when the memo did not have it (`missed`: what it said):
    /// walked, cut below Python as the merge will, and interned. Out of line, with what a
    /// walk needs, so that a memo hit builds none of it; on the thread's own stack, since
    /// the walk's frames before its own switch take more than a kilobyte.
    #[cold]
    #[inline(never)]
    fn walked(&self, guard: &Guard, caller: Caller, missed: Option<unwind::Missed>) -> u32 {
        own_stack::on_own_stack(guard, || self.walk(guard, caller, missed))
    }

    /// [`Recorder::walked`]'s work, on the thread's own stack.
    #[inline(never)]
    fn walk(&self, guard: &Guard, caller: Caller, missed: Option<unwind::Missed>) -> u32 {
        let depth = self.config.max_depth();
        let below_python = python_runtime::runtime()
            .map(|runtime| python_native_cut::BelowPython::new(runtime, guard, caller.sp));
        let intern = |frames: &[u64]| match &below_python {
            Some(below) => {
                python_native_cut::interned_cut(below, frames, depth, |kept| self.intern(kept))
            }
            None => self.intern(frames),
        };
        let limit = WalkLimit::new(depth, below_python.as_ref());
        unwind::caller_stack(guard, caller, missed, &limit, &intern)
    }

    /// The deepest stack this process records: the native depth limit, or the format's
    /// when Python frames come on top of it.
    pub fn deepest_stack(&self) -> u32 {
        if python_runtime::runtime().is_some() {
            memwarden_abi::MAX_DEPTH_LIMIT
        } else {
            self.config.max_depth() as u32
        }
    }

    /// The id of a stack of frames (native return addresses or tagged words).
    pub fn intern(&self, frames: &[u64]) -> u32 {
        self.stacks.intern(&self.file, frames)
    }

    /// Sets the kind of memory a stack's blocks are (the same every time for a stack).
    fn set_category(&self, stack: u32, kind: u32) {
        if stack == memwarden_abi::UNKNOWN_STACK_ID {
            return;
        }
        let record = self.file.stack(u64::from(stack));
        // SAFETY: an aligned u32 of a published record in the mapping; every writer stores
        // the same value, so a plain atomic store is enough.
        unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*record).category)) }
            .store(kind, Ordering::Relaxed);
    }

    /// Charges an allocation of `size` bytes to `stack`.
    pub fn charge(&self, stack: u32, size: u64) {
        if !accounting::allocate(&self.file, stack, size) {
            lifecycle::degrade(degraded_reason::COUNTER_OVERFLOW);
        }
    }

    /// The frames of a stored stack (empty for the unknown stack or a bad id).
    pub fn frames_of(&self, stack: u32) -> &[u64] {
        let count = self
            .file
            .counter(core::mem::offset_of!(Header, stack_count))
            .load(Ordering::Acquire);
        if u64::from(stack) >= count {
            return &[];
        }
        let record = self.file.stack(u64::from(stack));
        // SAFETY: ids handed out by the stack table have their frames written before the id
        // is published, and frames never change; the slice lies inside the frame area.
        unsafe {
            core::slice::from_raw_parts(
                self.file.frame_words((*record).frames_start),
                (*record).depth as usize,
            )
        }
    }

    /// The contention counter, for locks the recorder's helpers take.
    pub fn waits(&self) -> &AtomicU64 {
        self.file.counter(core::mem::offset_of!(Header, lock_waits))
    }

    /// Charges the release of a block of `size` bytes to the stack that allocated it.
    pub fn charge_release(&self, _guard: &Guard, stack: u32, size: u64) {
        accounting::release(&self.file, stack, size);
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
    /// before this library, so memwarden sees none of them. The CLI's summary says so.
    pub fn note_own_malloc(&self) {
        // Compared by module, not by address: taking `malloc`'s address here would itself go
        // through the loader and find the program's.
        let bound = crate::real::global_symbol(c"malloc");
        let ours =
            crate::snapshot::snapshot().is_some_and(|snapshot| snapshot.is_own(bound as u64));
        // A canonical PLT stub in the program is found first but defines nothing: its calls
        // reach this library's `malloc`.
        if bound != 0 && !ours && crate::real::symbol_defined_at(bound) {
            self.file
                .counter(core::mem::offset_of!(Header, flags))
                .fetch_or(flags::OWN_MALLOC, Ordering::Relaxed);
        }
    }
}

/// Halvings of the growable capacities tried when the address space is short.
const MAX_SHRINK: u32 = 8;

/// The profile's layout for `config`, its growable capacities (stacks, frames, code
/// records and their text) divided by 2^`shrink`.
fn layout_for(config: &Config, shrink: u32) -> Option<Layout> {
    let shrunk = |capacity: u64| (capacity >> shrink).max(1);
    let layout = Layout::new(
        memwarden_abi::defaults::MODULE_CAPACITY,
        shrunk(config.numeric[STACK_CAPACITY]),
        shrunk(config.numeric[FRAME_CAPACITY]),
        memwarden_abi::defaults::FAILURE_CAPACITY,
        memwarden_abi::defaults::ERROR_CAPACITY,
        shrunk(memwarden_abi::defaults::CODE_CAPACITY),
        shrunk(memwarden_abi::defaults::BLOB_CAPACITY),
    )?;
    let leaks = match config.numeric[LEAK_CHECK] {
        0 => 0,
        _ => memwarden_abi::defaults::LEAK_CAPACITY,
    };
    layout.with_leak_capacity(leaks)
}

/// How often the capacities must be halved for the profile file to fit the process's file
/// size limit (`RLIMIT_FSIZE`, `ulimit -f`): sizing the file past it would not fail quietly
/// but kill the program (SIGXFSZ). `EFBIG` if even [`MAX_SHRINK`] halvings do not fit.
fn shrink_within_file_limit(config: &Config) -> Result<u32, i32> {
    let limit = address_room::soft_limit(libc::RLIMIT_FSIZE);
    (0..=MAX_SHRINK)
        .find(|&shrink| layout_for(config, shrink).is_some_and(|layout| layout.file_size <= limit))
        .ok_or(libc::EFBIG)
}

/// Maps the profile file `fd` at the capacities halved `first` times (chosen to leave the
/// program most of a limited address space: `address_room`) or, where the address space is
/// still too short for them, at halved ones, up to [`MAX_SHRINK`] times in all; the file and
/// how often the capacities were halved.
fn map_within_address_space(
    fd: i32,
    config: &Config,
    first: u32,
    identity: &Identity,
) -> Result<(ProfileFile, u32), i32> {
    let mut shrink = first;
    loop {
        let layout = layout_for(config, shrink).ok_or(libc::EOVERFLOW)?;
        // SAFETY: `fd` is the profile file, open read-write; it is resized before any use.
        if shrink > first && unsafe { libc::ftruncate(fd, layout.file_size as libc::off_t) } != 0 {
            return Err(profile_file::last_errno());
        }
        match ProfileFile::map(fd, layout, &config.output_dir, identity) {
            Err(libc::ENOMEM) if shrink < MAX_SHRINK => shrink += 1,
            mapped => return mapped.map(|file| (file, shrink)),
        }
    }
}

/// Says that the profile holds fewer stacks than configured.
fn say_capacity(stacks: u64, configured: u64) {
    let (mut held, mut asked) = ([0u8; 20], [0u8; 20]);
    crate::log::say(&[
        b"the process's limits (ulimit -v or -f) leave no room for a full profile: it holds at most ",
        crate::log::decimal(stacks, &mut held),
        b" distinct stacks instead of ",
        crate::log::decimal(configured, &mut asked),
    ]);
}

/// Records the end of the process if it is being profiled (even degraded). A `vfork`
/// child shares its parent's memory, so it must not write its end into the parent's file.
pub fn record_exit(kind: u32, value: i32) {
    if let Some(recorder) = lifecycle::recorder() {
        // SAFETY: getpid has no preconditions; pid is written once before tracking starts.
        let own = unsafe { libc::getpid() as u32 == (*recorder.file.header()).pid };
        if own {
            if let (Some(header_guard), Some(_guard)) =
                (crate::guard::header_guard(), Guard::enter())
            {
                // Every block still live is checked once more as the process ends.
                header_guard.check_all(recorder, memwarden_abi::UNKNOWN_STACK_ID);
            }
            recorder.record_end(kind, value);
        }
        // Ends of children reaped inside a hook, still unwritten: now or never.
        crate::hooks_wait::write_deferred();
    }
}

pub const EXIT_CODE: u32 = exit_kind::CODE;
pub const EXIT_SIGNAL: u32 = exit_kind::SIGNAL;
