//! Symbolization, between analysis and report: turns a recorded return address into
//! source-level frames (function, file, line, module), inlined frames expanded, and a
//! Python frame word into the Python function, file and line it stands for (`python`).
//!
//! Frames are return addresses, so `address - 1` is looked up: it lies inside the call
//! instruction, in the right function and on the right line. A crash's innermost frame is
//! the faulting instruction itself and is looked up as is. Debug information is loaded
//! once per module file, only when an address is not known already, and each (module,
//! address) is resolved once, across processes — and across runs, with a cache folder
//! (`disk_cache`).

mod debug_file;
pub mod disk_cache;
mod module;
mod python;
pub use python::{
    arenas_frame, left_out_frame, INTERPRETER_FRAMES_LEFT_OUT_LABEL, PYMALLOC_ARENAS_LABEL,
};
pub(crate) use python::{python_frame, PythonLines};
pub mod python_lines;
mod symbol_table;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use module::{Location, ModuleFiles, ModuleSymbols};
use serde::{Deserialize, Serialize};

use crate::profile::{Module, Profile};
use crate::word_map::WordMap;

/// The symbolizer moves from the look-ahead thread to the report.
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<Symbolizer>();
};

/// One frame of a symbolized stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Demangled function name, if known.
    pub function: Option<String>,
    /// Source file, if the module has DWARF for the address.
    pub file: Option<String>,
    /// Source line.
    pub line: Option<u32>,
    /// Path of the module (`[vdso]` for the vDSO); `None` if no module holds the address.
    pub module: Option<String>,
    /// The return address as recorded.
    pub address: u64,
    /// An inlined call: this frame and the next share one machine frame.
    pub inlined: bool,
    /// Native code, or a Python function (`address` is then 0 and `module` `None`).
    pub kind: FrameKind,
}

/// What a frame is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    /// Machine code: a return address in a module.
    #[default]
    Native,
    /// A Python function, at the line it was executing.
    Python,
    /// Memory an allocator inside the program takes in large pieces and hands out itself,
    /// seen as a whole (CPython's pymalloc arenas): only `function`, which names it.
    Arena,
    /// In place of the interpreter's frames the preload left out of the middle of a long
    /// run of them below a Python frame (its parser's recursion): only `function`, which
    /// says so.
    Elided,
}

impl FrameKind {
    /// Its name in report.json, as serde writes it.
    pub fn name(self) -> &'static str {
        match self {
            FrameKind::Native => "native",
            FrameKind::Python => "python",
            FrameKind::Arena => "arena",
            FrameKind::Elided => "elided",
        }
    }
}

/// A module file and its identity: the same path with another build id is another file.
type ModuleKey = (String, Vec<u8>);

/// Resolves addresses, caching debug information per module and results per address.
#[derive(Default)]
pub struct Symbolizer {
    index: HashMap<ModuleKey, usize>,
    /// Each module's files, symbols and cache state.
    modules: Vec<ModuleEntry>,
    /// Whether each module's failure to load was warned about.
    warned: Vec<bool>,
    cache: WordMap<(usize, u64), Box<[Location]>>,
    warnings: Vec<String>,
    /// Where results are kept across runs, if anywhere.
    disk_dir: Option<PathBuf>,
}

/// Cache-folder files to write: per module, the folder, the key and the entries.
pub struct DiskWrites<'a> {
    files: Vec<DiskWrite<'a>>,
}

/// One module's cache-folder file to write.
struct DiskWrite<'a> {
    dir: &'a Path,
    key: &'a [u8],
    entries: Vec<(u64, &'a [Location])>,
}

impl DiskWrites<'_> {
    /// Writes the files (failures are ignored: the cache only saves time), then trims the
    /// folder.
    pub fn save(&self) {
        for file in &self.files {
            disk_cache::save(file.dir, file.key, &file.entries);
        }
        if let Some(first) = self.files.first() {
            disk_cache::trim(first.dir);
        }
    }
}

/// One module file as the symbolizer knows it.
struct ModuleEntry {
    /// Where its symbols come from, or why they cannot be used.
    files: Result<ModuleFiles, String>,
    /// Its symbols, loaded the first time an address is not already known.
    symbols: Option<Result<ModuleSymbols, String>>,
    /// Its key in the cache folder, when there is one.
    disk_key: Option<Vec<u8>>,
    /// Addresses resolved from its debug information (not found in the cache folder).
    resolved: usize,
}

impl ModuleEntry {
    /// Why its symbols cannot be used, if that is known.
    fn failure(&self) -> Option<&str> {
        match (&self.files, &self.symbols) {
            (Err(reason), _) | (Ok(_), Some(Err(reason))) => Some(reason),
            _ => None,
        }
    }
}

impl Symbolizer {
    /// A symbolizer with nothing loaded, that keeps nothing across runs.
    pub fn new() -> Self {
        Self::default()
    }

    /// A symbolizer that finds and keeps the results of earlier runs in `dir` (see
    /// [`disk_cache`]); none if `dir` is `None`.
    pub fn with_disk_cache(dir: Option<PathBuf>) -> Self {
        Symbolizer {
            disk_dir: dir,
            ..Self::default()
        }
    }

    /// Stores in the cache folder every module's results, for the modules that resolved
    /// new addresses from their debug information.
    pub fn save_disk_cache(&self) {
        self.disk_cache_writes().save();
    }

