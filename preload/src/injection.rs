//! Interposed call → event: fault injection. The `--fail` rules (`MEMWARDEN_FAIL`, parsed
//! by `memwarden-faults`) decide, before glibc is asked, whether an allocation fails; a
//! failed call is recorded in the profile (`FailureRecord`) with its stack.
//!
//! Everything a rule needs that depends on the stack — whether the allocation came from
//! C++ `operator new`, whether a frame matches an `in=`/`not-in=` glob, the stack's site
//! key — is worked out once per unique stack and kept in a byte per stack id, so the cost
//! per call is a few loads and one counter per rule that applies.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

use memwarden_abi::python::{decode, FrameWord};
use memwarden_abi::{failed_function, FailureRecord, Header};
use memwarden_faults::{calls, parse_rules, site_key, Call, FrameGlob, FrameTarget, Rule};

use crate::elf_symbols::SymbolCache;
use crate::profile_file::clock_ns;
use crate::python_code_names::code_names;
use crate::recorder::Recorder;
use crate::snapshot::{self, Snapshot};
use crate::spin;
use crate::thread_state::fetch_add_unshared;

/// One byte per stack id, computed on first use (0: not yet known).
struct PerStack {
    bytes: *const AtomicU8,
    len: u64,
}

impl PerStack {
    fn new(len: u64) -> Option<PerStack> {
        // SAFETY: a fresh private anonymous mapping, zero-filled ("not yet known"), touched
        // only where stacks exist.
        let bytes = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if bytes != libc::MAP_FAILED {
            crate::own_regions::note(bytes.cast(), len as usize);
        }
        (bytes != libc::MAP_FAILED).then_some(PerStack {
            bytes: bytes.cast(),
            len,
        })
    }

    /// The byte for `stack`, computing it with `compute` (never 0) the first time.
    fn get(&self, stack: u32, compute: impl FnOnce() -> u8) -> u8 {
        if u64::from(stack) >= self.len {
            return compute();
        }
        // SAFETY: the index is below the mapping's length.
        let slot = unsafe { &*self.bytes.add(stack as usize) };
        match slot.load(Ordering::Relaxed) {
            0 => {
                let value = compute();
                slot.store(value, Ordering::Relaxed);
                value
            }
            known => known,
        }
    }
}

const NO: u8 = 1;
const YES: u8 = 2;

/// Where a stack's allocation came from (its `PerStack` byte).
const FROM_MALLOC: u8 = 1;
const FROM_NEW: u8 = 2;
const FROM_NEW_ARRAY: u8 = 3;

struct ArmedRule {
    rule: Rule,
    matched: AtomicU64,
    fired: AtomicU64,
    /// Whether each stack passes the rule's stack filters (only when it has some).
    passes: Option<PerStack>,
}

pub struct Injector {
    rules: Vec<ArmedRule>,
    seed: u64,
    /// A rule filters on the bytes allocated so far.
    counts_bytes: bool,
    allocated: AtomicU64,
    /// Some rule fails anonymous mmaps.
    fails_mmap: bool,
    origins: PerStack,
    symbols_lock: AtomicU32,
    symbols: UnsafeCell<SymbolCache>,
}

// SAFETY: the symbol cache is only used under `symbols_lock`; everything else is atomics or
// immutable after start-up.
unsafe impl Sync for Injector {}
// SAFETY: as above.
unsafe impl Send for Injector {}

// Read by every hook: beside the other such words (lib.rs, "Hot words").
#[link_section = ".data.memwarden_hot"]
static INJECTOR: AtomicPtr<Injector> = AtomicPtr::new(core::ptr::null_mut());

/// The injector, if `--fail` rules apply to this process.
#[inline(always)]
pub fn injector() -> Option<&'static Injector> {
    // SAFETY: a leaked Box published once and never freed.
    unsafe { INJECTOR.load(Ordering::Acquire).as_ref() }
}

