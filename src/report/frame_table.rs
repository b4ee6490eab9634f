//! Report stage, between the frame pool and report.json: a process's frame table. The
//! frames the report shows, out of the process's frame pool (`frame_pool`: each distinct
//! frame word symbolized once), enter the table once, in the order they are first shown,
//! and stacks, failures, crashes and errors name them by index (report.json's `frames`,
//! since format 5).

use std::hash::{BuildHasher, BuildHasherDefault};
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use super::frame_pool::{FramePool, Lookup};
use super::frames::Pooled;
use super::json::{unknown_stack_frame, FrameReport};
use crate::profile::{Module, Profile};
use crate::python::{module_of_word, Holder};
use crate::symbolize::{Frame, FrameKind, Symbolizer};
use crate::word_map::{WordHasher, WordMap};

/// A frame symbolized but not (yet) in the table.
const NOT_SHOWN: u32 = u32::MAX;

/// The frames of one process: those symbolized (the pool) and those shown (the table).
pub(crate) struct FrameTable<'a> {
    profile: &'a Profile,
    /// Shared with the tables of the run's other processes, built at the same time.
    symbolizer: &'a Mutex<Symbolizer>,
    /// Every frame symbolized so far, shown or not.
    pool: FramePool,
    /// The table index of each pool frame, or [`NOT_SHOWN`] (none yet for the frames
    /// symbolized since the last `show`).
    shown: Vec<u32>,
    /// The table: the frames shown, each once.
    table: Vec<FrameReport>,
    /// The address of each table frame (native frames), as a number.
    table_addresses: Vec<Option<u64>>,
    /// The last table frame entered of each hash of a [`SameFrame`]; `same_hash` chains
    /// each to the one entered before it with that hash. Pool frames of different words
    /// can be the same frame (a module compiled again gives the same lines new code
    /// objects), and they are found without copying the pool frame to compare it.
    by_hash: WordMap<u64, u32>,
    same_hash: Vec<u32>,
}

/// What makes two frames of the table the same, borrowed from a pool frame or a table
/// frame.
#[derive(Hash, PartialEq)]
struct SameFrame<'f> {
    kind: FrameKind,
    function: Option<&'f str>,
    file: Option<&'f str>,
    line: Option<u32>,
    module: Option<&'f str>,
    address: Option<u64>,
    inlined: bool,
}

impl<'f> SameFrame<'f> {
    fn of_pool(f: &'f Frame) -> Self {
        SameFrame {
            kind: f.kind,
            function: f.function.as_deref(),
            file: f.file.as_deref(),
            line: f.line,
            module: f.module.as_deref(),
            address: (f.kind == FrameKind::Native).then_some(f.address),
            inlined: f.inlined,
        }
    }

    fn of_table(f: &'f FrameReport, address: Option<u64>) -> Self {
        SameFrame {
            kind: f.kind,
            function: f.function.as_deref(),
            file: f.file.as_deref(),
            line: f.line,
            module: f.module.as_deref(),
            address,
            inlined: f.inlined,
        }
    }

    fn hash(&self) -> u64 {
        BuildHasherDefault::<WordHasher>::default().hash_one(self)
    }
}

impl<'a> FrameTable<'a> {
    /// An empty table for `profile`'s frames.
    pub(crate) fn new(profile: &'a Profile, symbolizer: &'a Mutex<Symbolizer>) -> Self {
        Self::with_pool(profile, symbolizer, FramePool::default())
    }

    /// An empty table for `profile`'s frames, whose pool starts as `pool`, made by the
    /// look-ahead from the same process: the modules its words were symbolized in count
    /// as the report's (for the warnings about modules without symbols).
    pub(crate) fn taking_up(
        profile: &'a Profile,
        symbolizer: &'a Mutex<Symbolizer>,
        pool: FramePool,
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
        Self::with_pool(profile, symbolizer, pool)
    }

    fn with_pool(profile: &'a Profile, symbolizer: &'a Mutex<Symbolizer>, pool: FramePool) -> Self {
        FrameTable {
            profile,
            symbolizer,
            pool,
            shown: Vec::new(),
            table: Vec::new(),
            table_addresses: Vec::new(),
            by_hash: WordMap::default(),
            same_hash: Vec::new(),
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
                let slot = self.shown[index as usize];
                if slot != NOT_SHOWN {
                    return slot;
                }
                let frame = self.pool.frame(index);
                let key = SameFrame::of_pool(frame);
                let (hash, address) = (key.hash(), key.address);
                let slot = match self.find(hash, &key) {
                    Some(slot) => slot,
                    None => {
                        let report = report_frame(frame);
                        self.enter(hash, report, address)
                    }
                };
                self.shown[index as usize] = slot;
                slot
            })
            .collect()
    }

    /// The table index of the single frame of the unknown stack.
    pub(crate) fn unknown_stack(&mut self) -> u32 {
        let frame = unknown_stack_frame();
        let key = SameFrame::of_table(&frame, None);
        let hash = key.hash();
        if let Some(slot) = self.find(hash, &key) {
            return slot;
        }
        self.enter(hash, frame, None)
    }

    /// The table index of the frame `key`, whose hash is `hash`, if it is in the table.
    fn find(&self, hash: u64, key: &SameFrame) -> Option<u32> {
        let mut at = self.by_hash.get(&hash).copied().unwrap_or(NOT_SHOWN);
        while at != NOT_SHOWN {
            let entered = &self.table[at as usize];
            if SameFrame::of_table(entered, self.table_addresses[at as usize]) == *key {
                return Some(at);
            }
            at = self.same_hash[at as usize];
        }
        None
    }

    /// Enters `frame` (not in the table; its [`SameFrame`] hash `hash`, its address
    /// `address`) at the table's end; its index.
    fn enter(&mut self, hash: u64, frame: FrameReport, address: Option<u64>) -> u32 {
        let next = self.table.len() as u32;
        let before = self.by_hash.insert(hash, next).unwrap_or(NOT_SHOWN);
        self.same_hash.push(before);
        self.table.push(frame);
        self.table_addresses.push(address);
        next
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

fn report_frame(f: &Frame) -> FrameReport {
    FrameReport {
        function: f.function.clone(),
        file: f.file.clone(),
        line: f.line,
        module: f.module.clone(),
        address: (f.kind == FrameKind::Native).then(|| format!("{:#x}", f.address)),
        inlined: f.inlined,
        kind: f.kind,
    }
}

#[cfg(test)]
mod tests {
    use memwarden_abi::python::{
        python_frame, INTERPRETER_FRAMES_LEFT_OUT, NUMPY_DATA, PYMALLOC_ARENAS,
    };

    use super::*;
    use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticCode};

    fn code() -> SyntheticCode {
        SyntheticCode {
            filename: "/w/a.py".into(),
            name: "f".into(),
            qualname: "f".into(),
            first_line: 1,
            line_table: vec![],
        }
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
