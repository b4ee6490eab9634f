//! Analysis, Python part: which module is the Python interpreter, what kind of memory each
//! stack holds (NumPy array data, interpreter objects, or other native memory), and a
//! process's NumPy array figures. Functions of a profile alone, like the rest of analysis
//! (a stack's category is worked out with what is known of its words memoized).

use memwarden_abi::python::{self, category, FrameWord, NUMPY_DATA, PYMALLOC_ARENAS};
use serde::{Deserialize, Serialize};

use crate::profile::{module_at, Module, Profile, Stack};
use crate::word_map::WordMap;

/// File-name prefix of the profiler's own modules, whose frames never count.
const PROFILER_MODULE_PREFIX: &str = "libmemwarden";

/// What a stack's blocks are.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    /// Anything else: memory the program's native code (or a library) asked for.
    #[default]
    Native,
    /// Interpreter objects: the innermost native frame is in the Python interpreter.
    Python,
    /// NumPy array data, allocated through memwarden's data-memory handler.
    Numpy,
}

impl Category {
    /// Its name in report.json, as serde writes it.
    pub fn name(self) -> &'static str {
        match self {
            Category::Native => "native",
            Category::Python => "python",
            Category::Numpy => "numpy",
        }
    }
}

/// NumPy array data in one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumpyFigures {
    /// Bytes of array data live at the process's peak.
    pub peak_bytes: u64,
    /// Array data buffers live at the process's peak.
    pub peak_blocks: u64,
    /// Bytes of array data still live at exit.
    pub not_freed_bytes: u64,
    /// Array data buffers still live at exit.
    pub not_freed_blocks: u64,
}

/// The last component of a path.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether `module` is the Python interpreter: a `libpython*.so*`, or the main executable
/// when it is named `python*`.
pub fn is_interpreter(module: &Module) -> bool {
    let name = file_name(&module.path);
    (name.starts_with("libpython") && name.contains(".so"))
        || (module.is_main() && name.starts_with("python"))
}

/// Whether `module` is the profiler's own (`libmemwarden*`).
pub fn is_profiler(module: &Module) -> bool {
    file_name(&module.path).starts_with(PROFILER_MODULE_PREFIX)
}

/// The module of `modules` (sorted by start) holding the call of native frame word
/// `word`, `None` for other words and for addresses in no module. Return addresses are
/// looked up one byte before.
pub fn module_of_word(modules: &[Module], word: u64) -> Option<&Module> {
    match python::decode(word) {
        FrameWord::Native(address) => module_at(modules, address.wrapping_sub(1)),
        _ => None,
    }
}

/// What holds a frame word's code, as far as a stack's category and the frames a report
/// leaves out go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    /// The profiler's own library.
    Profiler,
    /// The Python interpreter.
    Interpreter,
    /// Anything else, a Python frame or a marker.
    Other,
}

impl Holder {
    /// What `module` (the module of a native word, if any) is.
    pub(crate) fn of(module: Option<&Module>) -> Holder {
        match module {
            Some(module) if is_profiler(module) => Holder::Profiler,
            Some(module) if is_interpreter(module) => Holder::Interpreter,
            _ => Holder::Other,
        }
    }
}

/// The categories of one profile's stacks. The module of each native word is found and
/// classified once, not once per stack: stacks share their innermost words, and finding a
/// word's module scans the modules loaded below it.
pub struct Categories<'p> {
    profile: &'p Profile,
    holders: WordMap<u64, Holder>,
}

impl<'p> Categories<'p> {
    /// Nothing classified yet, for the stacks of `profile`.
    pub fn new(profile: &'p Profile) -> Self {
        Categories {
            profile,
            holders: WordMap::default(),
        }
    }

