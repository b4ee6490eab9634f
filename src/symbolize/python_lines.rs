//! Symbolization, Python part: the line of an instruction, from CPython 3.11+'s location
//! table (`co_linetable`, PEP 657; format in CPython's `Objects/locations.md`).
//!
//! The table is a run of entries, each covering 1–8 code units (`_Py_CODEUNIT`, 2 bytes):
//!
//! ```text
//! first byte: 1 cccc lll   (bit 7 set; c = code, l = length − 1 in code units)
//! code 0–9    short form: line delta 0, then 1 column byte
//! code 10–12  one-line form: line delta = code − 10, then 2 column bytes
//! code 13     no columns: signed varint line delta
//! code 14     long form: signed varint line delta, varint end-line delta, 2 varint columns
//! code 15     no location: the instructions have no line (the running line is unchanged)
//! ```
//!
//! Varints are 6-bit chunks, least significant first, bit 6 set on every chunk but the
//! last; a signed varint keeps the sign in its lowest bit. The running line starts at
//! `co_firstlineno`. A table that ends early or is malformed (a running line past
//! `i64::MAX` too) gives no line, never a panic.

/// The line of the instruction at `offset` (in code units) of a code object whose first
/// line is `first_line` and whose location table is `table`; `None` when the table gives
/// that instruction no line (code 15), does not reach it, or is malformed.
pub fn line_at(table: &[u8], first_line: i32, offset: u32) -> Option<u32> {
    entries(table, first_line)
        .find(|entry| u64::from(offset) < entry.end)
        .and_then(|entry| entry.line)
}

/// A code object's location table decoded once, so that the line of each of its
/// instructions is a binary search rather than a walk of the table from its start: a
/// module's top-level code runs to thousands of entries, and the report asks for the
/// line of each instruction a stack was recorded at.
#[derive(Debug, Default)]
pub struct LineIndex {
    /// One past the last code unit of each entry, increasing.
    ends: Vec<u64>,
    /// The line of each entry's instructions.
    lines: Vec<Option<u32>>,
}

impl LineIndex {
    /// Every entry of `table` up to its end or to where it is malformed.
    pub fn new(table: &[u8], first_line: i32) -> LineIndex {
        let (ends, lines) = entries(table, first_line)
            .map(|entry| (entry.end, entry.line))
            .unzip();
        LineIndex { ends, lines }
    }

    /// What [`line_at`] gives for `offset` on the table this index was made from.
    pub fn line_at(&self, offset: u32) -> Option<u32> {
        let entry = self.ends.partition_point(|&end| end <= u64::from(offset));
        self.lines.get(entry).copied().flatten()
    }
}

/// One entry of a location table: the code units it covers end at `end`, and run `line`.
struct Entry {
    end: u64,
    line: Option<u32>,
}

/// The entries of `table` in order, up to its end or to the first malformed one (the
/// running line overflowing too).
fn entries(table: &[u8], first_line: i32) -> impl Iterator<Item = Entry> + '_ {
    let mut reader = Reader { table, at: 0 };
    let mut line = i64::from(first_line);
    let mut end = 0u64;
    std::iter::from_fn(move || {
        let first = reader.byte()?;
        if first & 0x80 == 0 {
            return None;
        }
        let code = (first >> 3) & 0x0f;
        let has_line = match code {
            0..=9 => {
                reader.byte()?;
                true
            }
            10..=12 => {
                line = line.checked_add(i64::from(code - 10))?;
                reader.byte()?;
                reader.byte()?;
                true
            }
            13 => {
                line = line.checked_add(reader.signed_varint()?)?;
                true
            }
            14 => {
                line = line.checked_add(reader.signed_varint()?)?;
                for _ in 0..3 {
                    reader.varint()?;
                }
                true
            }
            _ => false,
        };
        end += u64::from(first & 0x07) + 1;
        Some(Entry {
            end,
            line: if has_line {
                u32::try_from(line).ok()
            } else {
                None
            },
        })
    })
}

