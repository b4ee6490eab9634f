//! Interposed call → stack: the modules known at one moment, as an immutable [`Snapshot`]
//! ready to unwind through, published through an atomic pointer. A new one is built when a
//! stack shows an address in a module not yet known (after `dlopen`) or after `dlclose`; old
//! snapshots are never freed, since a thread may still be walking one.

use core::ops::Deref;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use framehop::x86_64::UnwinderX86_64;
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
    pub(crate) unwinder: UnwinderX86_64<MappedBytes>,
    /// `(start, end)` of each module, sorted by start.
    ranges: Vec<(u64, u64)>,
    /// Each module's path and load bias, in the order of `ranges`.
    places: Vec<(Vec<u8>, u64)>,
    /// This library's own range: its frames are dropped from the top of every stack.
    own: (u64, u64),
    pub(crate) loader_generation: u64,
}

impl Snapshot {
    /// The path and load bias of the module holding `address`.
    pub fn module_of(&self, address: u64) -> Option<(&[u8], u64)> {
        let after = self.ranges.partition_point(|&(start, _)| start <= address);
        let index = after.checked_sub(1)?;
        if address >= self.ranges[index].1 {
            return None;
        }
        let (path, base) = &self.places[index];
        Some((path.as_slice(), *base))
    }

    /// True if `address` lies in this library.
    pub fn is_own(&self, address: u64) -> bool {
        (self.own.0..self.own.1).contains(&address)
    }

    /// The address range of the module holding `address`, if a known module does.
    pub fn range_of(&self, address: u64) -> Option<(u64, u64)> {
        let after = self.ranges.partition_point(|&(start, _)| start <= address);
        let range = *self.ranges.get(after.checked_sub(1)?)?;
        (address < range.1).then_some(range)
    }
}

// Read by every hook: beside the other such words (lib.rs, "Hot words").
#[link_section = ".data.memwarden_hot"]
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
    let own_address = rebuild as *const () as u64;
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
        ranges.push((module.start, module.end, module.path.clone(), module.base));
        unwinder.add_module(framehop_module(module));
    }
    ranges.sort_unstable_by_key(|&(start, ..)| start);
    let (ranges, places) = ranges
        .into_iter()
        .map(|(start, end, path, base)| ((start, end), (path, base)))
        .unzip();
    let fresh = Box::into_raw(Box::new(Snapshot {
        unwinder,
        ranges,
        own,
        places,
        loader_generation,
    }));
    // The previous snapshot is leaked on purpose: another thread may be unwinding with it.
    SNAPSHOT.store(fresh, Ordering::Release);
}

fn framehop_module(module: &LoadedModule) -> Module<MappedBytes> {
    let svma =
        |(start, end): (u64, u64)| start.wrapping_sub(module.base)..end.wrapping_sub(module.base);
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

/// In a forked child: the thread that held the rebuild lock at the fork does not exist there.
pub fn reset_after_fork() {
    spin::unlock_raw(&REBUILD_LOCK);
}
