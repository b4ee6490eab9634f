//! Report stage, run ahead of time: while the program runs, symbolizes the stacks its
//! processes have published so far, so that the report after it exits finds the debug
//! information loaded and most return addresses resolved. Meant for a thread of low
//! priority, on a core the program leaves idle: loading DWARF is most of the report's
//! time on a short run.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use memwarden_abi::python::{self, FrameWord};

use super::frame_table::Lookup;
use super::frames::{is_entry, symbolize_shown, Symbolize};
use crate::profile::{module_at, profile_paths, LiveProfile, Module};
use crate::python::Holder;
use crate::symbolize::Symbolizer;
use crate::word_map::WordMap;

/// How long to wait between looks at the output folder once a look found nothing new.
pub const LOOK_INTERVAL: Duration = Duration::from_millis(50);
/// How long to wait while no profile has appeared yet: a short run is over in a tenth of
/// a second, and every idle millisecond of the look-ahead then is work left to the report.
const FIRST_LOOK_INTERVAL: Duration = Duration::from_millis(5);
/// Stacks read from one file at a time, between checks of the stop flag.
const STACKS_PER_READ: usize = 4096;
/// Profile files followed at once (a run of many processes: the rest wait for a free place,
/// or for the report).
const MAX_FILES: usize = 256;

/// Symbolizes, with `symbolizer`, the stacks newly published in the profiles of output
/// folder `dir`, looking again at once while there were new ones and after `interval` once
/// there were none, until `stop` is set; returns the symbolizer, for the report. Whoever
/// sets `stop` should unpark the calling thread, which otherwise sleeps out its interval.
pub fn symbolize_ahead(
    dir: &Path,
    symbolizer: Symbolizer,
    stop: &AtomicBool,
    interval: Duration,
) -> Symbolizer {
    let mut ahead = LookAhead::new(dir, symbolizer);
    while let Some(found) = ahead.look(stop) {
        match found {
            Found::NewStacks => {}
            Found::Nothing => std::thread::park_timeout(interval),
            Found::NoProfileYet => std::thread::park_timeout(FIRST_LOOK_INTERVAL),
        }
    }
    ahead.into_symbolizer()
}

/// What one look found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Stacks published since the last look (all symbolized now).
    NewStacks,
    /// Profiles, but no new stack in them.
    Nothing,
    /// No profile file yet.
    NoProfileYet,
}

/// The profiles of an output folder being written, and what was symbolized from them.
pub struct LookAhead {
    dir: PathBuf,
    /// The files followed.
    files: BTreeMap<PathBuf, Followed>,
    /// The files whose process ended and whose stacks were all read: not read again.
    finished: BTreeSet<PathBuf>,
    symbolizer: Symbolizer,
}

impl LookAhead {
    /// Nothing looked at yet in output folder `dir`; `symbolizer` will resolve its stacks.
    pub fn new(dir: &Path, symbolizer: Symbolizer) -> LookAhead {
        LookAhead {
            dir: dir.to_owned(),
            files: BTreeMap::new(),
            finished: BTreeSet::new(),
            symbolizer,
        }
    }

    /// One look: symbolizes every stack published since the last, and says what it found;
    /// `None` once `stop` is set (checked between stacks).
    pub fn look(&mut self, stop: &AtomicBool) -> Option<Found> {
        for path in profile_paths(&self.dir).unwrap_or_default() {
            let known = self.files.contains_key(&path) || self.finished.contains(&path);
            if self.files.len() < MAX_FILES && !known {
                if let Ok(live) = LiveProfile::open(&path) {
                    let warmed = WordMap::default();
                    self.files.insert(path, Followed { live, warmed });
                }
            }
        }
        let mut stacks = 0;
        for followed in self.files.values_mut() {
            stacks += catch_up(&mut self.symbolizer, followed, stop)?;
        }
        let found = if stacks > 0 {
            Found::NewStacks
        } else if self.files.is_empty() && self.finished.is_empty() {
            Found::NoProfileYet
        } else {
            Found::Nothing
        };
        let finished = &mut self.finished;
        self.files.retain(|path, followed| {
            let done = followed.live.is_finished();
            if done {
                finished.insert(path.clone());
            }
            !done
        });
        (!stop.load(Ordering::Relaxed)).then_some(found)
    }

    /// The symbolizer, caches filled.
    pub fn into_symbolizer(self) -> Symbolizer {
        self.symbolizer
    }
}

/// A profile file followed, and what was learnt of its frame words.
struct Followed {
    live: LiveProfile,
    /// What was found of each native frame word seen (stacks share most of theirs).
    warmed: WordMap<u64, Warmed>,
}

/// Symbolizes the stacks `followed` published since the last look; how many there were,
/// or `None` once `stop` is set.
fn catch_up(
    symbolizer: &mut Symbolizer,
    followed: &mut Followed,
    stop: &AtomicBool,
) -> Option<usize> {
    let Followed { live, warmed } = followed;
    let mut read = 0;
    loop {
        let stacks = live.new_stacks(STACKS_PER_READ);
        if stacks.is_empty() {
            return Some(read);
        }
        read += stacks.len();
        let mut ahead = Ahead {
            symbolizer: &mut *symbolizer,
            modules: live.modules(),
            warmed: &mut *warmed,
        };
        for words in &stacks {
            if stop.load(Ordering::Relaxed) {
                return None;
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
    warmed: &'a mut WordMap<u64, Warmed>,
}

/// What the look-ahead found of a native frame word.
#[derive(Clone, Copy)]
struct Warmed {
    holder: Holder,
    /// Symbolized, and whether one of its frames is the program's `main`.
    entry: Option<bool>,
}

impl Symbolize for Ahead<'_> {
    fn holder(&mut self, word: u64) -> Holder {
        let FrameWord::Native(address) = python::decode(word) else {
            return Holder::Other;
        };
        warmed(self.warmed, self.modules, word, address).map_or(Holder::Other, |w| w.holder)
    }

    fn symbolize(&mut self, word: u64, how: Lookup) -> bool {
        let (FrameWord::Native(address), Lookup::Return) = (python::decode(word), how) else {
            return false;
        };
        let Some(known) = warmed(self.warmed, self.modules, word, address) else {
            return false;
        };
        *known.entry.get_or_insert_with(|| {
            let module = module_at(self.modules, address.wrapping_sub(1));
            let frames = self.symbolizer.frames_ahead(module, address);
            frames.iter().any(is_entry)
        })
    }
}

/// What is known of native frame word `word` (return address `address`) of a process with
/// `modules`; none while no module is known to hold it (its record may not be published
/// yet: nothing is remembered of it until it is).
fn warmed<'w>(
    known: &'w mut WordMap<u64, Warmed>,
    modules: &[Module],
    word: u64,
    address: u64,
) -> Option<&'w mut Warmed> {
    match known.entry(word) {
        Entry::Occupied(found) => Some(found.into_mut()),
        Entry::Vacant(new) => {
            let module = module_at(modules, address.wrapping_sub(1))?;
            Some(new.insert(Warmed {
                holder: Holder::of(Some(module)),
                entry: None,
            }))
        }
    }
}
