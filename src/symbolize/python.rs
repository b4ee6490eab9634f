//! Symbolization, Python part: a Python frame word (code record index and instruction
//! offset) becomes a frame with the code's file, qualified function name and the line that
//! was executing, decoded from the code's line table (`python_lines`).

use memwarden_abi::python::line_table;

use super::python_lines::LineIndex;
use super::{Frame, FrameKind};
use crate::profile::PythonCode;
use crate::word_map::WordMap;

/// The lines of one process's Python frame words, each code record's line table decoded
/// once (`LineIndex`), the first time one of its instructions is asked for.
#[derive(Default)]
pub(crate) struct PythonLines {
    decoded: WordMap<u32, LineIndex>,
}

impl PythonLines {
    /// The line of a Python frame word: code record `code` (`record`, if published), and
    /// `value`, the instruction offset in code units, or the line itself when
    /// `line_resolved`. `None` for an instruction without a line, or a code record not
    /// published or without a table this reader decodes.
    pub(crate) fn line(
        &mut self,
        record: Option<&PythonCode>,
        code: u32,
        value: u32,
        line_resolved: bool,
    ) -> Option<u32> {
        if line_resolved {
            return Some(value);
        }
        let record = record?;
        if record.line_table_kind != line_table::LOCATIONS_311 {
            return None;
        }
        self.decoded
            .entry(code)
            .or_insert_with(|| LineIndex::new(&record.line_table, record.first_line))
            .line_at(value)
    }
}

/// The frame of a code record (`None`: not published) at `line`: the code's file and
/// qualified function name. A code record not published shows as a Python frame with no
/// function and no file.
pub(crate) fn python_frame(record: Option<&PythonCode>, line: Option<u32>) -> Frame {
    Frame {
        function: record.map(|r| r.qualname.clone()),
        file: record.map(|r| r.filename.clone()),
        line,
        module: None,
        address: 0,
        inlined: false,
        kind: FrameKind::Python,
    }
}

/// The function name of the frame of the `PYMALLOC_ARENAS` marker. CPython takes from its
/// arena allocator pymalloc's arenas and, since 3.11, the chunks of each thread's frame
/// stack.
pub const PYMALLOC_ARENAS_LABEL: &str =
    "[pymalloc arenas: Python objects under 512 bytes, frame stacks]";

/// The function name of the frame of the `INTERPRETER_FRAMES_LEFT_OUT` marker.
pub const INTERPRETER_FRAMES_LEFT_OUT_LABEL: &str = "[interpreter frames left out]";

/// The one frame of the stack pymalloc's arenas are charged to.
pub fn arenas_frame() -> Frame {
    named_frame(PYMALLOC_ARENAS_LABEL, FrameKind::Arena)
}

/// The frame standing for the interpreter's frames the preload left out of a stack.
pub fn left_out_frame() -> Frame {
    named_frame(INTERPRETER_FRAMES_LEFT_OUT_LABEL, FrameKind::Elided)
}

/// A frame of kind `kind` that has only a name.
fn named_frame(name: &str, kind: FrameKind) -> Frame {
    Frame {
        function: Some(name.to_owned()),
        file: None,
        line: None,
        module: None,
        address: 0,
        inlined: false,
        kind,
    }
}

#[cfg(test)]
mod tests {
    use memwarden_abi::python::python_frame as word;

    use super::*;
    use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticCode};
    use crate::profile::Profile;

    fn profile() -> Profile {
        // Line 5 for code unit 0, line 7 for units 1–2 (a one-line entry of delta 2).
        let table = vec![0x80 | (10 << 3), 0, 0, 0x80 | (12 << 3) | 1, 0, 0];
        let mut builder = ProfileBuilder::new(1)
            .python_code(SyntheticCode {
                filename: "/work/script.py".into(),
                name: "make".into(),
                qualname: "Maker.make".into(),
                first_line: 5,
                line_table: table,
            })
            .python_code(SyntheticCode {
                filename: "old.py".into(),
                name: "f".into(),
                qualname: "f".into(),
                first_line: 1,
                line_table: vec![],
            })
            .python_code(SyntheticCode::default());
        builder.codes[2].published = 0;
        builder
            .stack(&[word(0, 0, false)], stack_record())
            .build_profile()
    }

    fn summary(frame: &Frame) -> (Option<&str>, Option<&str>, Option<u32>) {
        (frame.function.as_deref(), frame.file.as_deref(), frame.line)
    }

    /// The frame of a frame word's parts, as the report's frame table makes it.
    fn frame_of(profile: &Profile, code: u32, value: u32, line_resolved: bool) -> Frame {
        let record = profile.python_code(code);
        let line = PythonLines::default().line(record, code, value, line_resolved);
        python_frame(record, line)
    }

    #[test]
    fn offsets_become_lines_through_the_line_table() {
        let profile = profile();
        let frame = frame_of(&profile, 0, 0, false);
        assert_eq!(
            summary(&frame),
            (Some("Maker.make"), Some("/work/script.py"), Some(5))
        );
        assert_eq!(
            (frame.kind, frame.module.as_deref()),
            (FrameKind::Python, None)
        );
        assert_eq!(frame_of(&profile, 0, 2, false).line, Some(7));
        assert_eq!(frame_of(&profile, 0, 3, false).line, None);
    }

    #[test]
    fn resolved_lines_are_kept_and_codes_without_tables_have_no_line() {
        let profile = profile();
        assert_eq!(frame_of(&profile, 0, 42, true).line, Some(42));
        assert_eq!(frame_of(&profile, 1, 3, true).line, Some(3));
        assert_eq!(frame_of(&profile, 1, 3, false).line, None);
    }

    #[test]
    fn unpublished_codes_are_unknown_python_frames() {
        let profile = profile();
        let frame = frame_of(&profile, 2, 0, false);
        assert_eq!(summary(&frame), (None, None, None));
        assert_eq!(frame.kind, FrameKind::Python);
    }
}