    /// What [`Symbolizer::save_disk_cache`] writes, gathered: the writing can then go on
    /// another thread (the symbolizer itself is not `Sync`).
    pub fn disk_cache_writes(&self) -> DiskWrites<'_> {
        let Some(dir) = &self.disk_dir else {
            return DiskWrites { files: Vec::new() };
        };
        let mut by_module: HashMap<usize, Vec<(u64, &[Location])>> = HashMap::new();
        for (&(index, probe), locations) in &self.cache {
            let entry = &self.modules[index];
            if entry.resolved > 0 && entry.disk_key.is_some() {
                by_module.entry(index).or_default().push((probe, locations));
            }
        }
        let files = by_module
            .into_iter()
            .filter_map(|(index, mut entries)| {
                entries.sort_unstable_by_key(|&(probe, _)| probe);
                let key = self.modules[index].disk_key.as_deref()?;
                Some(DiskWrite {
                    dir: dir.as_path(),
                    key,
                    entries,
                })
            })
            .collect();
        DiskWrites { files }
    }

    /// The frames for one recorded return `address` of `profile`, innermost first; one
    /// frame per inline level, at least one.
    pub fn frames(&mut self, profile: &Profile, address: u64) -> Vec<Frame> {
        let call = address.saturating_sub(1);
        self.frames_for(profile.module_at(call), address, call)
    }

    /// Like [`Symbolizer::frames`] for the address of an instruction itself (a crash's
    /// faulting instruction), which is looked up as is, not minus one.
    pub fn instruction_frames(&mut self, profile: &Profile, address: u64) -> Vec<Frame> {
        self.frames_for(profile.module_at(address), address, address)
    }

    /// The frames of `address` in `module` (the module holding `call`, or `None`), found
    /// by looking up `call` (`address - 1` for a return address, `address` for the
    /// faulting instruction of a crash), for the report.
    pub(crate) fn frames_for(
        &mut self,
        module: Option<&Module>,
        address: u64,
        call: u64,
    ) -> Vec<Frame> {
        self.frames_in(module, address, call, Use::Report)
    }

    /// Counts `module` as used by the report, as the look-ahead's use of it is taken up:
    /// if its symbols could not be loaded, the report warns about it as if it had.
    pub(crate) fn note_report_use(&mut self, module: &Module) {
        if !module.is_vdso() {
            self.module_index(module, Use::Report);
        }
    }

    /// Like [`Symbolizer::frames_for`], ahead of the report: a module whose symbols cannot
    /// be loaded is noted, but warned about only when the report itself needs it.
    pub fn frames_ahead(&mut self, module: Option<&Module>, address: u64, call: u64) -> Vec<Frame> {
        self.frames_in(module, address, call, Use::Ahead)
    }

    fn frames_in(
        &mut self,
        module: Option<&Module>,
        address: u64,
        call: u64,
        by: Use,
    ) -> Vec<Frame> {
        let unknown = |module: Option<String>| {
            vec![Frame {
                function: None,
                file: None,
                line: None,
                module,
                address,
                inlined: false,
                kind: FrameKind::Native,
            }]
        };
        let Some(module) = module else {
            return unknown(None);
        };
        if module.is_vdso() {
            return unknown(module.report_name());
        }
        let name = module.report_name();
        let index = self.module_index(module, by);
        let probe = call.wrapping_sub(module.base);
        if !self.cache.contains_key(&(index, probe)) {
            let entry = &mut self.modules[index];
            let located = match &entry.files {
                Ok(files) => match entry
                    .symbols
                    .get_or_insert_with(|| ModuleSymbols::load(files))
                {
                    Ok(symbols) => Some(symbols.locate(probe)),
                    Err(_) => None,
                },
                Err(_) => None,
            };
            let Some(located) = located else {
                self.warn_if_failed(module, index, by);
                return unknown(name);
            };
            entry.resolved += 1;
            self.cache.insert((index, probe), located.into());
        }
        let locations = &self.cache[&(index, probe)];
        locations
            .iter()
            .map(|l| Frame {
                function: l.function.clone(),
                file: l.file.clone(),
                line: l.line,
                module: name.clone(),
                address,
                inlined: l.inlined,
                kind: FrameKind::Native,
            })
            .collect()
    }

    /// One line per module whose symbols could not be loaded, saying why.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The index of `module`'s entry, finding its files (and what the cache folder holds
    /// for them) the first time. A module that cannot be used gets its warning the first
    /// time the report (not the look-ahead) uses it.
    fn module_index(&mut self, module: &Module, by: Use) -> usize {
        let key = (module.path.clone(), module.build_id.clone());
        let index = match self.index.get(&key) {
            Some(&index) => index,
            None => {
                let index = self.modules.len();
                let files = ModuleFiles::find(module);
                let disk_key = match (&self.disk_dir, &files) {
                    (Some(_), Ok(files)) => disk_cache::key(&module.build_id, files),
                    _ => None,
                };
                if let (Some(dir), Some(disk_key)) = (&self.disk_dir, &disk_key) {
                    for (probe, locations) in disk_cache::load(dir, disk_key) {
                        self.cache.insert((index, probe), locations);
                    }
                }
                self.modules.push(ModuleEntry {
                    files,
                    symbols: None,
                    disk_key,
                    resolved: 0,
                });
                self.warned.push(false);
                self.index.insert(key, index);
                index
            }
        };
        self.warn_if_failed(module, index, by);
        index
    }

    /// Warns, once and only for the report, that `module`'s symbols cannot be used.
    fn warn_if_failed(&mut self, module: &Module, index: usize, by: Use) {
        let Some(reason) = self.modules[index].failure() else {
            return;
        };
        if by == Use::Report && !std::mem::replace(&mut self.warned[index], true) {
            let shown = if module.path.is_empty() {
                "a module"
            } else {
                &module.path
            };
            self.warnings
                .push(format!("no symbols for {shown}: {reason}"));
        }
    }
}

/// Who asks for a module's symbols: the report, or the look-ahead while the run goes on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Report,
    Ahead,
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
