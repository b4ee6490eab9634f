//! Analysis at exit (leak check): the roots. They are the program's private read-write
//! memory that is neither glibc's heap nor memwarden's own:
//! - the writable segments of every loaded module (listed with `dl_iterate_phdr` *before*
//!   the other threads stop, since it takes the loader's lock, which a stopped thread may
//!   hold), their `.bss` included;
//! - every anonymous read-write mapping: thread stacks (from each stopped thread's stack
//!   pointer less x86_64's 128-byte red zone, or the exiting thread's noted one, to the end
//!   of its mapping, which covers a thread's static TLS and its `pthread_setspecific`
//!   slots), the main thread's TLS, interpreter arenas such as Python's;
//! - every other private read-write file mapping (the JVM's class-data archive), read
//!   through the kernel ([`crate::leak_file_roots`]) as it may reach past its file's end;
//! - and, separately, every thread's saved registers.
//!
//! Shared mappings are left out (memwarden's profile file is one).

use crate::leak_blocks::Interval;
use crate::leak_classify::Marker;
use crate::leak_file_roots::FileRootReader;
use crate::leak_maps::{vma, Maps};
use crate::own_regions;

/// x86_64's red zone below the stack pointer, which leaf functions use without moving it.
pub const RED_ZONE: u64 = 128;

/// The writable `PT_LOAD` segments of every loaded module, into `into`; returns how many.
pub fn module_segments(into: &mut [Interval]) -> usize {
    struct Sink<'a> {
        into: &'a mut [Interval],
        count: usize,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the Sink passed below; `info` is the loader's record of one
        // module, valid for the duration of the callback.
        let (sink, info) = unsafe { (&mut *data.cast::<Sink>(), &*info) };
        for index in 0..usize::from(info.dlpi_phnum) {
            // SAFETY: dlpi_phdr has dlpi_phnum entries.
            let header = unsafe { &*info.dlpi_phdr.add(index) };
            if header.p_type != libc::PT_LOAD || header.p_flags & libc::PF_W == 0 {
                continue;
            }
            if sink.count < sink.into.len() {
                let start = info.dlpi_addr.wrapping_add(header.p_vaddr);
                sink.into[sink.count] = Interval {
                    start,
                    end: start.wrapping_add(header.p_memsz),
                };
                sink.count += 1;
            }
        }
        0
    }
    let mut sink = Sink { into, count: 0 };
    // SAFETY: the callback only writes into the sink, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut sink as *mut Sink).cast()) };
    let count = sink.count;
    into[..count].sort_unstable_by_key(|i| i.start);
    count
}

/// memwarden's own ranges, sorted and merged, into `into`; returns how many.
pub fn own_intervals(into: &mut [Interval]) -> usize {
    let mut count = 0;
    own_regions::for_each(|start, end| {
        if count < into.len() {
            into[count] = Interval { start, end };
            count += 1;
        }
    });
    sort_and_merge(&mut into[..count])
}

/// Sorts `intervals` and merges overlapping ones in place; returns the count left.
pub fn sort_and_merge(intervals: &mut [Interval]) -> usize {
    intervals.sort_unstable_by_key(|i| i.start);
    let mut kept = 0;
    for index in 0..intervals.len() {
        let next = intervals[index];
        if kept > 0 && next.start <= intervals[kept - 1].end {
            intervals[kept - 1].end = intervals[kept - 1].end.max(next.end);
        } else {
            intervals[kept] = next;
            kept += 1;
        }
    }
    kept
}

/// The part of a thread's stack mapping below its live stack: `[mapping start, sp −
/// below)`, stale frames that are not roots. `below` is [`RED_ZONE`] for a thread stopped
/// anywhere (a leaf function may keep data under its stack pointer), 0 for the thread that
/// runs the check: what lies under its noted stack pointer is the check's own frames.
pub fn below_stack_pointer(maps: &Maps, sp: u64, below: u64) -> Option<Interval> {
    let v = maps.containing(sp)?;
    if !v.has(vma::ANONYMOUS) || v.has(vma::HEAP) {
        return None;
    }
    Some(Interval {
        start: v.start,
        end: sp.saturating_sub(below).max(v.start),
    })
}

/// Scans every root range: private read-write memory (anonymous, a module's writable
/// segment, or another file mapping, read through `files`), minus the sorted, merged
/// `excluded` ranges.
pub fn scan_memory_roots(
    marker: &mut Marker,
    maps: &Maps,
    modules: &[Interval],
    excluded: &[Interval],
    files: &mut FileRootReader,
) {
    let direct = |marker: &mut Marker, start: u64, end: u64| {
        pieces_outside(start, end, excluded, |from, to| {
            // SAFETY: a piece of a readable, writable mapping listed in /proc/self/maps
            // while every other thread is stopped, anonymous or within a module's
            // segment (which the loader mapped from the file); this thread does not
            // unmap it.
            unsafe { marker.scan_root(from, to) };
        });
    };
    for v in maps.as_slice().iter().filter(|v| v.is_private_data()) {
        if v.has(vma::ANONYMOUS) {
            direct(marker, v.start, v.end);
            continue;
        }
        // A file mapping: where a module's writable segment lies, read directly; the rest
        // through the kernel, as it may lie past the end of its file.
        let mut at = v.start;
        let first = modules.partition_point(|m| m.end <= v.start);
        for m in modules[first..].iter().take_while(|m| m.start < v.end) {
            let (from, to) = (m.start.max(v.start), m.end.min(v.end));
            if from > at {
                pieces_outside(at, from, excluded, |a, b| files.scan(marker, a, b));
            }
            direct(marker, from, to);
            at = at.max(to);
        }
        if at < v.end {
            pieces_outside(at, v.end, excluded, |a, b| files.scan(marker, a, b));
        }
    }
}

/// Calls `each` with the pieces of `[start, end)` outside the sorted, merged `excluded`
/// ranges, in order.
fn pieces_outside(start: u64, end: u64, excluded: &[Interval], mut each: impl FnMut(u64, u64)) {
    let mut at = start;
    let first = excluded.partition_point(|e| e.end <= start);
    for e in excluded[first..].iter().take_while(|e| e.start < end) {
        if e.start > at {
            each(at, e.start);
        }
        at = at.max(e.end);
    }
    if at < end {
        each(at, end);
    }
}
