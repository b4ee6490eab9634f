//! Report stage, run ahead of time: while the program runs, symbolizes the stacks its
//! processes have published so far, so that the report after it exits finds the debug
//! information loaded and most return addresses resolved. Meant for a thread of low
//! priority, on a core the program leaves idle: loading DWARF is most of the report's
//! time on a short run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use memwarden_abi::python::{self, FrameWord};

use super::frame_table::{Holder, Lookup};
use super::frames::{is_entry, symbolize_shown, Symbolize};
use crate::profile::{module_at, profile_paths, LiveProfile, Module};
use crate::symbolize::Symbolizer;

/// How long to wait between looks at the output folder.
pub const LOOK_INTERVAL: Duration = Duration::from_millis(50);
/// Stacks read from one file at a time, between checks of the stop flag.
const STACKS_PER_READ: usize = 4096;
/// Profile files followed at once (a run of many processes: the rest wait for a free place,
/// or for the report).
const MAX_FILES: usize = 256;

/// Symbolizes, every `interval`, the stacks newly published in the profiles of output
/// folder `dir`, until `stop` is set; returns the symbolizer, for the report. Whoever sets
/// `stop` should unpark the calling thread, which otherwise sleeps out its interval.
pub fn symbolize_ahead(dir: &Path, stop: &AtomicBool, interval: Duration) -> Symbolizer {
    let mut ahead = LookAhead::new(dir);
    while ahead.look(stop) {
        std::thread::park_timeout(interval);
    }
    ahead.into_symbolizer()
}

/// The profiles of an output folder being written, and what was symbolized from them.
pub struct LookAhead {
    dir: PathBuf,
    /// The files followed.
    files: BTreeMap<PathBuf, LiveProfile>,
    /// The files whose process ended and whose stacks were all read: not read again.
    finished: BTreeSet<PathBuf>,
    symbolizer: Symbolizer,
}

impl LookAhead {
    /// Nothing looked at yet in output folder `dir`.
    pub fn new(dir: &Path) -> LookAhead {
        LookAhead {
            dir: dir.to_owned(),
            files: BTreeMap::new(),
            finished: BTreeSet::new(),
            symbolizer: Symbolizer::new(),
        }
    }

    /// One look: symbolizes every stack published since the last. `false` once `stop` is
    /// set (checked between stacks).
    pub fn look(&mut self, stop: &AtomicBool) -> bool {
        for path in profile_paths(&self.dir).unwrap_or_default() {
            let known = self.files.contains_key(&path) || self.finished.contains(&path);
            if self.files.len() < MAX_FILES && !known {
                if let Ok(live) = LiveProfile::open(&path) {
                    self.files.insert(path, live);
                }
            }
        }
        for live in self.files.values_mut() {
            if !catch_up(&mut self.symbolizer, live, stop) {
                return false;
            }
        }
        let finished = &mut self.finished;
        self.files.retain(|path, live| {
            let done = live.is_finished();
            if done {
                finished.insert(path.clone());
            }
            !done
        });
        !stop.load(Ordering::Relaxed)
    }

    /// The symbolizer, caches filled.
    pub fn into_symbolizer(self) -> Symbolizer {
        self.symbolizer
    }
}

/// Symbolizes the stacks `live` published since the last look; `false` once `stop` is set.
fn catch_up(symbolizer: &mut Symbolizer, live: &mut LiveProfile, stop: &AtomicBool) -> bool {
    loop {
        let stacks = live.new_stacks(STACKS_PER_READ);
        if stacks.is_empty() {
            return true;
        }
        let mut ahead = Ahead {
            symbolizer: &mut *symbolizer,
            modules: live.modules(),
        };
        for words in &stacks {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            symbolize_shown(&mut ahead, words, false);
        }
    }
}

/// The look-ahead's side of [`Symbolize`]: native frames only, into the symbolizer's
/// caches. Python frames are left to the report, since their code records may not all be
/// published yet, and they cost little to resolve.
struct Ahead<'a> {
    symbolizer: &'a mut Symbolizer,
    modules: &'a [Module],
}

impl Symbolize for Ahead<'_> {
    fn holder(&mut self, word: u64) -> Holder {
        match python::decode(word) {
            FrameWord::Native(address) => {
                Holder::of(module_at(self.modules, address.wrapping_sub(1)))
            }
            _ => Holder::Other,
        }
    }

    fn symbolize(&mut self, word: u64, how: Lookup) -> bool {
        let (FrameWord::Native(address), Lookup::Return) = (python::decode(word), how) else {
            return false;
        };
        let module = module_at(self.modules, address.wrapping_sub(1));
        let frames = self.symbolizer.frames_ahead(module, address);
        frames.iter().any(is_entry)
    }
}
