//! Report stage, between the frame pool and report.json: a process's frame table. The
//! frames the report shows, out of the process's frame pool (`frame_pool`: each distinct
//! frame word symbolized once), enter the table once, in the order they are first shown,
//! and stacks, failures, crashes and errors name them by index (report.json's `frames`,
//! since format 5).

use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use super::frame_pool::{FramePool, Lookup};
use super::frames::Pooled;
use super::json::{unknown_stack_frame, FrameReport};
use super::same_frames::SameFrames;
use crate::profile::{Module, Profile};
use crate::python::{module_of_word, Holder};
use crate::symbolize::Symbolizer;

/// A frame symbolized but not (yet) in the table.
const NOT_SHOWN: u32 = u32::MAX;

/// The frames of one process: those symbolized (the pool) and those shown (the table).
pub(crate) struct FrameTable<'a> {
    profile: &'a Profile,
    /// Shared with the tables of the run's other processes, built at the same time.
    symbolizer: &'a Mutex<Symbolizer>,
    /// Every frame symbolized so far, shown or not.
    pool: FramePool,
    /// Which pool frames are the same frame, and their report frames made ready.
    same: SameFrames,
    /// The table index of each pool frame that is the first of its kind
    /// ([`SameFrames::first_of`]), or [`NOT_SHOWN`] (none yet for the frames symbolized
    /// since the last `show`).
    shown: Vec<u32>,
    /// The table: the frames shown, each once.
    table: Vec<FrameReport>,
    /// The table index of the unknown stack's frame, once shown.
    unknown: Option<u32>,
}

impl<'a> FrameTable<'a> {
    /// An empty table for `profile`'s frames.
    pub(crate) fn new(profile: &'a Profile, symbolizer: &'a Mutex<Symbolizer>) -> Self {
        Self::with_pool(
            profile,
            symbolizer,
            FramePool::default(),
            SameFrames::default(),
        )
    }

    /// An empty table for `profile`'s frames, whose pool starts as `pool`, with its
    /// frames sorted so far in `same`, made by the look-ahead from the same process: the
    /// modules its words were symbolized in count as the report's (for the warnings about
    /// modules without symbols).
    pub(crate) fn taking_up(
        profile: &'a Profile,
        symbolizer: &'a Mutex<Symbolizer>,
        pool: FramePool,
        same: SameFrames,
    ) -> Self {
        let mut modules: Vec<&Module> = pool
            .returned_words()
            .filter_map(|word| module_of_word(&profile.modules, word))
            .collect();
        modules.sort_unstable_by_key(|module| (module.start, module.loaded_ns));
        modules.dedup_by_key(|module| (module.start, module.loaded_ns));
        let mut symbolizer_now = symbolizer.lock().unwrap_or_else(PoisonError::into_inner);
        modules
            .into_iter()
            .for_each(|module| symbolizer_now.note_report_use(module));
        drop(symbolizer_now);
        Self::with_pool(profile, symbolizer, pool, same)
    }

    fn with_pool(
        profile: &'a Profile,
        symbolizer: &'a Mutex<Symbolizer>,
        pool: FramePool,
        same: SameFrames,
    ) -> Self {
        FrameTable {
            profile,
            symbolizer,
            pool,
            same,
            shown: Vec::new(),
            table: Vec::new(),
            unknown: None,
        }
    }

    /// The process whose frames these are.
    pub(crate) fn profile(&self) -> &'a Profile {
        self.profile
    }
}

impl Pooled for FrameTable<'_> {
    /// The pool indices of `word`'s frames, innermost first (none for a marker word),
    /// symbolizing it the first time it is asked for.
    fn lookup(&mut self, word: u64, how: Lookup) -> Range<u32> {
        let symbolizer = self.symbolizer;
        let mut native = |module: Option<&Module>, address: u64, call: u64| {
            symbolizer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .frames_for(module, address, call)
        };
        self.pool.lookup(self.profile, &mut native, word, how)
    }

    /// The [`frame_flags`](super::frames::frame_flags) of the frame at pool index `index`.
    fn flags(&self, index: u32) -> u8 {
        self.pool.flags(index)
    }

    /// What holds the code of frame `word`, without symbolizing it.
    fn holder(&mut self, word: u64) -> Holder {
        self.pool.holder(self.profile, word)
    }
}

