//! Interposed call → event (Python): where CPython keeps what a stack needs — the thread's
//! current frame, each frame's code object and instruction, each code object's names and
//! line table — as byte offsets per CPython version, read from the headers of each release
//! (`Include/internal/pycore_frame.h`, `pycore_code.h`, `cpython/unicodeobject.h`) and
//! checked against them by a test that compiles with those headers.
//!
//! Only layouts written here are read; any other Python runs unprofiled at the Python level
//! (its native frames are still recorded), which `memwarden run` reports once.

/// How a thread state reaches its innermost frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CurrentFrame {
    /// `tstate->cframe->current_frame` (3.11, 3.12): the two offsets.
    ThroughCFrame { cframe: usize, current_frame: usize },
    /// `tstate->current_frame` (3.13).
    Direct { current_frame: usize },
    /// `tstate->frame`, a chain of `PyFrameObject`s (3.9, 3.10): each native evaluation
    /// call runs one frame, and a frame's `f_lasti` counts `lasti_scale` bytes per unit.
    FrameObjects { frame: usize, lasti_scale: u64 },
}

/// How the frames of one native `_PyEval_EvalFrameDefault` call are told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryMark {
    /// A `bool is_entry` at this offset is set on the first frame of each call (3.11).
    IsEntryFlag(usize),
    /// Each call pushes a shim frame owned by the C stack first (3.12+).
    CStackOwner,
    /// Each call runs exactly one frame (3.9, 3.10).
    EveryFrame,
}

/// The offsets memwarden reads in one CPython minor version (x86-64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyLayout {
    /// `(major << 8) | minor`, e.g. 0x030b.
    pub version: u32,
    pub current_frame: CurrentFrame,
    pub entry: EntryMark,
    /// `_PyInterpreterFrame`: code object, previous frame, instruction pointer, owner.
    pub frame_code: usize,
    pub frame_previous: usize,
    pub frame_instruction: usize,
    pub frame_owner: usize,
    /// `PyCodeObject` fields. Before 3.11 there is no qualified name (the name's offset is
    /// given) and the line table is not copied (`code_line_table` is `None`): lines are
    /// looked up as frames are recorded.
    pub code_first_line: usize,
    pub code_filename: usize,
    pub code_name: usize,
    pub code_qualname: usize,
    pub code_line_table: Option<usize>,
    pub code_first_traceable: usize,
    pub code_units: usize,
    /// `PyASCIIObject` size (where an ASCII string's bytes start).
    pub ascii_size: usize,
    /// `PyCompactUnicodeObject` size (where a compact non-ASCII string's data starts).
    pub compact_size: usize,
    /// `PyCompactUnicodeObject`: its cached UTF-8 pointer and length.
    pub compact_utf8: usize,
    pub compact_utf8_length: usize,
}

/// Fields shared by every supported version.
pub const OBJECT_TYPE: usize = 8;
pub const VAR_SIZE: usize = 16;
pub const BYTES_DATA: usize = 32;
pub const UNICODE_LENGTH: usize = 16;
pub const UNICODE_STATE: usize = 32;
/// `state` bits: kind (1, 2 or 4 bytes per character), compact, ascii.
pub const STATE_KIND_SHIFT: u32 = 2;
pub const STATE_KIND_MASK: u32 = 0b111;
pub const STATE_COMPACT: u32 = 1 << 5;
pub const STATE_ASCII: u32 = 1 << 6;
/// Frame owners (`enum _frameowner`).
pub const OWNED_BY_GENERATOR: u8 = 1;
pub const OWNED_BY_CSTACK: u8 = 3;

const PY39: PyLayout = PyLayout {
    version: 0x0309,
    current_frame: CurrentFrame::FrameObjects {
        frame: 24,
        lasti_scale: 1,
    },
    entry: EntryMark::EveryFrame,
    frame_code: 32,
    frame_previous: 24,
    frame_instruction: 104,
    frame_owner: 0,
    code_first_line: 40,
    code_filename: 104,
    code_name: 112,
    code_qualname: 112,
    code_line_table: None,
    code_first_traceable: 0,
    code_units: 0,
    ascii_size: 48,
    compact_size: 72,
    compact_utf8: 56,
    compact_utf8_length: 48,
};

const PY310: PyLayout = PyLayout {
    version: 0x030a,
    current_frame: CurrentFrame::FrameObjects {
        frame: 24,
        lasti_scale: 2,
    },
    frame_instruction: 96,
    ..PY39
};

const PY311: PyLayout = PyLayout {
    version: 0x030b,
    current_frame: CurrentFrame::ThroughCFrame {
        cframe: 56,
        current_frame: 8,
    },
    entry: EntryMark::IsEntryFlag(68),
    frame_code: 32,
    frame_previous: 48,
    frame_instruction: 56,
    frame_owner: 69,
    code_first_line: 72,
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_line_table: Some(136),
    code_first_traceable: 168,
    code_units: 184,
    ascii_size: 48,
    compact_size: 72,
    compact_utf8: 56,
    compact_utf8_length: 48,
};

const PY312: PyLayout = PyLayout {
    version: 0x030c,
    current_frame: CurrentFrame::ThroughCFrame {
        cframe: 56,
        current_frame: 0,
    },
    entry: EntryMark::CStackOwner,
    frame_code: 0,
    frame_previous: 8,
    frame_instruction: 56,
    frame_owner: 70,
    code_first_line: 68,
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_line_table: Some(136),
    code_first_traceable: 176,
    code_units: 192,
    ascii_size: 40,
    compact_size: 56,
    compact_utf8: 48,
    compact_utf8_length: 40,
};

const PY313: PyLayout = PyLayout {
    version: 0x030d,
    current_frame: CurrentFrame::Direct { current_frame: 72 },
    code_first_traceable: 184,
    code_units: 200,
    ..PY312
};

/// The layout for `PY_VERSION_HEX` `version_hex`, if memwarden knows it. Release level does
/// not matter; alphas and betas of a minor version can differ, so only finals and release
/// candidates are accepted.
pub fn for_version(version_hex: u32) -> Option<&'static PyLayout> {
    let release_level = (version_hex >> 4) & 0xf;
    if release_level < 0xc {
        return None;
    }
    [&PY39, &PY310, &PY311, &PY312, &PY313]
        .into_iter()
        .find(|layout| layout.version == version_hex >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finals_and_release_candidates_of_known_versions_only() {
        assert_eq!(for_version(0x030b07f0).map(|l| l.version), Some(0x030b));
        assert_eq!(for_version(0x030c01f0).map(|l| l.version), Some(0x030c));
        assert_eq!(for_version(0x030d00c1).map(|l| l.version), Some(0x030d));
        assert!(for_version(0x030d00a4).is_none(), "an alpha");
        assert_eq!(for_version(0x030a0df0).map(|l| l.version), Some(0x030a));
        assert!(for_version(0x030807f0).is_none(), "3.8");
        assert!(for_version(0x030e00f0).is_none(), "3.14");
    }
}

#[cfg(test)]
#[path = "python_layout_tests.rs"]
mod header_tests;
