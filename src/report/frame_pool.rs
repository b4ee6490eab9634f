//! Report stage, between symbolization and the frame table: a process's frame pool. Each
//! distinct frame word is symbolized once into the frames it stands for (one per inline
//! level); the words of one Python line share one frame. Built by the report for the
//! finished profile, or by the look-ahead while the process still runs (`ahead`), from
//! whatever the process had published by then.

use std::ops::Range;

use memwarden_abi::python::{self, FrameWord};

use super::frames::frame_flags;
use crate::profile::{module_at, LiveProfile, Module, Profile, PythonCode};
use crate::python::{module_of_word, Holder};
use crate::symbolize::{python_frame, Frame, PythonLines};
use crate::word_map::WordMap;

/// How a frame word is looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Lookup {
    /// A return address (the byte before it is looked up) or a Python frame word.
    Return,
    /// The address of an instruction itself (a crash's faulting instruction).
    Instruction,
}

/// What a process's frame words are resolved against: its modules and its Python code
/// records, as a finished profile has them or as a running process has published them.
pub(crate) trait FrameSource {
    /// The modules, sorted by start.
    fn modules(&self) -> &[Module];
    /// Python code record `code`, if published.
    fn python_code(&self, code: u32) -> Option<&PythonCode>;
}

impl FrameSource for Profile {
    fn modules(&self) -> &[Module] {
        &self.modules
    }

    fn python_code(&self, code: u32) -> Option<&PythonCode> {
        Profile::python_code(self, code)
    }
}

impl FrameSource for LiveProfile {
    fn modules(&self) -> &[Module] {
        LiveProfile::modules(self)
    }

    fn python_code(&self, code: u32) -> Option<&PythonCode> {
        LiveProfile::python_code(self, code)
    }
}

/// Symbolizes a native frame word: its module, the word's address, and the address
/// looked up (`call`), into one frame per inline level.
pub(crate) type NativeFrames<'s> = dyn FnMut(Option<&Module>, u64, u64) -> Vec<Frame> + 's;

/// What the pool knows of one frame word.
#[derive(Default)]
struct Known {
    /// What holds its code, once asked.
    holder: Option<Holder>,
    /// The pool range of its frames as a return address, once looked up.
    returned: Option<Range<u32>>,
}

/// Every frame of a process symbolized so far, each word's inline levels together.
#[derive(Default)]
pub(crate) struct FramePool {
    frames: Vec<Frame>,
    /// The flags of each frame ([`frame_flags`]).
    flags: Vec<u8>,
    /// What is known of each word looked up as a return address or asked the holder of:
    /// one map, so a stack's word costs one probe of it (and a second into the same
    /// cache line), not probes of two maps.
    words: WordMap<u64, Known>,
    /// The range of each word looked up as an instruction (a crash's first frame).
    instructions: WordMap<u64, Range<u32>>,
    /// The lines of the process's Python frame words.
    python_lines: PythonLines,
    /// The range of each Python frame (code record, line) symbolized: a line runs many
    /// instructions, each its own frame word, and these share one frame.
    python_frames: WordMap<(u32, Option<u32>), Range<u32>>,
}

impl FramePool {
    /// The indices of `word`'s frames, innermost first (none for a marker word),
    /// symbolizing it against `source` (natives through `native`) the first time.
    pub(crate) fn lookup(
        &mut self,
        source: &dyn FrameSource,
        native: &mut NativeFrames,
        word: u64,
        how: Lookup,
    ) -> Range<u32> {
        let known = match how {
            Lookup::Return => self.words.get(&word).and_then(|k| k.returned.clone()),
            Lookup::Instruction => self.instructions.get(&word).cloned(),
        };
        if let Some(range) = known {
            return range;
        }
        let mut python_line = None;
        let frames = match python::decode(word) {
            FrameWord::Marker(python::PYMALLOC_ARENAS) => vec![crate::symbolize::arenas_frame()],
            FrameWord::Marker(python::INTERPRETER_FRAMES_LEFT_OUT) => {
                vec![crate::symbolize::left_out_frame()]
            }
            FrameWord::Marker(_) => Vec::new(),
            FrameWord::Python {
                code,
                value,
                line_resolved,
            } => {
                let record = source.python_code(code);
                let line = self.python_lines.line(record, code, value, line_resolved);
                if let Some(range) = self.python_frames.get(&(code, line)).cloned() {
                    self.remember(word, how, range.clone());
                    return range;
                }
                python_line = Some((code, line));
                vec![python_frame(record, line)]
            }
            FrameWord::Native(address) => {
                let call = match how {
                    Lookup::Return => address.saturating_sub(1),
                    Lookup::Instruction => address,
                };
                native(module_at(source.modules(), call), address, call)
            }
        };
        let start = self.frames.len() as u32;
        self.flags.extend(frames.iter().map(frame_flags));
        self.frames.extend(frames);
        let range = start..self.frames.len() as u32;
        if let Some(code_line) = python_line {
            self.python_frames.insert(code_line, range.clone());
        }
        self.remember(word, how, range.clone());
        range
    }

    /// Keeps the range of `word` looked up as `how`.
    fn remember(&mut self, word: u64, how: Lookup, range: Range<u32>) {
        match how {
            Lookup::Return => self.words.entry(word).or_default().returned = Some(range),
            Lookup::Instruction => {
                self.instructions.insert(word, range);
            }
        }
    }

    /// What holds the code of frame `word` in `source`, without symbolizing it.
    pub(crate) fn holder(&mut self, source: &dyn FrameSource, word: u64) -> Holder {
        let known = self.words.entry(word).or_default();
        *known
            .holder
            .get_or_insert_with(|| Holder::of(module_of_word(source.modules(), word)))
    }

    /// The words symbolized as return addresses.
    pub(crate) fn returned_words(&self) -> impl Iterator<Item = u64> + '_ {
        self.words
            .iter()
            .filter(|(_, known)| known.returned.is_some())
            .map(|(&word, _)| word)
    }

    /// The [`frame_flags`] of frame `index`.
    pub(crate) fn flags(&self, index: u32) -> u8 {
        self.flags[index as usize]
    }

    /// Frame `index`.
    pub(crate) fn frame(&self, index: u32) -> &Frame {
        &self.frames[index as usize]
    }

    /// How many frames the pool holds.
    pub(crate) fn len(&self) -> usize {
        self.frames.len()
    }
}
