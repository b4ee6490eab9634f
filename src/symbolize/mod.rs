//! Symbolization, between analysis and report: turns a recorded return address into
//! source-level frames (function, file, line, module), inlined frames expanded, and a
//! Python frame word into the Python function, file and line it stands for (`python`).
//!
//! Frames are return addresses, so `address - 1` is looked up: it lies inside the call
//! instruction, in the right function and on the right line. A crash's innermost frame is
//! the faulting instruction itself and is looked up as is. Debug information is loaded
//! once per module file and each (module, address) is resolved once, across processes.

mod debug_file;
mod module;
mod python;
pub mod python_lines;
mod symbol_table;

use std::collections::HashMap;

use module::{Location, ModuleSymbols};
use serde::{Deserialize, Serialize};

use crate::profile::{Module, Profile};

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
}

/// A module file and its identity: the same path with another build id is another file.
type ModuleKey = (String, Vec<u8>);

/// Resolves addresses, caching debug information per module and results per address.
#[derive(Default)]
pub struct Symbolizer {
    index: HashMap<ModuleKey, usize>,
    /// Each module's symbols, or why they cannot be loaded.
    modules: Vec<Result<ModuleSymbols, String>>,
    /// Whether each module's failure to load was warned about.
    warned: Vec<bool>,
    cache: HashMap<(usize, u64), Box<[Location]>>,
    /// Python frames by process image (pid, start time) and frame word.
    python_cache: HashMap<(u32, u64, u64), Frame>,
    warnings: Vec<String>,
}

impl Symbolizer {
    /// A symbolizer with nothing loaded.
    pub fn new() -> Self {
        Self::default()
    }

    /// The frames for one recorded return `address` of `profile`, innermost first; one
    /// frame per inline level, at least one.
    pub fn frames(&mut self, profile: &Profile, address: u64) -> Vec<Frame> {
        self.frames_probing(profile, address, address.saturating_sub(1))
    }

    /// Like [`Symbolizer::frames`] for the address of an instruction itself (a crash's
    /// faulting instruction), which is looked up as is, not minus one.
    pub fn instruction_frames(&mut self, profile: &Profile, address: u64) -> Vec<Frame> {
        self.frames_probing(profile, address, address)
    }

    /// The frames of `address`, found by looking up `call`.
    fn frames_probing(&mut self, profile: &Profile, address: u64, call: u64) -> Vec<Frame> {
        self.frames_in(profile.module_at(call), address, call, Use::Report)
    }

    /// Like [`Symbolizer::frames`] for a return `address` in `module` (the module holding
    /// it, or `None`), ahead of the report: a module whose symbols cannot be loaded is
    /// noted, but warned about only when the report itself needs it.
    pub fn frames_ahead(&mut self, module: Option<&Module>, address: u64) -> Vec<Frame> {
        self.frames_in(module, address, address.saturating_sub(1), Use::Ahead)
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
        let Ok(symbols) = &self.modules[index] else {
            return unknown(name);
        };
        let locations = self
            .cache
            .entry((index, probe))
            .or_insert_with(|| symbols.locate(probe).into());
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

    /// The frame of a Python frame word of `profile` (code record `code`; `value` is the
    /// instruction offset in code units, or the line when `line_resolved`).
    pub fn python_frame(
        &mut self,
        profile: &Profile,
        code: u32,
        value: u32,
        line_resolved: bool,
    ) -> Frame {
        let word = memwarden_abi::python::python_frame(code, value, line_resolved);
        self.python_cache
            .entry((profile.pid, profile.start_monotonic_ns, word))
            .or_insert_with(|| python::python_frame(profile, code, value, line_resolved))
            .clone()
    }

    /// One line per module whose symbols could not be loaded, saying why.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The index of `module`'s symbols, loading them the first time. A module that cannot
    /// be loaded gets its warning the first time the report (not the look-ahead) uses it.
    fn module_index(&mut self, module: &Module, by: Use) -> usize {
        let key = (module.path.clone(), module.build_id.clone());
        let index = match self.index.get(&key) {
            Some(&index) => index,
            None => {
                let index = self.modules.len();
                self.modules.push(ModuleSymbols::open(module));
                self.warned.push(false);
                self.index.insert(key, index);
                index
            }
        };
        if let (Use::Report, Err(reason)) = (by, &self.modules[index]) {
            if !std::mem::replace(&mut self.warned[index], true) {
                let shown = if module.path.is_empty() {
                    "a module"
                } else {
                    &module.path
                };
                self.warnings
                    .push(format!("no symbols for {shown}: {reason}"));
            }
        }
        index
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