    /// The category of `stack`: `numpy` when the preload tagged it (the record's category
    /// or the `NUMPY_DATA` marker as frame 0); `python` for pymalloc's arenas (the
    /// `PYMALLOC_ARENAS` marker) and when its innermost native frame
    /// outside the profiler is in the interpreter; `native` otherwise.
    pub fn of(&mut self, stack: &Stack) -> Category {
        if stack.record.category == category::NUMPY || stack.frames.first() == Some(&NUMPY_DATA) {
            return Category::Numpy;
        }
        if stack.frames.first() == Some(&PYMALLOC_ARENAS) {
            return Category::Python;
        }
        let profile = self.profile;
        let innermost = stack
            .frames
            .iter()
            .filter(|&&word| matches!(python::decode(word), FrameWord::Native(_)))
            .map(|&word| {
                *self
                    .holders
                    .entry(word)
                    .or_insert_with(|| Holder::of(module_of_word(&profile.modules, word)))
            })
            .find(|holder| !matches!(holder, Holder::Profiler));
        match innermost {
            Some(Holder::Interpreter) => Category::Python,
            _ => Category::Native,
        }
    }
}

#[cfg(test)]
mod tests {
    use memwarden_abi::python::python_frame;
    use memwarden_abi::MODULE_MAIN;

    use super::*;
    use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticCode, SyntheticModule};

    const PYTHON: u64 = 0x1000_0000;
    const LIBPYTHON: u64 = 0x2000_0000;
    const LIBC: u64 = 0x3000_0000;
    const PROFILER: u64 = 0x4000_0000;
    const NUMPY: u64 = 0x5000_0000;

    fn profile(main: &str, stacks: &[(&[u64], u32)]) -> Profile {
        let mut builder = ProfileBuilder::new(1)
            .python_code(SyntheticCode::default())
            .module(SyntheticModule::at(main, PYTHON, MODULE_MAIN))
            .module(SyntheticModule::at(
                "/usr/lib/libpython3.11.so.1.0",
                LIBPYTHON,
                0,
            ))
            .module(SyntheticModule::at("/lib/libc.so.6", LIBC, 0))
            .module(SyntheticModule::at("/opt/libmemwarden.so", PROFILER, 0))
            .module(SyntheticModule::at(
                "/np/_multiarray_umath.cpython-311.so",
                NUMPY,
                0,
            ));
        for &(frames, kind) in stacks {
            let mut record = stack_record();
            record.category = kind;
            builder = builder.stack(frames, record);
        }
        builder.build_profile()
    }

    fn categories(profile: &Profile) -> Vec<Category> {
        let mut categories = Categories::new(profile);
        profile.stacks[1..]
            .iter()
            .map(|s| categories.of(s))
            .collect()
    }

    #[test]
    fn numpy_data_is_told_by_the_marker_or_the_record() {
        let py = python_frame(0, 0, true);
        let p = profile(
            "/usr/bin/python3.11",
            &[
                (&[NUMPY_DATA, PROFILER + 8, NUMPY + 8, py], category::NATIVE),
                (&[NUMPY + 8, py], category::NUMPY),
            ],
        );
        assert_eq!(categories(&p), [Category::Numpy, Category::Numpy]);
    }

    #[test]
    fn pymalloc_arenas_are_python_objects() {
        let p = profile(
            "/usr/bin/python3.11",
            &[(&[PYMALLOC_ARENAS], category::NATIVE)],
        );
        assert_eq!(categories(&p), [Category::Python]);
    }

    #[test]
    fn interpreter_objects_are_told_by_the_innermost_native_frame() {
        let py = python_frame(0, 0, true);
        let p = profile(
            "/usr/bin/python3.11",
            &[
                // PyObject_Malloc in the executable, through the profiler's own frame.
                (&[PROFILER + 8, PYTHON + 8, py], 0),
                (&[LIBPYTHON + 8, LIBPYTHON + 16], 0),
                // strdup in libc, called by the interpreter: native.
                (&[LIBC + 8, PYTHON + 8, py], 0),
                (&[NUMPY + 8, PYTHON + 8], 0),
                // No module at all.
                (&[0x99], 0),
            ],
        );
        assert_eq!(
            categories(&p),
            [
                Category::Python,
                Category::Python,
                Category::Native,
                Category::Native,
                Category::Native
            ]
        );
    }

    #[test]
    fn a_main_executable_not_named_python_is_not_the_interpreter() {
        let p = profile("/usr/bin/prog", &[(&[PYTHON + 8], 0)]);
        assert_eq!(categories(&p), [Category::Native]);
        assert!(!is_interpreter(&p.modules[0]));
        assert!(is_interpreter(&p.modules[1]));
    }
}
