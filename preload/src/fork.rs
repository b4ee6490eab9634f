//! Process trees: `fork` handlers (`pthread_atfork`). A child must get its own profile file,
//! starting from its parent's live heap, and no lock held by another parent thread at the
//! moment of the fork may stay held in the child.
//!
//! prepare (parent): close the gate (new accounting waits) and take every stack lock, so no
//! update is half done, and copy the used parts of the
//! profile into a private buffer. parent: release everything. child: release everything
//! (the holders do not exist there), write the copy into a new file, map it where the
//! parent's file was mapped, and reset the child's totals.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use memwarden_abi::python::CodeRecord;
use memwarden_abi::{flags, Header, ModuleRecord, StackRecord};

use crate::lifecycle;
use crate::log;
use crate::profile_file::{self, Identity};
use crate::recorder::Recorder;
use crate::snapshot;
use crate::spin;
use crate::thread_state::Guard;

static GATE: AtomicBool = AtomicBool::new(false);
static LOCKED_STACKS: AtomicU64 = AtomicU64::new(0);
static COPY_ADDRESS: AtomicUsize = AtomicUsize::new(0);
static COPY_LENGTH: AtomicUsize = AtomicUsize::new(0);
/// The `(offset, length)` of each region in the copy, as `copy_profile` took them: the
/// child must not size them from the shared file, whose counters the parent moves on.
static COPIED_REGIONS: [[AtomicU64; 2]; REGIONS] =
    [const { [AtomicU64::new(0), AtomicU64::new(0)] }; REGIONS];
const REGIONS: usize = 6;
static CHILD_FAILURE_SAID: AtomicBool = AtomicBool::new(false);

/// True while a fork is copying the profile: accounting must wait.
#[inline(always)]
pub fn gate_closed() -> bool {
    GATE.load(Ordering::SeqCst)
}

