//! Analysis at exit (leak check, `MEMWARDEN_LEAK_CHECK=1`): when the process ends, find
//! the blocks nothing points to any more, classify them as memcheck (or LeakSanitizer)
//! does, and store the figures per (allocation stack, kind) in the profile's leak region.
//!
//! When: a handler registered with `__cxa_atexit` from the `__libc_start_main` wrapper,
//! *before* glibc's start-up registers anything, so it runs after every other exit handler,
//! the program's destructors and `_dl_fini` (handlers run in reverse order). `exit` from any
//! thread runs the same handlers. `_exit`, `_Exit`, `abort` and fatal signals run none, so
//! they get no leak check (the profile says "not run").
//!
//! Steps, none of which allocates: list module segments → stop the other threads
//! ([`leak_stop`]) → read the maps → find the live blocks by their headers
//! ([`leak_blocks`]) → scan the roots and the registers ([`leak_roots`]) → classify
//! ([`leak_classify`]) → let the threads go → store.

use core::ffi::c_void;
use core::sync::atomic::Ordering;

use memwarden_abi::{guard_mode, leak_status, Header, LeakRecord};

use crate::config::{LEAK_CHECK, LEAK_VIEW};
use crate::leak_blocks::{self, Interval};
use crate::leak_classify::{kind_of, Block, Marker};
use crate::leak_file_roots::FileRootReader;
use crate::leak_index::{self, BlockIndex, Region};
use crate::leak_maps;
use crate::leak_roots;
use crate::leak_stop;
use crate::lifecycle;
use crate::own_regions::{self, ScratchArray};
use crate::profile_file::clock_ns;
use crate::recorder::Recorder;
use crate::thread_state::Guard;

extern "C" {
    fn __cxa_atexit(
        function: extern "C" fn(*mut c_void),
        argument: *mut c_void,
        dso: *mut c_void,
    ) -> i32;
}

/// Most module segments listed.
const MAX_SEGMENTS: usize = 16384;

/// Registers the exit handler if this process is asked for a leak check. Called by the
/// `__libc_start_main` wrapper before glibc's own start-up.
pub fn register_at_start() {
    if let Some(recorder) = lifecycle::recorder().filter(|r| r.config.numeric[LEAK_CHECK] != 0) {
        recorder
            .file
            .word32(core::mem::offset_of!(Header, leak_status))
            .store(leak_status::PENDING, Ordering::Release);
        // SAFETY: registers a handler with no argument, not tied to a module (never
        // unloaded: the handler is in this library, which is never closed).
        unsafe { __cxa_atexit(at_exit, core::ptr::null_mut(), core::ptr::null_mut()) };
    }
}

/// The exit handler: notes where this thread's live stack starts and its callee-saved
/// registers, then runs the check below this frame (whose words are not roots).
extern "C" fn at_exit(_argument: *mut c_void) {
    let sp: u64;
    let mut registers = [0u64; 6];
    // SAFETY: reads registers into locals; no memory or stack is touched.
    unsafe {
        core::arch::asm!(
            "mov {sp}, rsp",
            "mov {b}, rbx",
            "mov {p}, rbp",
            "mov {c}, r12",
            "mov {d}, r13",
            "mov {e}, r14",
            "mov {f}, r15",
            sp = out(reg) sp,
            b = out(reg) registers[0],
            p = out(reg) registers[1],
            c = out(reg) registers[2],
            d = out(reg) registers[3],
            e = out(reg) registers[4],
            f = out(reg) registers[5],
            options(nomem, nostack, preserves_flags),
        )
    };
    run(sp, &registers);
}

#[inline(never)]
fn run(sp: u64, registers: &[u64]) {
    let Some(recorder) = lifecycle::recorder() else {
        return;
    };
    // SAFETY: getpid has no preconditions; pid is written once at start.
    let own = unsafe { libc::getpid() as u32 == (*recorder.file.header()).pid };
    // A vfork child shares its parent's memory and file; a re-entered thread cannot scan.
    let Some(_guard) = own.then(Guard::enter).flatten() else {
        return;
    };
    let errno = crate::real::SavedErrno::save();
    let status = if recorder.config.guard_mode != guard_mode::NONE {
        leak_status::SKIPPED
    } else {
        check(recorder, sp, registers).unwrap_or(leak_status::SKIPPED)
    };
    recorder
        .file
        .word32(core::mem::offset_of!(Header, leak_status))
        .store(status, Ordering::Release);
    errno.restore();
}

