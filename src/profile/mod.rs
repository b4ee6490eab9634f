//! The store, read back: one [`Profile`] per `*.mwp` file, i.e. per process image. The
//! model keeps only what the records say, validated; the analysis draws conclusions.

mod compact;
mod dir;
mod errors;
mod failures;
mod frame_words;
mod header;
mod leaks;
mod live;
mod plain;
mod python;
mod reader;
#[cfg(any(test, feature = "synthetic"))]
pub mod synthetic;

use std::path::PathBuf;

use memwarden_abi::{flags, ErrorRecord, FailureRecord, StackRecord, MODULE_MAIN, MODULE_VDSO};

use crate::Exit;

pub use compact::compact_profile_file;
pub use dir::{load_dir, load_finished_dir, profile_paths, OutputDir};
pub use errors::guard_mode_name;
pub use frame_words::FrameWords;
pub use leaks::{leak_view_name, LeakCheck};
pub use live::LiveProfile;
pub use python::{python_version_text, PythonCode};
pub use reader::{
    read_finished_profile_file, read_profile, read_profile_file, FinishedFile, ProfileError, Source,
};

/// One process image as its profile file recorded it.
#[derive(Clone, Debug)]
pub struct Profile {
    /// The file it was read from (empty for in-memory sources).
    pub path: PathBuf,
    /// Process id.
    pub pid: u32,
    /// Parent process id when tracking started.
    pub ppid: u32,
    /// Deepest stack recorded, in frames.
    pub max_depth: u32,
    /// The end the process recorded itself, if it could.
    pub recorded_exit: Option<Exit>,
    /// One of `memwarden_abi::degraded_reason`.
    pub degraded_reason: u32,
    /// Wall-clock start, ns since the Unix epoch.
    pub start_realtime_ns: u64,
    /// `CLOCK_MONOTONIC` start, ns.
    pub start_monotonic_ns: u64,
    /// `heap[0]`: bytes live at the end.
    pub live_bytes: u64,
    /// `heap[1]`: the last committed peak.
    pub committed_peak_bytes: u64,
    /// ns after start when the committed peak was reached.
    pub peak_time_ns: u64,
    /// ns after start of the latest allocation that raised live above the committed peak.
    pub rise_time_ns: u64,
    /// ns after start when the process ended, 0 if it did not record its end.
    pub end_time_ns: u64,
    /// Bits of `memwarden_abi::flags`.
    pub flags: u64,
    /// Allocations made while tracking was off.
    pub untracked_allocations: u64,
    /// Writer waits on a locked stack record or address-map shard.
    pub lock_waits: u64,
    /// Lost races of the `heap` compare-and-swap.
    pub heap_cas_retries: u64,
    /// The command line (lossy UTF-8).
    pub argv: Vec<String>,
    /// Published modules, sorted by start address.
    pub modules: Vec<Module>,
    /// The stacks that count: the reserved id 0 and every published record, by id.
    pub stacks: Vec<Stack>,
    /// Allocation failures injected by `--fail` rules, stored or not.
    pub failure_count: u64,
    /// The stored failure records (at most the file's capacity), in the order claimed;
    /// function codes are known and stack ids are below the stack count.
    pub failures: Vec<FailureRecord>,
    /// The fatal signal the preload caught and where, if it caught one.
    pub crash: Option<Crash>,
    /// The guard mode in force: one of `memwarden_abi::guard_mode`.
    pub guard_mode: u32,
    /// Heap errors found by guards, stored or not.
    pub error_count: u64,
    /// The stored heap-error records (at most the file's capacity), in the order claimed;
    /// kinds are known and stack ids are below the stack count.
    pub errors: Vec<ErrorRecord>,
    /// The Python runtime found in the process, as `PY_VERSION_HEX`; 0 if none.
    pub python_version: u32,
    /// The Python code records, by index (what Python frame words point to); `None` for a
    /// record not yet published.
    pub python_codes: Vec<Option<PythonCode>>,
    /// The leak check at exit (`--leak-check`).
    pub leaks: LeakCheck,
}

/// Where a process crashed, as the preload recorded it from its signal handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crash {
    /// The fatal signal.
    pub signal: u32,
    /// Innermost first; frame 0 is the faulting instruction's address (not a return
    /// address), the others are return addresses.
    pub frames: Vec<u64>,
}

impl Profile {
    /// Whether a bit of `memwarden_abi::flags` is set.
    pub fn has_flag(&self, flag: u64) -> bool {
        self.flags & flag != 0
    }

    /// Whether the process was created by `fork` (and started with its parent's heap).
    pub fn forked(&self) -> bool {
        self.has_flag(flags::FORKED)
    }

    /// The stack with this id, if it is published (or the reserved id 0).
    pub fn stack(&self, id: u32) -> Option<&Stack> {
        self.stacks
            .binary_search_by_key(&id, |s| s.id)
            .ok()
            .map(|index| &self.stacks[index])
    }

