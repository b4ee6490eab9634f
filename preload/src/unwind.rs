//! Interposed call → stack: captures the caller's native return addresses in-process with
//! framehop's DWARF CFI unwinder, reading the modules' `.eh_frame` where the loader mapped
//! it. Each thread keeps framehop's rule cache, so a return address seen before costs a
//! cache hit rather than a CFI evaluation. Stack reads are bounded to the thread's stack, so
//! a bad unwind rule can end a stack early but never fault.
//!
//! The set of modules is an immutable [`Snapshot`] published through an atomic pointer and
//! rebuilt when a stack shows an address in a module not yet known (after `dlopen`) or after
//! `dlclose`. Old snapshots are never freed: a thread may still be walking one.

use core::ops::Deref;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};

use crate::modules::{self, LoadedModule};
use crate::profile_file::ProfileFile;
use crate::spin;
use crate::thread_state::Guard;

/// Bytes of a module as mapped in this process (read-only, valid while it stays loaded).
pub struct MappedBytes {
    start: *const u8,
    len: usize,
}

impl Deref for MappedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the range was taken from a loaded module's segments, which stay mapped
        // until the module is unloaded, after which no snapshot hands it out for new unwinds.
        unsafe { core::slice::from_raw_parts(self.start, self.len) }
    }
}

impl Default for MappedBytes {
    fn default() -> Self {
        MappedBytes {
            start: core::ptr::NonNull::<u8>::dangling().as_ptr(),
            len: 0,
        }
    }
}

impl MappedBytes {
    fn of((start, end): (u64, u64)) -> MappedBytes {
        MappedBytes {
            start: start as *const u8,
            len: end.saturating_sub(start) as usize,
        }
    }
}

/// The modules known at one moment, ready to unwind through.
pub struct Snapshot {
    unwinder: UnwinderX86_64<MappedBytes>,
    /// `(start, end)` of each module, sorted by start.
    ranges: Vec<(u64, u64)>,
    /// This library's own range: its frames are dropped from the top of every stack.
    own: (u64, u64),
    loader_generation: u64,
}

impl Snapshot {
    fn knows(&self, address: u64) -> bool {
        let after = self.ranges.partition_point(|&(start, _)| start <= address);
        after > 0 && address < self.ranges[after - 1].1
    }
}

static SNAPSHOT: AtomicPtr<Snapshot> = AtomicPtr::new(core::ptr::null_mut());
static REBUILD_LOCK: AtomicU32 = AtomicU32::new(0);
static REBUILD_WAITS: AtomicU64 = AtomicU64::new(0);

/// The current snapshot, if one was built.
pub fn snapshot() -> Option<&'static Snapshot> {
    // SAFETY: published snapshots are leaked boxes, never freed.
    unsafe { SNAPSHOT.load(Ordering::Acquire).as_ref() }
}

/// Lists the loaded modules again, records new ones in `file` and publishes a snapshot.
pub fn rebuild(_guard: &Guard, file: Option<&ProfileFile>) {
    let _lock = spin::lock(&REBUILD_LOCK, &REBUILD_WAITS);
    let (loaded, loader_generation) = modules::loaded_modules();
    if let Some(file) = file {
        modules::record(file, &loaded);
    }
    let own_address = capture as *const () as u64;
    let range_of = |wanted: &dyn Fn(&LoadedModule) -> bool| {
        loaded
            .iter()
            .find(|m| wanted(m))
            .map_or((0, 0), |m| (m.start, m.end))
    };
    let own = range_of(&|m| m.contains(own_address));
    let mut unwinder = UnwinderX86_64::new();
    let mut ranges = Vec::with_capacity(loaded.len());
    for module in &loaded {
        ranges.push((module.start, module.end));
        unwinder.add_module(framehop_module(module));
    }
    ranges.sort_unstable();
    let fresh = Box::into_raw(Box::new(Snapshot {
        unwinder,
        ranges,
        own,
        loader_generation,
    }));
    // The previous snapshot is leaked on purpose: another thread may be unwinding with it.
    SNAPSHOT.store(fresh, Ordering::Release);
}

