//! Symbolization's fallback when a module has no DWARF for an address: its ELF function
//! symbols (`.symtab`, else `.dynsym`), matched only within each symbol's size so that an
//! address in a stripped function is not blamed on the exported one before it.

use std::path::Path;

use object::{Object, ObjectSymbol, SymbolKind};

use super::debug_file::mapped;

/// One function symbol.
#[derive(Debug, PartialEq, Eq)]
struct Symbol {
    address: u64,
    size: u64,
    name: String,
}

/// The function symbols of one ELF file, by address.
#[derive(Debug, Default)]
pub(crate) struct SymbolTable {
    symbols: Vec<Symbol>,
}

impl SymbolTable {
    /// The function symbols of the file at `path`; empty if it cannot be read.
    pub fn read(path: &Path) -> SymbolTable {
        let Ok(data) = mapped(path) else {
            return SymbolTable::default();
        };
        let Ok(object) = object::File::parse(&*data) else {
            return SymbolTable::default();
        };
        let mut symbols = functions(object.symbols());
        if symbols.is_empty() {
            symbols = functions(object.dynamic_symbols());
        }
        SymbolTable::from_symbols(symbols)
    }

    fn from_symbols(mut symbols: Vec<Symbol>) -> SymbolTable {
        symbols.sort_by(|a, b| (a.address, &a.name).cmp(&(b.address, &b.name)));
        SymbolTable { symbols }
    }

    /// The raw name of the function holding `probe`: the symbol at or below it whose size
    /// covers it (a symbol of unknown size covers up to the next symbol).
    pub fn lookup(&self, probe: u64) -> Option<&str> {
        let after = self.symbols.partition_point(|s| s.address <= probe);
        let below = &self.symbols[..after];
        let nearest = below.last()?.address;
        below
            .iter()
            .rev()
            .take_while(|s| s.address == nearest)
            .find(|s| s.size == 0 || probe - s.address < s.size)
            .map(|s| s.name.as_str())
    }
}

/// The defined function symbols among `symbols`.
fn functions<'data, S: ObjectSymbol<'data>>(symbols: impl Iterator<Item = S>) -> Vec<Symbol> {
    symbols
        .filter(|s| s.is_definition() && s.kind() == SymbolKind::Text && s.address() != 0)
        .filter_map(|s| {
            Some(Symbol {
                address: s.address(),
                size: s.size(),
                name: s.name().ok()?.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(symbols: &[(u64, u64, &str)]) -> SymbolTable {
        SymbolTable::from_symbols(
            symbols
                .iter()
                .map(|&(address, size, name)| Symbol {
                    address,
                    size,
                    name: name.to_owned(),
                })
                .collect(),
        )
    }

    #[test]
    fn an_address_is_matched_only_within_a_symbols_size() {
        let t = table(&[
            (0x2000, 0x10, "b"),
            (0x1000, 0x100, "a"),
            (0x3000, 0, "asm"),
        ]);
        assert_eq!(t.lookup(0x0fff), None);
        assert_eq!(t.lookup(0x1000), Some("a"));
        assert_eq!(t.lookup(0x10ff), Some("a"));
        assert_eq!(t.lookup(0x1100), None, "past a's end: stripped code, not a");
        assert_eq!(t.lookup(0x200f), Some("b"));
        assert_eq!(t.lookup(0x2010), None);
        assert_eq!(
            t.lookup(0x3456),
            Some("asm"),
            "unknown size reaches the next symbol"
        );
    }

    #[test]
    fn of_aliases_at_one_address_the_one_that_covers_wins() {
        let t = table(&[(0x1000, 0x8, "short"), (0x1000, 0x80, "long")]);
        assert_eq!(t.lookup(0x1004), Some("short"));
        assert_eq!(t.lookup(0x1040), Some("long"));
    }

    #[test]
    fn reads_the_test_binary_and_tolerates_missing_files() {
        let exe = std::env::current_exe().unwrap();
        let t = SymbolTable::read(&exe);
        assert!(t.symbols.iter().any(|s| s.name.contains("symbol_table")));
        assert!(SymbolTable::read(Path::new("/nonexistent"))
            .symbols
            .is_empty());
    }
}
