//! Report stage, run ahead of time: while the program runs, builds each process's frame
//! pool from the stacks it has published so far, and picks the frames each of those
//! stacks shows (`frames::shown_pool`), so that the report after it exits finds the debug
//! information loaded, the words symbolized and most stacks' frames picked. Meant for a
//! thread of low priority, on a core the program leaves idle: this is most of the
//! report's time on a profile of many stacks.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use memwarden_abi::python::{self, FrameWord};

use super::frame_pool::{FramePool, Lookup};
use super::frames::{shown_pool, Pooled};
use super::same_frames::SameFrames;
use super::site;
use crate::profile::{profile_paths, LiveProfile, Profile};
use crate::python::{module_of_word, Holder};
use crate::symbolize::Symbolizer;

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

/// Works ahead, with `symbolizer`, on the stacks newly published in the profiles of
/// output folder `dir`, looking again at once while there were new ones and after
/// `interval` once there were none, until `stop` is set; returns the symbolizer and what
/// was made of the stacks, for the report. Whoever sets `stop` should unpark the calling
/// thread, which otherwise sleeps out its interval.
pub fn symbolize_ahead(
    dir: &Path,
    symbolizer: Symbolizer,
    stop: &AtomicBool,
    interval: Duration,
) -> (Symbolizer, Ahead) {
    let mut ahead = LookAhead::new(dir, symbolizer);
    while let Some(found) = ahead.look(stop) {
        match found {
            Found::NewStacks => {}
            Found::Nothing => std::thread::park_timeout(interval),
            Found::NoProfileYet => std::thread::park_timeout(FIRST_LOOK_INTERVAL),
        }
    }
    ahead.into_parts()
}

/// What one look found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Stacks published since the last look (all worked on now).
    NewStacks,
    /// Profiles, but no new stack in them.
    Nothing,
    /// No profile file yet.
    NoProfileYet,
}

/// The profiles of an output folder being written, and what was made of them.
pub struct LookAhead {
    dir: PathBuf,
    /// The files followed.
    files: BTreeMap<PathBuf, Followed>,
    /// The files whose process ended and whose stacks were all read: not read again.
    finished: BTreeSet<PathBuf>,
    /// What was made of the finished files' stacks.
    done: Vec<ProcessAhead>,
    symbolizer: Symbolizer,
}

impl LookAhead {
    /// Nothing looked at yet in output folder `dir`; `symbolizer` will resolve its stacks.
    pub fn new(dir: &Path, symbolizer: Symbolizer) -> LookAhead {
        LookAhead {
            dir: dir.to_owned(),
            files: BTreeMap::new(),
            finished: BTreeSet::new(),
            done: Vec::new(),
            symbolizer,
        }
    }