/// Arms the rules of `text` (already validated by the CLI; a bad text disables injection
/// and says so) that apply to the program `executable` (a file name).
pub fn install(text: &[u8], seed: u64, executable: &[u8], stack_capacity: u64) {
    let Ok(text) = core::str::from_utf8(text) else {
        crate::log::say(&[b"MEMWARDEN_FAIL is not UTF-8; no failures are injected"]);
        return;
    };
    let rules = match parse_rules(text) {
        Ok(rules) => rules,
        Err(error) => {
            crate::log::say(&[
                b"invalid MEMWARDEN_FAIL (",
                error.message.as_bytes(),
                b"); no failures are injected",
            ]);
            return;
        }
    };
    let mut armed = Vec::with_capacity(rules.len());
    for rule in rules {
        // A rule for another process of the tree keeps its place, so rule numbers stay
        // those of the command line, but never matches here.
        let for_us = rule
            .process
            .as_ref()
            .is_none_or(|glob| memwarden_faults::glob_match(glob.as_bytes(), executable));
        let passes = if rule.needs_stack() {
            PerStack::new(stack_capacity)
        } else {
            None
        };
        armed.push(ArmedRule {
            rule: if for_us {
                rule
            } else {
                Rule { calls: 0, ..rule }
            },
            matched: AtomicU64::new(0),
            fired: AtomicU64::new(0),
            passes,
        });
    }
    let Some(origins) = PerStack::new(stack_capacity) else {
        return;
    };
    let injector = Injector {
        counts_bytes: armed.iter().any(|a| a.rule.after_bytes.is_some()),
        fails_mmap: armed.iter().any(|a| a.rule.calls & calls::MMAP != 0),
        rules: armed,
        seed,
        allocated: AtomicU64::new(0),
        origins,
        symbols_lock: AtomicU32::new(0),
        symbols: UnsafeCell::new(SymbolCache::default()),
    };
    INJECTOR.store(Box::into_raw(Box::new(injector)), Ordering::Release);
}

impl Injector {
    pub fn fails_mmap(&self) -> bool {
        self.fails_mmap
    }

    /// Decides whether the call `function` of `size` bytes from `stack` fails; if so,
    /// records it and returns true. The caller then makes the call fail as its contract says.
    pub fn fails(&self, recorder: &Recorder, stack: u32, function: u32, size: u64) -> bool {
        let (kind, function) = if function == failed_function::MMAP {
            (calls::MMAP, function)
        } else if function == failed_function::OPERATOR_NEW
            || function == failed_function::OPERATOR_NEW_ARRAY
        {
            (calls::NEW, function)
        } else {
            match self.origins.get(stack, || self.origin_of(recorder, stack)) {
                FROM_NEW => (calls::NEW, failed_function::OPERATOR_NEW),
                FROM_NEW_ARRAY => (calls::NEW, failed_function::OPERATOR_NEW_ARRAY),
                _ => (calls::MALLOC, function),
            }
        };
        let live_bytes = recorder.file.heap().load(Ordering::Relaxed) as u64;
        let call = Call {
            kind,
            size,
            live_bytes,
            allocated_before: self.allocated.load(Ordering::Relaxed),
        };
        for (index, armed) in self.rules.iter().enumerate() {
            if !armed.rule.applies(&call) {
                continue;
            }
            if let Some(passes) = &armed.passes {
                if passes.get(stack, || self.stack_passes(recorder, &armed.rule, stack)) != YES {
                    continue;
                }
            }
            let n = bump(&armed.matched);
            let fired = armed.fired.load(Ordering::Relaxed);
            if !armed.rule.fires(n, fired, &call, self.seed, index as u32) {
                continue;
            }
            let limit = armed.rule.times.unwrap_or(u64::MAX);
            let claimed = armed
                .fired
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| {
                    (f < limit).then_some(f + 1)
                });
            if claimed.is_err() {
                continue;
            }
            record(recorder, n, size, stack, function, index as u32);
            return true;
        }
        false
    }

    /// Counts a successful allocation, for `after-bytes` rules.
    #[inline(always)]
    pub fn allocated(&self, size: u64) {
        if self.counts_bytes {
            add(&self.allocated, size);
        }
    }

    /// Whether `stack`'s innermost frames are C++ `operator new` (or `new[]`).
    fn origin_of(&self, recorder: &Recorder, stack: u32) -> u8 {
        let frames = recorder.frames_of(stack);
        let name = |index: usize| {
            frames
                .get(index)
                .map(|&ra| dynamic_symbol(ra.wrapping_sub(1)))
        };
        match name(0) {
            Some(Some(first)) if first.starts_with(b"_Znw") => match name(1) {
                Some(Some(second)) if second.starts_with(b"_Zna") => FROM_NEW_ARRAY,
                _ => FROM_NEW,
            },
            Some(Some(first)) if first.starts_with(b"_Zna") => FROM_NEW_ARRAY,
            _ => FROM_MALLOC,
        }
    }

    /// Whether `stack` passes `rule`'s `site=`, `in=` and `not-in=` filters.
    fn stack_passes(&self, recorder: &Recorder, rule: &Rule, stack: u32) -> u8 {
        let Some(snapshot) = snapshot::snapshot() else {
            return NO;
        };
        // The site key is of native frames only: Python frames and markers are not
        // addresses (and the report computes its site keys the same way).
        let native = |word: &&u64| matches!(decode(**word), FrameWord::Native(_));
        let frames = recorder.frames_of(stack);
        if let Some(wanted) = rule.site {
            let mut keyed = frames
                .iter()
                .filter(native)
                .map(|&ra| site_part(snapshot, ra));
            if site_key(&mut keyed) != wanted {
                return NO;
            }
        }
        if rule.only_in.is_empty() && rule.never_in.is_empty() {
            return YES;
        }
        let _lock = spin::lock(&self.symbols_lock, recorder.waits());
        // SAFETY: the symbol cache is only touched while `symbols_lock` is held.
        let symbols = unsafe { &mut *self.symbols.get() };
        let mut any_in = rule.only_in.is_empty();
        // DWARF is loaded only for rules that look at files.
        let wants_files = rule
            .only_in
            .iter()
            .chain(&rule.never_in)
            .any(|g| matches!(g.target, FrameTarget::File | FrameTarget::Any));
        // Whether a frame with these names (any of them), file and module is excluded by
        // a `not-in=`; notes whether it is wanted by an `in=`.
        let mut excluded = |names: &[&[u8]], file: &[u8], module: &[u8]| {
            let hit = |globs: &[FrameGlob]| {
                globs
                    .iter()
                    .any(|g| names.iter().any(|name| g.matches(name, file, module)))
            };
            any_in |= hit(&rule.only_in);
            hit(&rule.never_in)
        };
        for &word in frames {
            let ra = match decode(word) {
                FrameWord::Native(ra) => ra,
                FrameWord::Python { code, .. } => {
                    // A Python frame: its function is the code's qualified name or its
                    // plain name (so a method matches `parse_*` too), its file the path
                    // Python knew, and it has no module.
                    let Some(names) = code_names(&recorder.file, code) else {
                        continue;
                    };
                    if excluded(&[names.qualname, names.name], names.filename, b"") {
                        return NO;
                    }
                    continue;
                }
                FrameWord::Marker(_) => continue,
            };
            let call = ra.wrapping_sub(1);
            let (path, base) = snapshot.module_of(call).unwrap_or((b"", 0));
            let module = file_name(path);
            let offset = call.wrapping_sub(base);
            let function = symbols.function_name(path, offset).unwrap_or_default();
            let file = if wants_files {
                symbols.file_name(path, offset).unwrap_or_default()
            } else {
                String::new()
            };
            if excluded(&[function.as_bytes()], file.as_bytes(), module) {
                return NO;
            }
        }
        if any_in {
            YES
        } else {
            NO
        }
    }
}

