//! Event → store: applies one allocation or free to its stack's record and to the process's
//! `(live, peak)` pair, in O(1) — the exact-peak algorithm documented in `memwarden-abi`.
//!
//! Locking strategy: the stack's own spin lock orders events on one stack; one 128-bit
//! compare-and-swap on `(live, peak)` orders all events of the process. Together they make
//! each stack's figures at the peak exact without any process-wide lock: threads working on
//! different stacks never wait for each other, they only race on the one CAS word.
//! While the process has a single thread (glibc's `__libc_single_threaded`), no other
//! thread can race, so both are skipped: plain loads and stores do the same work.

use core::sync::atomic::Ordering;

use memwarden_abi::{Header, StackRecord};

use crate::fork;
use crate::profile_file::{clock_ns, ProfileFile};
use crate::spin::{self, SpinGuard};
use crate::thread_state::single_threaded;

fn pack(live: u64, peak: u64) -> u128 {
    u128::from(live) | (u128::from(peak) << 64)
}

fn unpack(word: u128) -> (u64, u64) {
    (word as u64, (word >> 64) as u64)
}

/// Locks a stack record, waiting while a fork is copying the profile. No lock is needed
/// while the process has one thread.
fn lock_stack(file: &ProfileFile, id: u32) -> (Option<SpinGuard<'static>>, *mut StackRecord) {
    let record = file.stack(u64::from(id));
    if single_threaded() {
        return (None, record);
    }
    // SAFETY: `lock` is an aligned u32 of a record in the mapping, which is never unmapped.
    let word =
        unsafe { core::sync::atomic::AtomicU32::from_ptr(core::ptr::addr_of_mut!((*record).lock)) };
    let waits = file.counter(core::mem::offset_of!(Header, lock_waits));
    loop {
        let guard = spin::lock(word, waits);
        if !fork::gate_closed() {
            return (Some(guard), record);
        }
        drop(guard);
        fork::wait_for_gate();
    }
}

/// Applies `update` to `(live, peak)` with one CAS; returns the pair before and after.
fn update_heap(
    file: &ProfileFile,
    update: impl Fn(u64, u64) -> Option<(u64, u64)>,
) -> Option<((u64, u64), (u64, u64))> {
    let heap = file.heap();
    if single_threaded() {
        return update_heap_alone(file, update);
    }
    let mut current = heap.load(Ordering::Relaxed);
    let mut retries = 0u64;
    loop {
        let before = unpack(current);
        let after = update(before.0, before.1)?;
        match heap.compare_exchange_weak(
            current,
            pack(after.0, after.1),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                if retries > 0 {
                    file.counter(core::mem::offset_of!(Header, heap_cas_retries))
                        .fetch_add(retries, Ordering::Relaxed);
                }
                return Some((before, after));
            }
            Err(actual) => {
                current = actual;
                retries += 1;
            }
        }
    }
}

/// `update_heap` without atomics, for a process with one thread: the two halves are
/// written as two words.
#[inline(always)]
fn update_heap_alone(
    file: &ProfileFile,
    update: impl Fn(u64, u64) -> Option<(u64, u64)>,
) -> Option<((u64, u64), (u64, u64))> {
    let halves = file.heap().as_ptr().cast::<u64>();
    // SAFETY: the pair is 16-byte aligned in the mapping; no other thread exists to race.
    unsafe {
        let before = (halves.read(), halves.add(1).read());
        let after = update(before.0, before.1)?;
        halves.write(after.0);
        halves.add(1).write(after.1);
        Some((before, after))
    }
}

/// Copies the live figures into the snapshot when a peak was committed since the stack was
/// last touched: untouched since, they are exactly its figures at that peak.
///
/// # Safety
/// The caller holds the record's lock.
unsafe fn refresh_snapshot(record: *mut StackRecord, peak: u64) {
    // SAFETY: the caller holds the lock, so this thread alone writes the record.
    unsafe {
        if (*record).snap_peak != peak {
            (*record).snap_bytes = (*record).live_bytes;
            (*record).snap_blocks = (*record).live_blocks;
            (*record).snap_peak = peak;
        }
    }
}

fn elapsed_ns(file: &ProfileFile) -> u64 {
    // SAFETY: start_monotonic_ns is written once before tracking starts.
    let start = unsafe { (*file.header()).start_monotonic_ns };
    clock_ns(libc::CLOCK_MONOTONIC_COARSE).saturating_sub(start)
}

