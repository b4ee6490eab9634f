//! The store, Python part: how a Python frame is written into a stack's frame words, and
//! the code records (file, function, line table) those frames point to.
//!
//! A stack's frames run innermost first. Native frames are return addresses, which on
//! x86-64 Linux are user-space addresses below 2^47, so the top two bits of a frame word
//! are free to tag the other kinds:
//!
//! ```text
//! 0b0…  native return address
//! 0b10  Python frame: bit 61 = LINE_RESOLVED, bits 60..32 = code record index,
//!       bits 31..0 = instruction offset in code units (or the line, if LINE_RESOLVED)
//! 0b11  marker: NUMPY_DATA (as frame 0: the block is NumPy array data, allocated through
//!       memwarden's data-memory handler), PYMALLOC_ARENAS (the only frame: the stack
//!       every pymalloc arena is charged to), or INTERPRETER_FRAMES_LEFT_OUT (in place of
//!       the middle of a long run of the interpreter's frames below a Python frame)
//! ```
//!
//! The preload copies each code object's file name, function names and line table into the
//! blob area once, the first time a stack holds it, and writes the instruction offset per
//! frame; the reader turns offsets into lines. Python never runs for that, and nothing is
//! looked up while the program allocates.

/// Mask of the tag bits.
pub const TAG_MASK: u64 = 0b11 << 62;
/// Tag of a Python frame.
pub const PYTHON_TAG: u64 = 0b10 << 62;
/// Tag of a marker word.
pub const MARKER_TAG: u64 = 0b11 << 62;
/// In a Python frame: the low 32 bits hold the line itself, not an instruction offset
/// (Pythons whose line tables the reader does not decode).
pub const LINE_RESOLVED: u64 = 1 << 61;
/// Bits of the code record index.
pub const CODE_INDEX_BITS: u32 = 29;
/// Largest code record index a frame word can hold.
pub const MAX_CODE_INDEX: u32 = (1 << CODE_INDEX_BITS) - 1;
/// Marker, frame 0 of a stack: NumPy array data.
pub const NUMPY_DATA: u64 = MARKER_TAG | 1;
/// Marker, the one frame of the stack that pymalloc's arenas (the mappings CPython serves
/// objects under 512 bytes from) are charged to, whoever made the object that opened them.
pub const PYMALLOC_ARENAS: u64 = MARKER_TAG | 2;
/// Marker, in place of the interpreter's frames left out of a long run of them.
pub const INTERPRETER_FRAMES_LEFT_OUT: u64 = MARKER_TAG | 3;

/// One frame word, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameWord {
    /// A native return address (or, for a crash's frame 0, an instruction address).
    Native(u64),
    /// A Python frame.
    Python {
        /// Index of its [`CodeRecord`].
        code: u32,
        /// The instruction offset in code units, or the line if `line_resolved`.
        value: u32,
        /// Whether `value` is already a line.
        line_resolved: bool,
    },
    /// A marker word ([`NUMPY_DATA`], [`PYMALLOC_ARENAS`], [`INTERPRETER_FRAMES_LEFT_OUT`]).
    Marker(u64),
}

/// Encodes a Python frame; `code` must be at most [`MAX_CODE_INDEX`].
pub const fn python_frame(code: u32, value: u32, line_resolved: bool) -> u64 {
    let resolved = if line_resolved { LINE_RESOLVED } else { 0 };
    PYTHON_TAG | resolved | ((code as u64 & MAX_CODE_INDEX as u64) << 32) | value as u64
}

/// Decodes a frame word.
pub const fn decode(word: u64) -> FrameWord {
    match word & TAG_MASK {
        PYTHON_TAG => FrameWord::Python {
            code: ((word >> 32) & MAX_CODE_INDEX as u64) as u32,
            value: word as u32,
            line_resolved: word & LINE_RESOLVED != 0,
        },
        MARKER_TAG => FrameWord::Marker(word),
        _ => FrameWord::Native(word),
    }
}

/// Codes of [`crate::StackRecord::category`], as the preload sets them.
pub mod category {
    /// Anything not below: the reader tells interpreter objects (`python`) from other
    /// native allocations by the module of the innermost frame.
    pub const NATIVE: u32 = 0;
    /// NumPy array data, allocated through memwarden's data-memory handler.
    pub const NUMPY: u32 = 1;
}

/// Codes of [`CodeRecord::line_table_kind`].
pub mod line_table {
    /// No table: frames of this code carry resolved lines.
    pub const NONE: u32 = 0;
    /// CPython 3.11+ location table (`co_linetable`, PEP 657), indexed by code unit.
    pub const LOCATIONS_311: u32 = 1;
}

/// Bytes in the blob area: `len` bytes from byte `start` of the area.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlobSpan {
    /// First byte, relative to the blob area.
    pub start: u32,
    /// Length in bytes.
    pub len: u32,
}

/// A Python code object (a function, a module body, a class body…) seen in a stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CodeRecord {
    /// Non-zero once the other fields and their blob bytes are written.
    pub published: u32,
    /// One of [`line_table`]: how to read `line_table`.
    pub line_table_kind: u32,
    /// `co_firstlineno`.
    pub first_line: i32,
    /// Reserved, zero.
    pub reserved0: u32,
    /// `co_filename`, UTF-8.
    pub filename: BlobSpan,
    /// `co_name`, UTF-8.
    pub name: BlobSpan,
    /// `co_qualname` (3.11+; else the same as `name`), UTF-8.
    pub qualname: BlobSpan,
    /// `co_linetable`'s bytes.
    pub line_table: BlobSpan,
    /// Reserved, zero.
    pub reserved: [u64; 2],
}

const _: () = assert!(core::mem::size_of::<CodeRecord>() == 64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_words_round_trip_and_never_look_native() {
        for (code, value, resolved) in [
            (0, 0, false),
            (MAX_CODE_INDEX, u32::MAX, true),
            (7, 42, false),
        ] {
            let word = python_frame(code, value, resolved);
            assert_eq!(
                decode(word),
                FrameWord::Python {
                    code,
                    value,
                    line_resolved: resolved
                }
            );
        }
        assert_eq!(
            decode(0x7fff_ffff_f000),
            FrameWord::Native(0x7fff_ffff_f000)
        );
        assert_eq!(decode(NUMPY_DATA), FrameWord::Marker(NUMPY_DATA));
    }
}