/// Adds to a counter; its new value.
#[inline(always)]
fn add(counter: &AtomicU64, amount: u64) -> u64 {
    fetch_add_unshared(counter, amount).wrapping_add(amount)
}

/// The next value of a call counter.
#[inline(always)]
fn bump(counter: &AtomicU64) -> u64 {
    add(counter, 1)
}

/// A frame as the site key sees it: its module's file name and its module-relative offset
/// (the raw return address, as `memwarden report` computes it too).
fn site_part(snapshot: &Snapshot, return_address: u64) -> (&[u8], u64) {
    match snapshot.module_of(return_address.wrapping_sub(1)) {
        Some((path, base)) => (file_name(path), return_address.wrapping_sub(base)),
        None => (&[], return_address),
    }
}

fn file_name(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// The exported symbol containing `address` (dladdr: dynamic symbols only).
fn dynamic_symbol(address: u64) -> Option<&'static [u8]> {
    // SAFETY: Dl_info is plain data that dladdr fills.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: valid out-pointer; dladdr only reads the loader's tables.
    if unsafe { libc::dladdr(address as *const libc::c_void, &mut info) } == 0
        || info.dli_sname.is_null()
    {
        return None;
    }
    // SAFETY: dli_sname points into a loaded module's string table, which stays mapped
    // while the module is loaded (and the answer is only used right away).
    Some(unsafe { core::ffi::CStr::from_ptr(info.dli_sname) }.to_bytes())
}

/// Appends a failure record (or only counts it when the region is full).
fn record(recorder: &Recorder, call: u64, size: u64, stack: u32, function: u32, rule: u32) {
    let file = &recorder.file;
    let index = file
        .counter(core::mem::offset_of!(Header, failure_count))
        .fetch_add(1, Ordering::Relaxed);
    let layout = *file.layout();
    if index >= layout.failure_capacity
        || !file.back(
            layout.failure_offset(index),
            core::mem::size_of::<FailureRecord>() as u64,
        )
    {
        return;
    }
    // SAFETY: written once before tracking starts.
    let start = unsafe { (*file.header()).start_monotonic_ns };
    let failure = FailureRecord {
        seq: index + 1,
        call,
        size,
        time_ns: clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(start),
        stack,
        function,
        rule,
        reserved: 0,
    };
    // SAFETY: record `index` was claimed by this thread alone (fetch-add), lies inside the
    // mapping and is backed.
    unsafe { file.failure(index).write(failure) };
}
