//! Report stage, between the frame pool and the frame table: which frames of a process's
//! pool are the same frame, and each one's report frame, made ready. Pool frames of
//! different words can be the same frame (a module compiled again gives the same lines new
//! code objects); the table shows each such frame once. Finding them hashes and compares
//! the frames' strings, and a report frame copies them: about half a microsecond a frame,
//! which the look-ahead (`warm`) spends while the program runs, for the frames of the stacks
//! it picks, so that the report after exit only numbers the frames in the order it shows
//! them.

use std::hash::{BuildHasher, BuildHasherDefault};

use super::frame_pool::FramePool;
use super::json::FrameReport;
use crate::symbolize::{Frame, FrameKind};
use crate::word_map::{WordHasher, WordMap};

/// A pool frame not sorted yet.
const UNSORTED: u32 = u32::MAX;
/// The end of a chain of frames sharing a hash.
const NO_FRAME: u32 = u32::MAX;

/// What makes two pool frames the same frame, borrowed from the frame.
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
    fn of(f: &'f Frame) -> Self {
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

    fn hash(&self) -> u64 {
        BuildHasherDefault::<WordHasher>::default().hash_one(self)
    }
}

/// The pool frames sorted into the frames they are, so far.
#[derive(Default)]
pub(crate) struct SameFrames {
    /// By pool index: the first pool frame sorted that is the same frame ([`UNSORTED`]
    /// for a frame not sorted yet).
    first: Vec<u32>,
    /// By pool index, for the first frames: the first frame sorted before it whose
    /// [`SameFrame`] has the same hash ([`NO_FRAME`] for none).
    same_hash: Vec<u32>,
    /// The first frame sorted last of each hash.
    by_hash: WordMap<u64, u32>,
    /// The report frames made ready, by first frame, until the table takes them.
    ready: WordMap<u32, FrameReport>,
}

impl SameFrames {
    /// The first pool frame sorted that is the same frame as pool frame `index`, sorting it
    /// if it is new; `make_ready` also makes the report frame of a frame found new.
    pub(crate) fn first_of(&mut self, pool: &FramePool, index: u32, make_ready: bool) -> u32 {
        if self.first.len() < pool.len() {
            self.first.resize(pool.len(), UNSORTED);
            self.same_hash.resize(pool.len(), NO_FRAME);
        }
        let known = self.first[index as usize];
        if known != UNSORTED {
            return known;
        }
        let frame = pool.frame(index);
        let key = SameFrame::of(frame);
        let hash = key.hash();
        let mut at = self.by_hash.get(&hash).copied().unwrap_or(NO_FRAME);
        while at != NO_FRAME {
            if SameFrame::of(pool.frame(at)) == key {
                self.first[index as usize] = at;
                return at;
            }
            at = self.same_hash[at as usize];
        }
        let before = self.by_hash.insert(hash, index).unwrap_or(NO_FRAME);
        self.same_hash[index as usize] = before;
        self.first[index as usize] = index;
        if make_ready {
            self.ready.insert(index, report_frame(frame));
        }
        index
    }

    /// The report frame of first frame `first`: the one made ready, or made now.
    pub(crate) fn take_report(&mut self, pool: &FramePool, first: u32) -> FrameReport {
        self.ready
            .remove(&first)
            .unwrap_or_else(|| report_frame(pool.frame(first)))
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
    use memwarden_abi::python::python_frame;

    use super::*;
    use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticCode};
    use crate::profile::Profile;
    use crate::report::frame_pool::Lookup;

    fn code() -> SyntheticCode {
        SyntheticCode::function("/w/a.py", "f")
    }

    /// A pool holding, in order: line 3 of a code object, the same line of a second code
    /// object of the same function (as a second compile() of one source makes), and line 4.
    fn pool() -> FramePool {
        let profile: Profile = ProfileBuilder::new(1)
            .python_code(code())
            .python_code(code())
            .stack(&[python_frame(0, 3, true)], stack_record())
            .build_profile();
        let mut pool = FramePool::default();
        let mut no_natives = |_: Option<&crate::profile::Module>, _: u64, _: u64| Vec::new();
        for word in [
            python_frame(0, 3, true),
            python_frame(1, 3, true),
            python_frame(1, 4, true),
        ] {
            pool.lookup(&profile, &mut no_natives, word, Lookup::Return);
        }
        assert_eq!(pool.len(), 3);
        pool
    }

    #[test]
    fn frames_that_are_the_same_have_the_first_one_sorted_as_first() {
        let pool = pool();
        let mut same = SameFrames::default();
        assert_eq!(same.first_of(&pool, 1, false), 1);
        assert_eq!(same.first_of(&pool, 0, false), 1);
        assert_eq!(same.first_of(&pool, 2, false), 2);
        assert_eq!(same.first_of(&pool, 0, false), 1, "sorted once");
    }

    #[test]
    fn a_report_frame_made_ready_is_the_one_made_when_taken() {
        let pool = pool();
        let (mut ready, mut not_ready) = (SameFrames::default(), SameFrames::default());
        for index in 0..3 {
            assert_eq!(
                ready.first_of(&pool, index, true),
                not_ready.first_of(&pool, index, false)
            );
        }
        assert_eq!(ready.ready.len(), 2, "one per frame, not per pool frame");
        assert!(not_ready.ready.is_empty());
        for first in [0, 2] {
            let taken = ready.take_report(&pool, first);
            assert_eq!(taken, not_ready.take_report(&pool, first));
            assert_eq!(taken.line, Some(if first == 0 { 3 } else { 4 }));
        }
        assert!(ready.ready.is_empty(), "each taken once");
    }
}