    /// One look: works on every stack published since the last, and says what it found;
    /// `None` once `stop` is set (checked between stacks).
    pub fn look(&mut self, stop: &AtomicBool) -> Option<Found> {
        for path in profile_paths(&self.dir).unwrap_or_default() {
            let known = self.files.contains_key(&path) || self.finished.contains(&path);
            if self.files.len() < MAX_FILES && !known {
                if let Ok(live) = LiveProfile::open(&path) {
                    let made = Made::default();
                    self.files.insert(path, Followed { live, made });
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
        let ended: Vec<PathBuf> = self
            .files
            .iter()
            .filter(|(_, followed)| followed.live.is_finished())
            .map(|(path, _)| path.clone())
            .collect();
        for path in ended {
            if let Some(followed) = self.files.remove(&path) {
                self.done.extend(followed.into_ahead());
            }
            self.finished.insert(path);
        }
        (!stop.load(Ordering::Relaxed)).then_some(found)
    }

    /// The symbolizer, caches filled, and what was made of each process's stacks.
    pub fn into_parts(self) -> (Symbolizer, Ahead) {
        let mut processes = self.done;
        processes.extend(self.files.into_values().filter_map(Followed::into_ahead));
        (self.symbolizer, Ahead { processes })
    }
}

/// What the look-ahead made of the run's processes, for the report to take up.
#[derive(Default)]
pub struct Ahead {
    processes: Vec<ProcessAhead>,
}

/// What the look-ahead made of one process's stacks: its frame pool, which frames of the
/// pool the picked stacks show are the same frame (with their report frames ready), and
/// the pool frames each stack shows, for the stacks all of whose words could be resolved
/// while it ran.
pub(crate) struct ProcessAhead {
    /// The process's pid and start time.
    identity: (u32, u64),
    pub(crate) pool: FramePool,
    pub(crate) same: SameFrames,
    pub(crate) shown: Shown,
}

/// The pool frames each stack shows, and its call-site key: the frames all in one vector
/// (tens of thousands of small vectors cost more to free than to fill), found by stack id.
#[derive(Default)]
pub(crate) struct Shown {
    /// Where each stack's frames start in `frames`, and how many there are, by stack id
    /// ([`NOT_PICKED`] for a stack whose frames were not picked).
    ranges: Vec<(u32, u32)>,
    frames: Vec<u32>,
    /// Each picked stack's site key (none without return addresses), by stack id.
    sites: Vec<Option<u64>>,
}

/// The range of a stack whose frames were not picked.
const NOT_PICKED: (u32, u32) = (u32::MAX, 0);

impl Shown {
    fn insert(&mut self, id: u32, frames: &[u32], site: Option<u64>) {
        let id = id as usize;
        if self.ranges.len() <= id {
            self.ranges.resize(id + 1, NOT_PICKED);
            self.sites.resize(id + 1, None);
        }
        self.ranges[id] = (self.frames.len() as u32, frames.len() as u32);
        self.frames.extend_from_slice(frames);
        self.sites[id] = site;
    }

    /// The pool frames stack `id` shows, if they were picked.
    pub(crate) fn of(&self, id: u32) -> Option<&[u32]> {
        match self.ranges.get(id as usize) {
            Some(&(start, len)) if (start, len) != NOT_PICKED => {
                self.frames.get(start as usize..(start + len) as usize)
            }
            _ => None,
        }
    }

    /// The site key of stack `id` (itself `None` for a stack without return addresses),
    /// if its frames were picked.
    pub(crate) fn site_of(&self, id: u32) -> Option<Option<u64>> {
        self.of(id)?;
        self.sites.get(id as usize).copied()
    }
}

impl Ahead {
    /// How many stacks of all processes had their frames picked.
    #[cfg(test)]
    pub(crate) fn stacks_picked(&self) -> usize {
        self.processes
            .iter()
            .map(|p| p.shown.ranges.iter().filter(|&&r| r != NOT_PICKED).count())
            .sum()
    }

    /// What was made of `profile`'s stacks, if anything, and if it still holds: each word
    /// was resolved in the modules the process had then, which the finished profile must
    /// resolve it in too. Only a module loaded over another's addresses (a library
    /// unloaded, another loaded in its place) can change that, so a profile with
    /// overlapping modules gets nothing.
    pub(crate) fn take(&mut self, profile: &Profile) -> Option<ProcessAhead> {
        let identity = (profile.pid, profile.start_monotonic_ns);
        let at = self.processes.iter().position(|p| p.identity == identity)?;
        let made = self.processes.swap_remove(at);
        let overlapping = profile
            .modules
            .windows(2)
            .any(|pair| pair[1].start < pair[0].end);
        (!overlapping).then_some(made)
    }
}

/// A profile file followed, and what was made of its stacks so far.
struct Followed {
    live: LiveProfile,
    made: Made,
}

/// A process's frame pool, its frames sorted into the frames they are, and the pool
/// frames of its stacks, by id, as they are made.
#[derive(Default)]
struct Made {
    pool: FramePool,
    same: SameFrames,
    shown: Shown,
}

impl Followed {
    /// What was made of its stacks (nothing if its header was never read).
    fn into_ahead(self) -> Option<ProcessAhead> {
        let identity = self.live.identity()?;
        let Made { pool, same, shown } = self.made;
        Some(ProcessAhead {
            identity,
            pool,
            same,
            shown,
        })
    }
}

/// Works on the stacks `followed` published since the last look; how many there were, or
/// `None` once `stop` is set.
fn catch_up(
    symbolizer: &mut Symbolizer,
    followed: &mut Followed,
    stop: &AtomicBool,
) -> Option<usize> {
    let Followed { live, made } = followed;
    let mut read = 0;
    loop {
        let stacks = live.new_stacks(STACKS_PER_READ);
        if stacks.is_empty() {
            return Some(read);
        }
        read += stacks.len();
        let live = &*live;
        let mut pooled = LivePool {
            live,
            pool: &mut made.pool,
            symbolizer: &mut *symbolizer,
        };
        for (id, words) in &stacks {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            if resolvable(live, words) {
                let frames = shown_pool(&mut pooled, words, false);
                let site = site::key_in(live.modules(), words);
                for &frame in &frames {
                    made.same.first_of(pooled.pool, frame, true);
                }
                made.shown.insert(*id, &frames, site);
            }
        }
    }
}

/// Whether every word of a stack resolves now as it will once the process is gone: each
/// native word in a module, each Python word's code record published. (A word in no
/// module yet may be in one whose record is still being written.)
fn resolvable(live: &LiveProfile, words: &[u64]) -> bool {
    words.iter().all(|&word| match python::decode(word) {
        FrameWord::Native(_) => module_of_word(live.modules(), word).is_some(),
        FrameWord::Python { code, .. } => live.python_code(code).is_some(),
        FrameWord::Marker(_) => true,
    })
}

/// The look-ahead's side of [`Pooled`]: a process's pool, resolved against what it has
/// published, natives symbolized ahead of the report (a module whose symbols cannot be
/// loaded is noted, and warned about when the report takes the pool up).
struct LivePool<'a> {
    live: &'a LiveProfile,
    pool: &'a mut FramePool,
    symbolizer: &'a mut Symbolizer,
}

impl Pooled for LivePool<'_> {
    fn holder(&mut self, word: u64) -> Holder {
        self.pool.holder(self.live, word)
    }

    fn lookup(&mut self, word: u64, how: Lookup) -> Range<u32> {
        let symbolizer = &mut *self.symbolizer;
        let mut native = |module: Option<&crate::profile::Module>, address: u64, call: u64| {
            symbolizer.frames_ahead(module, address, call)
        };
        self.pool.lookup(self.live, &mut native, word, how)
    }

    fn flags(&self, index: u32) -> u8 {
        self.pool.flags(index)
    }
}

#[cfg(test)]
#[path = "ahead_tests.rs"]
mod tests;
