//! Interposed call → event (fault-injection filters): names for addresses in this process —
//! the function from each module's ELF symbol tables (`.symtab`, else `.dynsym`), demangled,
//! and the source file from its DWARF line table (addr2line), both read from the files on
//! disk. Used once per unique stack when a `--fail` rule filters by function or file name;
//! never on the hot path.

use std::collections::HashMap;

/// A function symbol: start address (module-relative), size, name.
struct Function {
    start: u64,
    size: u64,
    name: Vec<u8>,
}

/// The function symbols of one module, sorted by start.
pub struct ModuleFunctions {
    functions: Vec<Function>,
}

impl ModuleFunctions {
    /// The name of the function containing module-relative `offset`.
    pub fn name_at(&self, offset: u64) -> Option<&[u8]> {
        let after = self.functions.partition_point(|f| f.start <= offset);
        let function = self.functions.get(after.checked_sub(1)?)?;
        let inside = offset < function.start.saturating_add(function.size.max(1));
        inside.then_some(function.name.as_slice())
    }
}

/// Symbol tables and line tables loaded so far, by module path.
#[derive(Default)]
pub struct SymbolCache {
    modules: HashMap<Vec<u8>, Option<ModuleFunctions>>,
    lines: HashMap<Vec<u8>, Option<addr2line::Loader>>,
}

impl SymbolCache {
    /// The demangled name of the function at `offset` in the module file at `path`.
    pub fn function_name(&mut self, path: &[u8], offset: u64) -> Option<String> {
        let functions = self
            .modules
            .entry(path.to_vec())
            .or_insert_with(|| read_file(path).and_then(|bytes| parse(&bytes)));
        let raw = String::from_utf8_lossy(functions.as_ref()?.name_at(offset)?).into_owned();
        Some(addr2line::demangle_auto(raw.into(), None).into_owned())
    }

    /// The source file of the code at `offset` in the module file at `path`, where the
    /// module carries DWARF line information.
    pub fn file_name(&mut self, path: &[u8], offset: u64) -> Option<String> {
        let loader = self.lines.entry(path.to_vec()).or_insert_with(|| {
            use std::os::unix::ffi::OsStrExt;
            addr2line::Loader::new(std::ffi::OsStr::from_bytes(path)).ok()
        });
        let location = loader.as_ref()?.find_location(offset).ok()??;
        location.file.map(str::to_owned)
    }
}

fn read_file(path: &[u8]) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    std::fs::read(std::ffi::OsStr::from_bytes(path)).ok()
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        bytes.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;

/// A section header: type, file offset, size, link, entry size.
struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: usize,
    entry_size: usize,
}

/// Parses a 64-bit little-endian ELF file's function symbols; every offset and size is
/// checked against the file, so a damaged file gives `None`, never a panic.
fn parse(bytes: &[u8]) -> Option<ModuleFunctions> {
    if bytes.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let section_offset = usize::try_from(u64_at(bytes, 0x28)?).ok()?;
    let section_size = usize::from(u16_at(bytes, 0x3a)?);
    let section_count = usize::from(u16_at(bytes, 0x3c)?);
    let section = |index: usize| -> Option<Section> {
        let at = section_offset.checked_add(index.checked_mul(section_size)?)?;
        Some(Section {
            kind: u32_at(bytes, at + 4)?,
            offset: usize::try_from(u64_at(bytes, at + 0x18)?).ok()?,
            size: usize::try_from(u64_at(bytes, at + 0x20)?).ok()?,
            link: u32_at(bytes, at + 0x28)? as usize,
            entry_size: usize::try_from(u64_at(bytes, at + 0x38)?).ok()?,
        })
    };
    let sections: Vec<Section> = (0..section_count).filter_map(section).collect();
    let table = sections
        .iter()
        .find(|s| s.kind == SHT_SYMTAB)
        .or_else(|| sections.iter().find(|s| s.kind == SHT_DYNSYM))?;
    let strings = sections.get(table.link)?;
    let string_bytes = bytes.get(strings.offset..strings.offset.checked_add(strings.size)?)?;
    if table.entry_size < 24 {
        return None;
    }
    let mut functions = Vec::new();
    for index in 0..table.size / table.entry_size {
        let at = table.offset.checked_add(index * table.entry_size)?;
        let info = *bytes.get(at + 4)?;
        let kind = info & 0xf;
        let value = u64_at(bytes, at + 8)?;
        if (kind != STT_FUNC && kind != STT_GNU_IFUNC) || value == 0 {
            continue;
        }
        let name_at = u32_at(bytes, at)? as usize;
        let name_bytes = string_bytes.get(name_at..)?;
        let name = &name_bytes[..name_bytes.iter().position(|&b| b == 0)?];
        functions.push(Function {
            start: value,
            size: u64_at(bytes, at + 16)?,
            name: name.to_vec(),
        });
    }
    functions.sort_by_key(|f| f.start);
    Some(ModuleFunctions { functions })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_names_its_own_functions() {
        let path = std::fs::read_link("/proc/self/exe").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let functions = parse(&bytes).expect("an ELF file with a symbol table");
        assert!(functions
            .functions
            .iter()
            .any(|f| f.name.ends_with(b"main")));
        // The linker may fold identical functions into one address: any name there will do.
        let first = &functions.functions[functions.functions.len() / 2];
        let named = functions
            .name_at(first.start)
            .expect("a name at a function's start");
        assert!(functions
            .functions
            .iter()
            .any(|f| f.start == first.start && f.name.as_slice() == named));
    }

    #[test]
    fn damaged_files_are_refused() {
        assert!(parse(b"").is_none());
        assert!(parse(b"\x7fELF\x02\x01\0\0").is_none());
        let mut bytes = std::fs::read("/proc/self/exe").unwrap();
        bytes.truncate(4096);
        assert!(parse(&bytes).is_none());
    }
}