impl FrameTable<'_> {
    /// The table indices of the pool frames `pool` (in order), entering those not yet in
    /// the table.
    pub(crate) fn show(&mut self, pool: &[u32]) -> Vec<u32> {
        if self.shown.len() < self.pool.len() {
            self.shown.resize(self.pool.len(), NOT_SHOWN);
        }
        pool.iter()
            .map(|&index| {
                let first = self.same.first_of(&self.pool, index, false);
                let slot = self.shown[first as usize];
                if slot != NOT_SHOWN {
                    return slot;
                }
                let slot = self.table.len() as u32;
                self.table.push(self.same.take_report(&self.pool, first));
                self.shown[first as usize] = slot;
                slot
            })
            .collect()
    }

    /// The table index of the single frame of the unknown stack. No pool frame is the same
    /// frame: a native pool frame has an address, the unknown stack's frame none.
    pub(crate) fn unknown_stack(&mut self) -> u32 {
        if let Some(slot) = self.unknown {
            return slot;
        }
        let slot = self.table.len() as u32;
        self.table.push(unknown_stack_frame());
        self.unknown = Some(slot);
        slot
    }

    /// The frame at table index `index` (one `show` or `unknown_stack` gave).
    pub(crate) fn frame(&self, index: u32) -> &FrameReport {
        &self.table[index as usize]
    }

    /// The table.
    pub(crate) fn into_frames(self) -> Vec<FrameReport> {
        self.table
    }
}

#[cfg(test)]
mod tests {
    use memwarden_abi::python::{
        python_frame, INTERPRETER_FRAMES_LEFT_OUT, NUMPY_DATA, PYMALLOC_ARENAS,
    };