/// A cursor over the table's bytes.
struct Reader<'t> {
    table: &'t [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let byte = *self.table.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    /// An entry's extra bytes never have bit 7 set in a varint; a set bit 7 means the
    /// next entry began: the table is malformed.
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(6) {
            let byte = self.byte()?;
            if byte & 0x80 != 0 {
                return None;
            }
            value |= u64::from(byte & 0x3f) << shift;
            if byte & 0x40 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn signed_varint(&mut self) -> Option<i64> {
        let raw = self.varint()?;
        let magnitude = i64::try_from(raw >> 1).ok()?;
        Some(if raw & 1 != 0 { -magnitude } else { magnitude })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One code object as real CPython compiled it (testdata/python_lines.py).
    #[derive(serde::Deserialize)]
    struct Vector {
        python: String,
        qualname: String,
        first_line: i32,
        line_table: String,
        lines: Vec<Option<u32>>,
    }

    fn unhex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn every_instruction_of_real_code_objects_gets_cpythons_line() {
        let vectors: Vec<Vector> =
            serde_json::from_str(include_str!("testdata/python_lines.json")).unwrap();
        let versions: std::collections::BTreeSet<&str> =
            vectors.iter().map(|v| &v.python[..4]).collect();
        assert_eq!(
            versions.into_iter().collect::<Vec<_>>(),
            ["3.11", "3.12", "3.13"]
        );
        for v in &vectors {
            let table = unhex(&v.line_table);
            for (offset, &expected) in (0u32..).zip(&v.lines) {
                assert_eq!(
                    line_at(&table, v.first_line, offset),
                    expected,
                    "Python {} {} at code unit {offset}",
                    v.python,
                    v.qualname
                );
            }
            let past = v.lines.len() as u32;
            assert_eq!(line_at(&table, v.first_line, past), None);
        }
    }

    #[test]
    fn the_vectors_hold_every_entry_form() {
        let vectors: Vec<Vector> =
            serde_json::from_str(include_str!("testdata/python_lines.json")).unwrap();
        let mut seen = [false; 16];
        for v in &vectors {
            let table = unhex(&v.line_table);
            let mut reader = Reader {
                table: &table,
                at: 0,
            };
            while let Some(first) = reader.byte() {
                let code = (first >> 3) & 0x0f;
                seen[code as usize] = true;
                match code {
                    0..=9 => drop(reader.byte()),
                    10..=12 => drop((reader.byte(), reader.byte())),
                    13 => drop(reader.signed_varint()),
                    14 => drop((0..4).map(|_| reader.varint()).count()),
                    _ => {}
                }
            }
        }
        for code in [0, 10, 13, 14, 15] {
            assert!(seen[code], "no entry of code {code} in the vectors");
        }
    }

    #[test]
    fn varints_run_over_several_chunks_and_carry_their_sign() {
        // Code 13, 1 unit, delta -100: raw 201 = 0b11_001001 → chunks 0x49 | 0x40, 0x03.
        let table = [0x80 | (13 << 3), 0x49 | 0x40, 0x03, 0x80 | (10 << 3), 0, 0];
        assert_eq!(line_at(&table, 500, 0), Some(400));
        assert_eq!(line_at(&table, 500, 1), Some(400));
        // A line below zero is no line.
        assert_eq!(line_at(&table, 50, 0), None);
    }

    #[test]
    fn a_line_past_the_largest_is_no_line() {
        // Code 13 with the largest positive delta, 2^63 - 1: the running line overflowed.
        let mut table = vec![0x80 | (13 << 3), 0x3e | 0x40];
        table.extend([0x3f | 0x40; 9]);
        table.push(0x0f);
        assert_eq!(line_at(&table, 4, 0), None);
        // The same delta and then a one-line form's 2 past it.
        table[0] |= 1;
        table.extend([0x80 | (12 << 3), 0, 0]);
        assert_eq!(line_at(&table, -1, 2), None);
    }

    #[test]
    fn malformed_or_short_tables_give_no_line() {
        assert_eq!(line_at(&[], 1, 0), None);
        // A first byte without bit 7.
        assert_eq!(line_at(&[0x10, 0], 1, 0), None);
        // A short form without its column byte.
        assert_eq!(line_at(&[0x80], 1, 0), None);
        // A varint cut short, and one running into the next entry.
        assert_eq!(line_at(&[0x80 | (13 << 3), 0x41], 1, 0), None);
        assert_eq!(line_at(&[0x80 | (14 << 3), 0x02, 0x80], 1, 0), None);
        // A varint that never ends within 64 bits.
        let mut endless = vec![0x80 | (13 << 3)];
        endless.extend([0x7f; 12]);
        assert_eq!(line_at(&endless, 1, 0), None);
        // An instruction past the table.
        assert_eq!(line_at(&[0x80 | (10 << 3) | 1, 0, 0], 7, 2), None);
        assert_eq!(line_at(&[0x80 | (10 << 3) | 1, 0, 0], 7, 1), Some(7));
    }

    /// One entry to encode: its form, length in code units and line delta.
    #[derive(Clone, Debug)]
    enum Entry {
        Short(u8),
        OneLine(u8, u8),
        NoColumns(u8, i64),
        Long(u8, i64),
        NoLocation(u8),
    }

    fn varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x40 {
            out.push(0x40 | (value & 0x3f) as u8);
            value >>= 6;
        }
        out.push(value as u8);
    }

    fn signed(out: &mut Vec<u8>, value: i64) {
        let raw = (value.unsigned_abs() << 1) | u64::from(value < 0);
        varint(out, raw);
    }

    /// Encodes `entries` as CPython does, and gives the line of each code unit.
    fn encode(entries: &[Entry], first_line: i64) -> (Vec<u8>, Vec<Option<u32>>) {
        let (mut table, mut lines, mut line) = (Vec::new(), Vec::new(), first_line);
        for entry in entries {
            let head = |code: u8, length: u8| 0x80 | (code << 3) | (length - 1);
            let (length, has_line) = match *entry {
                Entry::Short(length) => {
                    table.extend([head(3, length), 0x12]);
                    (length, true)
                }
                Entry::OneLine(length, delta) => {
                    line += i64::from(delta);
                    table.extend([head(10 + delta, length), 4, 9]);
                    (length, true)
                }
                Entry::NoColumns(length, delta) => {
                    line += delta;
                    table.push(head(13, length));
                    signed(&mut table, delta);
                    (length, true)
                }
                Entry::Long(length, delta) => {
                    line += delta;
                    table.push(head(14, length));
                    signed(&mut table, delta);
                    for value in [3, 70, 5000] {
                        varint(&mut table, value);
                    }
                    (length, true)
                }
                Entry::NoLocation(length) => {
                    table.push(head(15, length));
                    (length, false)
                }
            };
            let shown = (has_line && line >= 0).then_some(line as u32);
            lines.extend(std::iter::repeat_n(shown, usize::from(length)));
        }
        (table, lines)
    }

    fn entry() -> impl proptest::strategy::Strategy<Value = Entry> {
        use proptest::prelude::*;
        let length = 1u8..=8;
        prop_oneof![
            length.clone().prop_map(Entry::Short),
            (length.clone(), 0u8..=2).prop_map(|(l, d)| Entry::OneLine(l, d)),
            (length.clone(), -5000i64..5000).prop_map(|(l, d)| Entry::NoColumns(l, d)),
            (length.clone(), -100_000i64..100_000).prop_map(|(l, d)| Entry::Long(l, d)),
            length.prop_map(Entry::NoLocation),
        ]
    }

    proptest::proptest! {
        #[test]
        fn encoded_tables_decode_to_their_lines(
            entries in proptest::collection::vec(entry(), 0..40),
            first_line in 0i32..100_000,
        ) {
            let (table, lines) = encode(&entries, i64::from(first_line));
            for (offset, &expected) in (0u32..).zip(&lines) {
                proptest::prop_assert_eq!(line_at(&table, first_line, offset), expected);
            }
            proptest::prop_assert_eq!(line_at(&table, first_line, lines.len() as u32), None);
        }

        #[test]
        fn the_index_gives_what_a_walk_of_the_table_gives(
            table in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            entries in proptest::collection::vec(entry(), 0..40),
            first_line in -3i32..100_000,
            offsets in proptest::collection::vec(0u32..400, 1..20),
        ) {
            // Well-formed tables, and any bytes (malformed ones, mostly).
            let (encoded, _) = encode(&entries, i64::from(first_line));
            for bytes in [&encoded, &table] {
                let index = LineIndex::new(bytes, first_line);
                for &offset in offsets.iter().chain(&[u32::MAX]) {
                    proptest::prop_assert_eq!(
                        index.line_at(offset),
                        line_at(bytes, first_line, offset)
                    );
                }
            }
        }

        #[test]
        fn any_bytes_give_a_line_or_none_never_a_panic(
            table in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            first_line in proptest::prelude::any::<i32>(),
            offset in proptest::prelude::any::<u32>(),
        ) {
            let _ = line_at(&table, first_line, offset);
        }
    }
}
