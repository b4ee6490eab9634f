//! Symbolization of one module: looks addresses up in its DWARF (inlined frames expanded)
//! and falls back to its function symbols.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use addr2line::{gimli, Loader};

use super::debug_file::{find_debug_file, find_supplementary, ElfFacts};
use super::symbol_table::SymbolTable;
use crate::profile::Module;

/// One source-level frame at an address: the innermost inline level comes first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Location {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub inlined: bool,
}

/// Why a module's symbols are not used when its file on disk is another build.
const FILE_CHANGED: &str = "build id differs from the run's: the file changed since";

/// The files a module's symbols come from, found without loading them: the module
/// itself, the file holding its DWARF (itself or a separate debug file) and the dwz
/// supplementary file that one refers to.
pub(crate) struct ModuleFiles {
    module: PathBuf,
    /// The module's build id when its files were found: loading checks it again.
    build_id: Option<Vec<u8>>,
    /// The file with the DWARF and its supplementary file, if any DWARF was found.
    dwarf: Option<(PathBuf, Option<PathBuf>)>,
    /// The separate debug file, whose symbol table is searched before the module's.
    debug_file: Option<PathBuf>,
}

impl ModuleFiles {
    /// Finds the files of `module`; the error says why its symbols cannot be used.
    pub fn find(module: &Module) -> Result<ModuleFiles, String> {
        if module.path.is_empty() {
            return Err("no path recorded".into());
        }
        let path = Path::new(&module.path);
        let facts = ElfFacts::read(path)?;
        if let (false, Some(on_disk)) = (module.build_id.is_empty(), &facts.build_id) {
            if *on_disk != module.build_id {
                return Err(FILE_CHANGED.into());
            }
        }
        // The DWARF is in the module itself, or in a separate debug file (whose symbol
        // table is then searched too), or nowhere.
        let (dwarf, debug_file) = if facts.has_dwarf {
            (
                Some((path.to_owned(), find_supplementary(path, &facts))),
                None,
            )
        } else {
            match find_debug_file(path, &facts) {
                Some((debug_path, debug_facts)) => {
                    let supplementary = find_supplementary(&debug_path, &debug_facts);
                    (Some((debug_path.clone(), supplementary)), Some(debug_path))
                }
                None => (None, None),
            }
        };
        Ok(ModuleFiles {
            module: path.to_owned(),
            build_id: facts.build_id,
            dwarf,
            debug_file,
        })
    }

    /// Every file the symbols are read from, each once.
    pub fn paths(&self) -> Vec<&Path> {
        let mut paths = vec![self.module.as_path()];
        if let Some((dwarf, supplementary)) = &self.dwarf {
            paths.push(dwarf);
            paths.extend(supplementary.as_deref());
        }
        paths.dedup();
        paths
    }
}

/// The debug information of a module, loaded once.
pub(crate) struct ModuleSymbols {
    /// DWARF: in the module itself or in its separate debug file.
    dwarf: Option<Loader>,
    /// Function symbols, searched in order: the debug file's, then the module's.
    tables: Vec<SymbolTable>,
}

impl ModuleSymbols {
    /// Loads the symbols from `files` (this is where a module's debug sections are read and
    /// inflated); the error says why they cannot be used.
    pub fn load(files: &ModuleFiles) -> Result<ModuleSymbols, String> {
        // Loading may come long after the files were found (the cache folder answered
        // until then): a module rebuilt meanwhile must not be read for the old one.
        if ElfFacts::read(&files.module)?.build_id != files.build_id {
            return Err(FILE_CHANGED.into());
        }
        let dwarf = match &files.dwarf {
            Some((path, supplementary)) => Some(
                Loader::new_with_sup(path, supplementary.as_deref()).map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        let mut tables: Vec<SymbolTable> = files
            .debug_file
            .iter()
            .map(|p| SymbolTable::read(p))
            .collect();
        tables.push(SymbolTable::read(&files.module));
        Ok(ModuleSymbols { dwarf, tables })
    }

    /// The frames at `probe`, an address as stated in the ELF file; never empty.
    pub fn locate(&self, probe: u64) -> Vec<Location> {
        let mut locations = self
            .dwarf
            .as_ref()
            .map(|loader| dwarf_frames(loader, probe))
            .unwrap_or_default();
        if locations.is_empty() {
            locations.push(Location::default());
        }
        let outermost = locations.len() - 1;
        let outer = &mut locations[outermost];
        outer.inlined = false;
        if outer.function.is_none() {
            outer.function = self
                .tables
                .iter()
                .find_map(|table| table.lookup(probe))
                .map(|name| demangle(name, None));
        }
        locations
    }
}

/// Every inline level DWARF knows at `probe`, innermost first, all marked inlined.
fn dwarf_frames(loader: &Loader, probe: u64) -> Vec<Location> {
    let mut locations = Vec::new();
    let Ok(mut frames) = loader.find_frames(probe) else {
        return locations;
    };
    while let Ok(Some(frame)) = frames.next() {
        let function = frame.function.as_ref().and_then(|f| {
            let raw = f.raw_name().ok()?;
            Some(demangle(&raw, f.language))
        });
        let (file, line) = frame
            .location
            .map_or((None, None), |l| (l.file.map(str::to_owned), l.line));
        locations.push(Location {
            function,
            file,
            line,
            inlined: true,
        });
    }
    locations
}

/// Demangles C++ and Rust names. The DWARF language is tried first; a name that still
/// looks mangled (a language code newer than the demangler knows) is tried by its prefix.
pub(crate) fn demangle(raw: &str, language: Option<gimli::DwLang>) -> String {
    let by_language = addr2line::demangle_auto(Cow::Borrowed(raw), language);
    let looks_mangled = raw.starts_with("_Z") || raw.starts_with("_R");
    if by_language == raw && looks_mangled && language.is_some() {
        addr2line::demangle_auto(Cow::Borrowed(raw), None).into_owned()
    } else {
        by_language.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_cpp_and_rust_and_leaves_c_alone() {
        assert_eq!(demangle("_ZN3foo3barEv", None), "foo::bar()");
        assert_eq!(
            demangle("_ZN3foo3bar17h0123456789abcdefE", None),
            "foo::bar"
        );
        assert_eq!(demangle("_RNvCs1234_3foo3bar", None), "foo::bar");
        assert_eq!(demangle("main", None), "main");
        // DW_LANG_C_plus_plus_17 (0x2a) is newer than the demangler's language table.
        assert_eq!(demangle("_Z4workv", Some(gimli::DwLang(0x2a))), "work()");
    }
}