    use super::*;
    use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticCode};
    use crate::symbolize::FrameKind;

    fn code() -> SyntheticCode {
        SyntheticCode::function("/w/a.py", "f")
    }

    fn profile() -> Profile {
        ProfileBuilder::new(1)
            .python_code(code())
            .stack(&[python_frame(0, 3, true)], stack_record())
            .build_profile()
    }

    #[test]
    fn words_that_are_the_same_frame_share_its_entry() {
        // GIVEN the same function compiled twice (two code objects, as each compile() of
        // one source makes), and a frame word of each at line 3.
        let profile = ProfileBuilder::new(1)
            .python_code(code())
            .python_code(code())
            .stack(&[python_frame(0, 3, true)], stack_record())
            .build_profile();
        let symbolizer = Mutex::new(Symbolizer::new());
        let mut table = FrameTable::new(&profile, &symbolizer);
        let first = table.lookup(python_frame(0, 3, true), Lookup::Return);
        let again = table.lookup(python_frame(1, 3, true), Lookup::Return);
        let other_line = table.lookup(python_frame(1, 4, true), Lookup::Return);
        // THEN they are two words symbolized, but one frame of the table.
        assert_ne!(first, again);
        assert_eq!(
            table.show(&[first.start, again.start, other_line.start]),
            [0, 0, 1]
        );
        assert_eq!(table.show(&[again.start]), [0]);
        assert_eq!(labels(table), ["a.py:3 (f)", "a.py:4 (f)"]);
    }

    /// The labels of a table's frames, in order.
    fn labels(table: FrameTable) -> Vec<String> {
        table.into_frames().iter().map(FrameReport::label).collect()
    }

    #[test]
    fn instructions_of_one_line_share_one_pool_frame() {
        // GIVEN a code object whose unit 0 runs line 5 and units 1–2 line 7.
        let table = vec![0x80 | (10 << 3), 0, 0, 0x80 | (12 << 3) | 1, 0, 0];
        let profile = ProfileBuilder::new(1)
            .python_code(SyntheticCode {
                line_table: table,
                first_line: 5,
                ..code()
            })
            .stack(&[python_frame(0, 1, false)], stack_record())
            .build_profile();
        let symbolizer = Mutex::new(Symbolizer::new());
        let mut table = FrameTable::new(&profile, &symbolizer);
        // WHEN the words of units 1 and 2 (line 7), 0 (line 5) and line 7 resolved are
        // looked up.
        let unit1 = table.lookup(python_frame(0, 1, false), Lookup::Return);
        let unit2 = table.lookup(python_frame(0, 2, false), Lookup::Return);
        let unit0 = table.lookup(python_frame(0, 0, false), Lookup::Return);
        let resolved = table.lookup(python_frame(0, 7, true), Lookup::Return);
        // THEN each line is one frame of the pool, whatever word it came from.
        assert_eq!(unit1, unit2);
        assert_eq!(unit1, resolved);
        assert_ne!(unit0, unit1);
        assert_eq!(table.pool.len(), 2);
        assert_eq!(table.show(&[unit0.start, unit1.start]), [0, 1]);
        assert_eq!(labels(table), ["a.py:5 (f)", "a.py:7 (f)"]);
    }

    #[test]
    fn each_word_is_symbolized_once_and_each_frame_shown_once() {
        let profile = profile();
        let symbolizer = Mutex::new(Symbolizer::new());
        let mut table = FrameTable::new(&profile, &symbolizer);
        let a = table.lookup(0x9000, Lookup::Return);
        let py = table.lookup(python_frame(0, 3, true), Lookup::Return);
        assert_eq!(table.lookup(0x9000, Lookup::Return), a);
        assert_eq!((a.len(), py.len()), (1, 1));
        assert!(table.lookup(NUMPY_DATA, Lookup::Return).is_empty());
        let arenas = table.lookup(PYMALLOC_ARENAS, Lookup::Return);
        assert_eq!(arenas.len(), 1);
        // The same address as an instruction is another lookup.
        assert_ne!(table.lookup(0x9000, Lookup::Instruction), a);

        // Shown in the order first asked: the Python frame, then the address.
        assert_eq!(table.show(&[py.start, a.start]), [0, 1]);
        assert_eq!(table.show(&[a.start, py.start, a.start]), [1, 0, 1]);
        assert_eq!(table.unknown_stack(), 2);
        assert_eq!(table.unknown_stack(), 2);
        assert_eq!(table.show(&[arenas.start]), [3]);
        let frames = table.into_frames();
        assert_eq!(frames.len(), 4);
        assert_eq!(frames[0].label(), "a.py:3 (f)");
        assert_eq!(frames[1].address.as_deref(), Some("0x9000"));
        assert_eq!(frames[2], unknown_stack_frame());
        // pymalloc's arenas: a frame of its own kind, only named.
        assert_eq!(frames[3].kind, FrameKind::Arena);
        assert_eq!(frames[3].label(), crate::symbolize::PYMALLOC_ARENAS_LABEL);
        assert_eq!(
            (
                &frames[3].file,
                frames[3].line,
                &frames[3].module,
                &frames[3].address
            ),
            (&None, None, &None, &None)
        );
    }

    #[test]
    fn the_interpreters_frames_left_out_show_as_one_named_frame() {
        let profile = profile();
        let symbolizer = Mutex::new(Symbolizer::new());
        let mut table = FrameTable::new(&profile, &symbolizer);
        let left_out = table.lookup(INTERPRETER_FRAMES_LEFT_OUT, Lookup::Return);
        assert_eq!(left_out.len(), 1);
        let shown = table.show(&[left_out.start]);
        let frames = table.into_frames();
        let frame = &frames[shown[0] as usize];
        assert_eq!(frame.kind, FrameKind::Elided);
        assert_eq!(
            frame.label(),
            crate::symbolize::INTERPRETER_FRAMES_LEFT_OUT_LABEL
        );
        assert_eq!(
            (&frame.file, frame.line, &frame.module, &frame.address),
            (&None, None, &None, &None)
        );
    }
}