#[cold]
pub fn wait_for_gate() {
    while GATE.load(Ordering::Acquire) {
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}

pub fn install() {
    // SAFETY: registers handlers with the C signature; they never unwind.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

fn stack_lock(recorder: &Recorder, id: u64) -> &AtomicU32 {
    let record = recorder.file.stack(id);
    // SAFETY: an aligned u32 in the mapping, only accessed atomically.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*record).lock)) }
}

/// The used byte ranges of the profile file: header, modules, stacks, frames, Python code
/// records and their blob.
fn used_regions(recorder: &Recorder, stacks: u64) -> [(u64, u64); REGIONS] {
    let file = &recorder.file;
    let layout = file.layout();
    let modules = file
        .counter(core::mem::offset_of!(Header, module_count))
        .load(Ordering::Acquire);
    let frames = file
        .counter(core::mem::offset_of!(Header, frame_words_used))
        .load(Ordering::Acquire);
    let codes = file
        .counter(core::mem::offset_of!(Header, code_count))
        .load(Ordering::Acquire);
    let blob = file
        .counter(core::mem::offset_of!(Header, blob_used))
        .load(Ordering::Acquire);
    [
        (0, memwarden_abi::HEADER_SIZE),
        (
            layout.modules_offset,
            modules * core::mem::size_of::<ModuleRecord>() as u64,
        ),
        (
            layout.stacks_offset,
            stacks * core::mem::size_of::<StackRecord>() as u64,
        ),
        (layout.frames_offset, frames.min(layout.frame_capacity) * 8),
        (
            layout.codes_offset,
            codes.min(layout.code_capacity) * core::mem::size_of::<CodeRecord>() as u64,
        ),
        (layout.blob_offset, blob.min(layout.blob_capacity)),
    ]
}

extern "C" fn prepare() {
    let Some(recorder) = lifecycle::active() else {
        return;
    };
    let Some(_guard) = Guard::enter() else {
        return;
    };
    GATE.store(true, Ordering::SeqCst);
    if let Some(header_guard) = crate::guard::header_guard() {
        header_guard.lock_for_fork();
    }
    if let Some(page_guard) = crate::page_guard::page_guard() {
        page_guard.lock_for_fork();
    }
    if let Some(python) = crate::python_runtime::runtime() {
        python.codes.lock_for_fork();
    }
    let file = &recorder.file;
    let stacks = file
        .counter(core::mem::offset_of!(Header, stack_count))
        .load(Ordering::SeqCst)
        .min(file.layout().stack_capacity);
    let waits = file.counter(core::mem::offset_of!(Header, lock_waits));
    for id in 0..stacks {
        spin::lock_raw(stack_lock(recorder, id), waits);
    }
    LOCKED_STACKS.store(stacks, Ordering::Relaxed);
    copy_profile(recorder, stacks);
}

/// Copies the used regions, back to back, into a private anonymous buffer.
fn copy_profile(recorder: &Recorder, stacks: u64) {
    let regions = used_regions(recorder, stacks);
    let length: u64 = regions.iter().map(|&(_, len)| len).sum();
    // SAFETY: a fresh private anonymous mapping of `length` bytes.
    let buffer = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            length as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if buffer == libc::MAP_FAILED {
        return;
    }
    let mut at = 0usize;
    for (offset, len) in regions {
        // SAFETY: source ranges lie in the mapped profile (below each region's capacity);
        // the destination has room for the sum of all lengths.
        unsafe {
            core::ptr::copy_nonoverlapping(
                recorder.file.base().add(offset as usize),
                buffer.cast::<u8>().add(at),
                len as usize,
            );
        }
        at += len as usize;
    }
    for (saved, (offset, len)) in COPIED_REGIONS.iter().zip(regions) {
        saved[0].store(offset, Ordering::Relaxed);
        saved[1].store(len, Ordering::Relaxed);
    }
    COPY_ADDRESS.store(buffer as usize, Ordering::Relaxed);
    COPY_LENGTH.store(length as usize, Ordering::Relaxed);
}

fn release_locks(recorder: &Recorder) {
    for id in 0..LOCKED_STACKS.swap(0, Ordering::Relaxed) {
        spin::unlock_raw(stack_lock(recorder, id));
    }
    if let Some(header_guard) = crate::guard::header_guard() {
        header_guard.unlock_after_fork();
    }
    if let Some(page_guard) = crate::page_guard::page_guard() {
        page_guard.unlock_after_fork();
    }
    if let Some(python) = crate::python_runtime::runtime() {
        python.codes.unlock_after_fork();
    }
    GATE.store(false, Ordering::SeqCst);
}

fn drop_copy() {
    let address = COPY_ADDRESS.swap(0, Ordering::Relaxed);
    let length = COPY_LENGTH.swap(0, Ordering::Relaxed);
    if address != 0 {
        // SAFETY: unmaps the buffer mapped by copy_profile.
        unsafe { libc::munmap(address as *mut libc::c_void, length) };
    }
}

extern "C" fn parent() {
    let Some(recorder) = lifecycle::active() else {
        return;
    };
    release_locks(recorder);
    drop_copy();
}

extern "C" fn child() {
    if let Some(guard) = Guard::enter() {
        crate::own_stack::adopt_after_fork(&guard);
    }
    let Some(recorder) = lifecycle::active() else {
        return;
    };
    let stacks = LOCKED_STACKS.load(Ordering::Relaxed);
    release_locks(recorder);
    snapshot::reset_after_fork();
    let Some(guard) = Guard::enter() else {
        return;
    };
    if let Err(errno) = adopt_own_file(recorder, stacks) {
        abandon_parent_file(recorder);
        let mut digits = [0u8; 20];
        log::say_once(
            &CHILD_FAILURE_SAID,
            &[
                b"a forked child cannot get its own profile file (errno ",
                log::decimal(errno as u64, &mut digits),
                b"); it is not profiled",
            ],
        );
    }
    drop(guard);
    drop_copy();
}

/// Writes the parent's copy into a new file for this child and maps it in place.
fn adopt_own_file(recorder: &Recorder, stacks: u64) -> Result<(), i32> {
    let copy = COPY_ADDRESS.load(Ordering::Relaxed);
    if copy == 0 {
        return Err(libc::ENOMEM);
    }
    let file = &recorder.file;
    let layout = *file.layout();
    let identity = Identity::of_this_process(recorder.deepest_stack());
    let fd = profile_file::create_file(&recorder.config.output_dir, &identity, &layout)?;
    let mut at = 0usize;
    for (offset, len) in used_regions_of_copy() {
        write_all_at(fd, copy + at, len as usize, offset)?;
        at += len as usize;
    }
    // SAFETY: replaces the parent's mapping, at the same address and size, with the child's
    // own file; only this thread exists in the child, and every pointer into the profile
    // stays valid because the address does not change.
    let mapped = unsafe {
        libc::mmap(
            file.base().cast(),
            layout.file_size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if mapped == libc::MAP_FAILED {
        let errno = profile_file::last_errno();
        // SAFETY: closes the new file, which is not used.
        unsafe { libc::close(fd) };
        return Err(errno);
    }
    profile_file::no_read_ahead(mapped, layout.file_size);
    file.adopt(fd, &identity);
    // SAFETY: closes the new file's descriptor: the mapping keeps the file, and backing it
    // opens it again by its path (`profile_fd`).
    unsafe { libc::close(fd) };
    for (offset, len) in used_regions(recorder, stacks) {
        if !file.back(offset, len) {
            return Err(libc::ENOSPC);
        }
    }
    // SAFETY: single-threaded child; the header is this child's own from here on.
    unsafe { file.write_identity(&identity) };
    reset_for_child(recorder, stacks);
    Ok(())
}

/// The regions as `copy_profile` copied them.
fn used_regions_of_copy() -> [(u64, u64); REGIONS] {
    core::array::from_fn(|i| {
        let saved = &COPIED_REGIONS[i];
        (
            saved[0].load(Ordering::Relaxed),
            saved[1].load(Ordering::Relaxed),
        )
    })
}

fn write_all_at(fd: i32, mut from: usize, mut len: usize, mut offset: u64) -> Result<(), i32> {
    while len > 0 {
        // SAFETY: writes from the private copy buffer, which holds `len` more bytes at `from`.
        let written =
            unsafe { libc::pwrite(fd, from as *const libc::c_void, len, offset as libc::off_t) };
        if written <= 0 {
            return Err(profile_file::last_errno());
        }
        from += written as usize;
        len -= written as usize;
        offset += written as u64;
    }
    Ok(())
}

/// The child starts with its parent's live heap as its own: live figures kept; totals,
/// contention counters, injected failures and crash zeroed; the peak set to the inherited
/// live bytes. (Its `--fail` rules go on counting calls from where the parent was.)
fn reset_for_child(recorder: &Recorder, stacks: u64) {
    let file = &recorder.file;
    let live = file.heap().load(Ordering::Relaxed) as u64;
    file.heap().store(
        u128::from(live) | (u128::from(live) << 64),
        Ordering::Relaxed,
    );
    for field in [
        core::mem::offset_of!(Header, peak_time_ns),
        core::mem::offset_of!(Header, rise_time_ns),
        core::mem::offset_of!(Header, end_time_ns),
        core::mem::offset_of!(Header, lock_waits),
        core::mem::offset_of!(Header, heap_cas_retries),
        core::mem::offset_of!(Header, untracked_allocations),
        core::mem::offset_of!(Header, failure_count),
    ] {
        file.counter(field).store(0, Ordering::Relaxed);
    }
    file.counter(core::mem::offset_of!(Header, flags))
        .fetch_or(flags::FORKED, Ordering::Relaxed);
    // SAFETY: single-threaded child writing its own header and records.
    unsafe {
        let header = file.header();
        (*header).exit_kind = memwarden_abi::exit_kind::UNKNOWN;
        (*header).exit_value = 0;
        (*header).crash_signal = 0;
        (*header).crash_depth = 0;
        for id in 0..stacks {
            let record = &mut *file.stack(id);
            record.lock = 0;
            if record.depth > 0 || id == 0 {
                record.published = 1;
            }
            record.allocated_bytes = 0;
            record.allocations = 0;
            record.frees = 0;
            record.max_live_bytes = record.live_bytes.max(0);
            record.snap_bytes = record.live_bytes;
            record.snap_blocks = record.live_blocks;
            record.snap_peak = live;
        }
    }
}

/// Puts private memory over the parent's file mapping so this child can never write into
/// its parent's profile, and stops tracking.
fn abandon_parent_file(recorder: &Recorder) {
    let file = &recorder.file;
    lifecycle::disable();
    // SAFETY: replaces the shared mapping with anonymous memory at the same address; the
    // child no longer tracks, but stray readers of the old pointers still find memory.
    unsafe {
        libc::mmap(
            file.base().cast(),
            file.layout().file_size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        );
    }
}