fn framehop_module(module: &LoadedModule) -> Module<MappedBytes> {
    let svma = |(start, end): (u64, u64)| (start - module.base)..(end - module.base);
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: module.text.map(svma),
        text: module.text.map(MappedBytes::of),
        eh_frame_svma: module.eh_frame.map(svma),
        eh_frame: module.eh_frame.map(MappedBytes::of),
        eh_frame_hdr_svma: module.eh_frame_hdr.map(svma),
        eh_frame_hdr: module.eh_frame_hdr.map(MappedBytes::of),
        ..Default::default()
    };
    let name = String::from_utf8_lossy(&module.path).into_owned();
    Module::new(name, module.start..module.end, module.base, info)
}

type Cache = CacheX86_64;

static CACHE_KEY: AtomicU64 = AtomicU64::new(u64::MAX);

/// Creates the thread-exit hook that frees each thread's unwind cache.
pub fn install_thread_exit_hook() {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: valid out-pointer and a destructor with the C signature.
    if unsafe { libc::pthread_key_create(&mut key, Some(drop_cache)) } == 0 {
        CACHE_KEY.store(u64::from(key), Ordering::Release);
    }
}

unsafe extern "C" fn drop_cache(cache: *mut libc::c_void) {
    let Some(guard) = Guard::enter() else {
        return;
    };
    // SAFETY: this thread's cache slot; the pointer stored there is the one being freed.
    unsafe { *guard.unwind_cache_slot() = 0 };
    // SAFETY: `cache` is the Box made by `thread_cache` for this thread, freed only here.
    drop(unsafe { Box::from_raw(cache.cast::<Cache>()) });
}

/// This thread's unwind cache (made on first use). The pointer is only used by the thread
/// holding the guard, so there is never a second reference to the cache.
fn thread_cache(guard: &Guard) -> *mut Cache {
    let slot = guard.unwind_cache_slot();
    // SAFETY: the slot is this thread's; it holds 0 or a pointer made by Box::into_raw here.
    unsafe {
        if *slot == 0 {
            let cache = Box::into_raw(Box::new(Cache::new()));
            *slot = cache as u64;
            let key = CACHE_KEY.load(Ordering::Acquire);
            if key != u64::MAX {
                libc::pthread_setspecific(key as libc::pthread_key_t, cache.cast());
            }
        }
        *slot as *mut Cache
    }
}

/// Writes the caller's return addresses (innermost first, this library's frames left out)
/// into `out`; returns how many.
#[inline(never)]
pub fn capture(guard: &Guard, out: &mut [u64]) -> usize {
    let Some(snapshot) = snapshot() else {
        return 0;
    };
    let (count, saw_unknown) = walk(guard, snapshot, out);
    if saw_unknown && modules::loader_generation() != snapshot.loader_generation {
        rebuild(guard, crate::lifecycle::recorder().map(|r| &r.file));
        if let Some(fresh) = self::snapshot() {
            return walk(guard, fresh, out).0;
        }
    }
    count
}

#[inline(always)]
fn walk(guard: &Guard, snapshot: &Snapshot, out: &mut [u64]) -> (usize, bool) {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers; touches no memory and no flags.
    unsafe {
        core::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    let top = guard.stack_top();
    let mut read_stack = |address: u64| {
        if address >= sp && address.saturating_add(8) <= top && address.is_multiple_of(8) {
            // SAFETY: the word lies between the current stack pointer and the top of this
            // thread's stack, which is mapped and readable.
            Ok(unsafe { *(address as *const u64) })
        } else {
            Err(())
        }
    };
    // SAFETY: the cache belongs to this thread and the guard proves no other frame of this
    // thread is using it (hooks do not nest).
    let cache = unsafe { &mut *thread_cache(guard) };
    let regs = UnwindRegsX86_64::new(ip, sp, bp);
    let mut frames = snapshot
        .unwinder
        .iter_frames(ip, regs, cache, &mut read_stack);
    let (own_start, own_end) = snapshot.own;
    let mut count = 0;
    let mut in_own_frames = true;
    let mut saw_unknown = false;
    while count < out.len() {
        let Ok(Some(frame)) = frames.next() else {
            break;
        };
        let address = frame.address();
        if in_own_frames && own_start <= address && address < own_end {
            continue;
        }
        in_own_frames = false;
        if !snapshot.knows(address) {
            saw_unknown = true;
        }
        out[count] = address;
        count += 1;
    }
    (count, saw_unknown)
}

/// In a forked child: the thread that held the rebuild lock at the fork does not exist there.
pub fn reset_after_fork() {
    spin::unlock_raw(&REBUILD_LOCK);
}