/// Charges an allocation of `size` bytes to stack `id`. False if `live` would overflow.
pub fn allocate(file: &ProfileFile, id: u32, size: u64) -> bool {
    let (_lock, record) = lock_stack(file, id);
    let Some((_, (live, peak))) =
        update_heap(file, |live, peak| Some((live.checked_add(size)?, peak)))
    else {
        return false;
    };
    if live > peak {
        file.counter(core::mem::offset_of!(Header, rise_time_ns))
            .store(elapsed_ns(file), Ordering::Relaxed);
    }
    let signed = size as i64;
    // SAFETY: the lock is held; sizes are below 2^40 (the address map refuses larger), so
    // the signed figures cannot overflow in any real process.
    unsafe {
        refresh_snapshot(record, peak);
        (*record).live_bytes = (*record).live_bytes.wrapping_add(signed);
        (*record).live_blocks += 1;
        (*record).allocated_bytes = (*record).allocated_bytes.wrapping_add(size);
        (*record).allocations += 1;
        if (*record).live_bytes > (*record).max_live_bytes {
            (*record).max_live_bytes = (*record).live_bytes;
        }
    }
    true
}

/// Charges the release of a block of `size` bytes to the stack `id` that allocated it,
/// committing the peak first if this is the falling edge after a new high.
pub fn release(file: &ProfileFile, id: u32, size: u64) {
    let (_lock, record) = lock_stack(file, id);
    let Some(((live_before, peak_before), (_, peak))) = update_heap(file, |live, peak| {
        let peak = if live > peak { live } else { peak };
        Some((live.saturating_sub(size), peak))
    }) else {
        return;
    };
    if live_before > peak_before {
        let risen_at = file
            .counter(core::mem::offset_of!(Header, rise_time_ns))
            .load(Ordering::Relaxed);
        file.counter(core::mem::offset_of!(Header, peak_time_ns))
            .store(risen_at, Ordering::Relaxed);
    }
    // SAFETY: the lock is held (see `allocate`).
    unsafe {
        refresh_snapshot(record, peak);
        (*record).live_bytes = (*record).live_bytes.wrapping_sub(size as i64);
        (*record).live_blocks -= 1;
        (*record).frees += 1;
    }
}

#[cfg(test)]
mod tests {
    //! The exact-peak algorithm against a brute-force model: random allocations and frees on
    //! a few stacks, and at every step the model keeps a full copy of each stack's live
    //! bytes whenever the total reaches a new high. The profile's figures at the peak, read
    //! by the abi's rule, must equal the model's copy.
    use super::*;
    use crate::profile_file::{self, ScratchProfile};
    use memwarden_abi::{at_peak, peak_bytes};

    const STACKS: u32 = 5;

    fn scratch_profile(tag: &str) -> ScratchProfile {
        let scratch = profile_file::scratch_profile(&format!("accounting-{tag}"), 64);
        let file = &scratch.file;
        for id in 0..u64::from(STACKS) {
            assert!(file.back(file.layout().stack_offset(id), 128));
        }
        scratch
    }

    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn figures_at_the_peak_match_a_brute_force_model() {
        for seed in 1..=200u64 {
            let scratch = scratch_profile(&format!("model{seed}"));
            let file = &scratch.file;
            let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut live_blocks: Vec<(u32, u64)> = Vec::new();
            let mut per_stack = [0u64; STACKS as usize];
            let (mut best_total, mut best_copy) = (0u64, per_stack);
            for _ in 0..300 {
                let free_one = !live_blocks.is_empty() && next(&mut rng).is_multiple_of(3);
                if free_one {
                    let index = (next(&mut rng) % live_blocks.len() as u64) as usize;
                    let (stack, size) = live_blocks.swap_remove(index);
                    release(file, stack, size);
                    per_stack[stack as usize] -= size;
                } else {
                    let stack = (next(&mut rng) % u64::from(STACKS)) as u32;
                    let size = next(&mut rng) % 5000;
                    assert!(allocate(file, stack, size));
                    live_blocks.push((stack, size));
                    per_stack[stack as usize] += size;
                }
                let total: u64 = per_stack.iter().sum();
                if total > best_total {
                    best_total = total;
                    best_copy = per_stack;
                }
            }
            let word = file.heap().load(Ordering::Relaxed);
            let (live, peak) = unpack(word);
            assert_eq!(peak_bytes(live, peak), best_total, "seed {seed}");
            for stack in 0..STACKS {
                // SAFETY: the record is inside the scratch mapping.
                let record = unsafe { &*file.stack(u64::from(stack)) };
                assert_eq!(
                    at_peak(record, live, peak).0,
                    best_copy[stack as usize],
                    "seed {seed} stack {stack}"
                );
                assert_eq!(record.live_bytes as u64, per_stack[stack as usize]);
            }
        }
    }
}