    /// The Python code record `index`, if it was written and published.
    pub fn python_code(&self, index: u32) -> Option<&PythonCode> {
        self.python_codes.get(index as usize)?.as_ref()
    }

    /// The module whose `[start, end)` holds `address`; the most recently loaded one if
    /// several do (a library unloaded and another loaded at the same place).
    pub fn module_at(&self, address: u64) -> Option<&Module> {
        module_at(&self.modules, address)
    }
}

/// The module of `modules` (sorted by start) holding `address`; of several that held it
/// over time, the last loaded.
pub fn module_at(modules: &[Module], address: u64) -> Option<&Module> {
    let after = modules.partition_point(|m| m.start <= address);
    modules[..after]
        .iter()
        .filter(|m| address < m.end)
        .max_by_key(|m| m.loaded_ns)
}

/// An executable or shared object mapped in the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// Path of the mapped file (lossy UTF-8), as the loader knew it.
    pub path: String,
    /// Load bias: runtime address minus the address stated in the ELF file.
    pub base: u64,
    /// Lowest runtime address of its segments.
    pub start: u64,
    /// One past the highest runtime address of its segments.
    pub end: u64,
    /// ns after process start when it was seen loaded.
    pub loaded_ns: u64,
    /// `MODULE_*` bits.
    pub flags: u32,
    /// GNU build id, empty if none.
    pub build_id: Vec<u8>,
}

impl Module {
    /// The kernel's vDSO (no file on disk).
    pub fn is_vdso(&self) -> bool {
        self.flags & MODULE_VDSO != 0
    }

    /// The main executable.
    pub fn is_main(&self) -> bool {
        self.flags & MODULE_MAIN != 0
    }

    /// The module as reports name it: its path, or `[vdso]`; `None` if no path was recorded.
    pub fn report_name(&self) -> Option<String> {
        if self.is_vdso() {
            return Some("[vdso]".to_owned());
        }
        (!self.path.is_empty()).then(|| self.path.clone())
    }
}

/// One unique call stack and its accounting.
#[derive(Clone)]
pub struct Stack {
    /// Its id (index in the stack region); 0 is the reserved unknown stack.
    pub id: u32,
    /// Frame words, innermost first: return addresses, Python frames and markers
    /// (`memwarden_abi::python::decode` tells them apart).
    pub frames: FrameWords,
    /// The record as written, for the figures (`memwarden_abi::at_peak` reads it).
    pub record: StackRecord,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("id", &self.id)
            .field("frames", &self.frames)
            .field("live_bytes", &self.record.live_bytes)
            .field("allocated_bytes", &self.record.allocated_bytes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
#[path = "reader_tests.rs"]
mod reader_tests;

#[cfg(test)]
#[path = "reader_fuzz_tests.rs"]
mod reader_fuzz_tests;

#[cfg(test)]
#[path = "failures_tests.rs"]
mod failures_tests;

#[cfg(test)]
#[path = "errors_tests.rs"]
mod errors_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn module(path: &str, start: u64, end: u64, loaded_ns: u64) -> Module {
        Module {
            path: path.to_owned(),
            base: start,
            start,
            end,
            loaded_ns,
            flags: 0,
            build_id: Vec::new(),
        }
    }

    #[test]
    fn module_lookup_uses_half_open_ranges_and_prefers_the_latest_load() {
        let mut profile = synthetic::ProfileBuilder::new(1).build_profile();
        profile.modules = vec![
            module("/a.so", 0x1000, 0x2000, 5),
            module("/old.so", 0x3000, 0x5000, 1),
            module("/new.so", 0x3000, 0x4000, 9),
        ];
        assert_eq!(profile.module_at(0x0fff), None);
        assert_eq!(profile.module_at(0x1000).unwrap().path, "/a.so");
        assert_eq!(profile.module_at(0x1fff).unwrap().path, "/a.so");
        assert_eq!(profile.module_at(0x2000), None);
        assert_eq!(profile.module_at(0x3500).unwrap().path, "/new.so");
        assert_eq!(profile.module_at(0x4500).unwrap().path, "/old.so");
        assert_eq!(profile.module_at(0x5000), None);
    }

    #[test]
    fn modules_are_named_by_path_or_vdso() {
        let libc = module("/usr/lib/libc.so.6", 0, 1, 0);
        assert_eq!(libc.report_name().as_deref(), Some("/usr/lib/libc.so.6"));
        assert_eq!(module("", 0, 1, 0).report_name(), None);
        let mut vdso = module("linux-vdso.so.1", 0, 1, 0);
        vdso.flags = MODULE_VDSO;
        assert_eq!(vdso.report_name().as_deref(), Some("[vdso]"));
    }
}