/// The whole check; `None` if scratch memory or the stop signal was refused.
fn check(recorder: &Recorder, sp: u64, registers: &[u64]) -> Option<u32> {
    let started = clock_ns(libc::CLOCK_MONOTONIC);
    let lsan = recorder.config.numeric[LEAK_VIEW] != 0;
    let mut segments = ScratchArray::<Interval>::new(MAX_SEGMENTS)?;
    let segment_count = leak_roots::module_segments(segments.as_mut_slice());
    let stopped = leak_stop::stop_others()?;
    let maps = leak_maps::read_maps()?;
    if maps.truncated {
        // Roots would be missing: blocks they hold would be reported lost.
        return None;
    }
    if own_regions::overflowed() {
        crate::log::say(&[
            b"leak check: memwarden's own memory table is full; some leaks may be missed",
        ]);
    }
    let mut own = ScratchArray::<Interval>::new(1024)?;
    let own_count = leak_roots::own_intervals(own.as_mut_slice());
    let mut blocks = ScratchArray::<Block>::new(leak_blocks::block_capacity(&maps))?;
    let block_count =
        leak_blocks::find_blocks(&maps, &own.as_slice()[..own_count], blocks.as_mut_slice());
    let blocks = &mut blocks.as_mut_slice()[..block_count];

    let threads = stopped.threads();
    let capacity = maps.as_slice().len() + own_count + threads.len() + block_count + 1;
    let mut excluded = ScratchArray::<Interval>::new(capacity)?;
    let excluded_all = excluded.as_mut_slice();
    let mut count = leak_blocks::allocator_intervals(&maps, blocks, excluded_all);
    for interval in &own.as_slice()[..own_count] {
        excluded_all[count] = *interval;
        count += 1;
    }
    let stack_pointers = threads
        .iter()
        .map(|t| (t.sp, leak_roots::RED_ZONE))
        .chain(core::iter::once((sp, 0)));
    for (thread_sp, below) in stack_pointers {
        if let Some(stale) = leak_roots::below_stack_pointer(&maps, thread_sp, below) {
            if count < excluded_all.len() {
                excluded_all[count] = stale;
                count += 1;
            }
        }
    }
    let count = leak_roots::sort_and_merge(&mut excluded_all[..count]);

    // The mappings that hold blocks, for the page index.
    let mut ranges = ScratchArray::<Interval>::new(maps.as_slice().len() + 1)?;
    let mut range_count = 0;
    for v in maps
        .as_slice()
        .iter()
        .filter(|v| leak_blocks::may_hold_blocks(v))
    {
        let first = blocks.partition_point(|b| b.start < v.start);
        if blocks.get(first).is_some_and(|b| b.start < v.end) {
            ranges.as_mut_slice()[range_count] = Interval {
                start: v.start,
                end: v.end,
            };
            range_count += 1;
        }
    }
    let ranges = &ranges.as_slice()[..range_count];
    let mut regions = ScratchArray::<Region>::new(range_count)?;
    let mut pages = ScratchArray::<u32>::new(leak_index::pages_needed(ranges))?;
    let index = BlockIndex::build(blocks, ranges, regions.as_mut_slice(), pages.as_mut_slice());

    let mut mark_stack = ScratchArray::<u32>::new(block_count * 2 + 1)?;
    let mut marker = Marker::new(blocks, mark_stack.as_mut_slice(), lsan, Some(index));
    let mut files = FileRootReader::new()?;
    leak_roots::scan_memory_roots(
        &mut marker,
        &maps,
        &segments.as_slice()[..segment_count],
        &excluded_all[..count],
        &mut files,
    );
    if files.refused() {
        crate::log::say(&[
            b"leak check: the kernel refused to read private file mappings; blocks held only from them are reported lost",
        ]);
    }
    marker.scan_values(registers);
    for thread in threads {
        marker.scan_values(&thread.registers);
    }
    marker.propagate();
    marker.classify_lost();
    let scanned = marker.scanned_bytes;
    let stopped_count = threads.len() as u32;
    let missed = stopped.missed as u32;
    drop(stopped);

    let file = &recorder.file;
    let elapsed = clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(started);
    file.counter(core::mem::offset_of!(Header, leak_scanned_bytes))
        .store(scanned, Ordering::Relaxed);
    file.counter(core::mem::offset_of!(Header, leak_scan_ns))
        .store(elapsed, Ordering::Relaxed);
    file.word32(core::mem::offset_of!(Header, leak_threads_stopped))
        .store(stopped_count, Ordering::Relaxed);
    file.word32(core::mem::offset_of!(Header, leak_threads_missed))
        .store(missed, Ordering::Relaxed);
    file.word32(core::mem::offset_of!(Header, leak_view))
        .store(u32::from(lsan), Ordering::Relaxed);
    store(recorder, blocks)?;
    Some(leak_status::DONE)
}

/// Stores one record per (stack, kind), from the classified blocks.
fn store(recorder: &Recorder, blocks: &[Block]) -> Option<()> {
    let mut keys = ScratchArray::<(u64, u64)>::new(blocks.len())?;
    let keys = keys.as_mut_slice();
    for (key, block) in keys.iter_mut().zip(blocks) {
        *key = (
            u64::from(block.stack) << 8 | u64::from(kind_of(block.state)),
            block.size,
        );
    }
    keys.sort_unstable_by_key(|k| k.0);
    let file = &recorder.file;
    let layout = *file.layout();
    let size = core::mem::size_of::<LeakRecord>() as u64;
    let mut index = 0u64;
    let mut at = 0;
    while at < keys.len() {
        let key = keys[at].0;
        let mut record = LeakRecord {
            stack: (key >> 8) as u32,
            kind: (key & 0xff) as u32,
            ..LeakRecord::default()
        };
        while at < keys.len() && keys[at].0 == key {
            record.blocks += 1;
            record.bytes += keys[at].1;
            at += 1;
        }
        if index < layout.leak_capacity && file.back(layout.leak_offset(index), size) {
            // SAFETY: record `index` lies inside the mapping, is backed, and only this
            // thread writes the leak region.
            unsafe { file.leak_record(index).write(record) };
        }
        index += 1;
    }
    file.counter(core::mem::offset_of!(Header, leak_record_count))
        .store(index, Ordering::Release);
    Some(())
}
