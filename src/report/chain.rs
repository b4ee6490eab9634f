//! Report stage, text part: the few frames the summary shows for a stack (its "chain"), and
//! the summary's list of stacks at the peak, where stacks that show the same chain are one
//! entry. A chain starts at the innermost frame that says something — the innermost Python
//! line, or else the first frame past the allocator's own — and takes up to a count of
//! frames from there. When those are all library code (Python's standard library, an
//! installed package) and the program's own Python code lies further out, its innermost
//! frame ends the chain: `take.py:124 (take_nd) <- … <- etl.py:40 (load)`.

use std::cell::Cell;
use std::collections::HashMap;

use super::json::{FrameKind, FrameReport, ProcessReport};
use crate::word_map::WordMap;

/// Frames shown per stack in the summary (the program's own frame aside).
pub const CHAIN_FRAMES: usize = 3;
/// Longest frame label shown in the summary, in characters.
const MAX_LABEL: usize = 70;
/// Between the frames of a chain, innermost first.
const SEPARATOR: &str = " <- ";
/// Between the frames shown and the program's own frame, when frames lie between them.
const SKIPPED: &str = " <- … <- ";
/// A chain with no frame to show.
const NO_FRAMES: &str = "(no frames)";

/// Functions that only pass an allocation through; the summary shows their callers.
const ALLOCATOR_FUNCTIONS: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "free_sized",
    "free_aligned_sized",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "__libc_malloc",
    "__libc_calloc",
    "__libc_realloc",
    "__libc_memalign",
    "__rust_alloc",
    "__rust_alloc_zeroed",
    "__rust_realloc",
    "__rdl_alloc",
    "__rdl_alloc_zeroed",
    "__rdl_realloc",
    "__rg_alloc",
    "__rg_alloc_zeroed",
    "__rg_realloc",
];
/// Name prefixes of allocator plumbing (C++ and Rust standard libraries).
const ALLOCATOR_PREFIXES: &[&str] = &[
    "operator new",
    "operator delete",
    "alloc::",
    "<alloc::",
    "core::alloc::",
    "std::alloc::",
    "<std::alloc::",
    "__gnu_cxx::new_allocator",
    "__gnu_cxx::__new_allocator",
    "std::__new_allocator",
    "std::allocator",
    "std::allocator_traits",
    "hashbrown::raw::",
    "<hashbrown::",
];

/// Which of a stack's frames (positions, innermost first) a chain shows.
#[derive(Clone, Copy)]
struct Plan {
    /// The frames `start..end`.
    start: usize,
    end: usize,
    /// Then the program's own frame at this position, if any.
    own: Option<usize>,
}

/// What a chain needs to know of a frame, as bits: a Python frame, the allocator's own,
/// the program's own Python code.
const PYTHON: u8 = 1;
const ALLOCATOR: u8 = 2;
const OWN: u8 = 4;

fn class_of(frame: &FrameReport) -> u8 {
    match frame.kind {
        FrameKind::Python if is_own_python(frame) => PYTHON | OWN,
        FrameKind::Python => PYTHON,
        _ if is_allocator_frame(frame) => ALLOCATOR,
        _ => 0,
    }
}

/// The chain of a stack of `len` frames (innermost first) whose classes `class(i)` gives,
/// with at most `count` frames besides the program's own.
fn plan(len: usize, count: usize, class: impl Fn(usize) -> u8) -> Plan {
    let has = |at: usize, bit: u8| class(at) & bit != 0;
    let python = (0..len).find(|&at| has(at, PYTHON));
    let start = python
        .or_else(|| (0..len).find(|&at| !has(at, ALLOCATOR)))
        .unwrap_or(0);
    let end = len.min(start + count);
    let own = match python {
        Some(_) if !(start..end).any(|at| has(at, OWN)) => (end..len).find(|&at| has(at, OWN)),
        _ => None,
    };
    Plan { start, end, own }
}

/// The chain of `frames` with at most `count` frames besides the program's own.
pub(crate) fn chain_of(frames: &[&FrameReport], count: usize) -> String {
    let plan = plan(frames.len(), count, |at| class_of(frames[at]));
    let own = plan
        .own
        .map(|at| (at > plan.end, shortened(frames[at].label())));
    joined(&shown_labels(frames, plan), own)
}

/// The one frame that says where a stack is: the first its chain shows (no program's own
/// frame after it), for one-line summaries in the sanitizers' style.
pub(crate) fn place_of(frames: &[&FrameReport]) -> String {
    let plan = plan(frames.len(), 1, |at| class_of(frames[at]) & !OWN);
    joined(&shown_labels(frames, plan), None)
}

/// The labels of the frames `plan` shows before the program's own.
fn shown_labels(frames: &[&FrameReport], plan: Plan) -> Vec<String> {
    frames[plan.start..plan.end]
        .iter()
        .map(|f| shortened(f.label()))
        .collect()
}

/// The chain of a stack's frames, as the summary shows it.
pub fn chain(frames: &[FrameReport]) -> String {
    chain_of(&frames.iter().collect::<Vec<_>>(), CHAIN_FRAMES)
}

/// `labels` joined innermost first, then the program's own frame's label (and whether
/// frames lie between), or [`NO_FRAMES`].
fn joined<S: AsRef<str>>(labels: &[S], own: Option<(bool, S)>) -> String {
    let mut text = labels
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(SEPARATOR);
    if let Some((skipped, own)) = own {
        if !text.is_empty() {
            text.push_str(if skipped { SKIPPED } else { SEPARATOR });
        }
        text.push_str(own.as_ref());
    }
    if text.is_empty() {
        NO_FRAMES.to_owned()
    } else {
        text
    }
}

/// The `count` largest figures at the peak of `p`'s stacks, each with its chain. Stacks
/// that show the same chain are one entry: recorded stacks differ in frames the chain
/// does not show (a caller further out, the instructions of one Python line, two return
/// addresses in one function), and shown apart they would read as the same line twice,
/// each with part of its bytes.
pub fn top_at_peak(p: &ProcessReport, count: usize) -> Vec<(u64, String)> {
    let mut printed = PrintedFrames::new(p);
    let mut entries: Vec<(u64, ChainKey)> = Vec::new();
    let mut index: HashMap<ChainKey, usize> = HashMap::new();
    for stack in p.stacks.iter().filter(|s| s.at_peak_bytes > 0) {
        let key = printed.chain_key(&stack.frames);
        match index.get(&key) {
            Some(&i) => entries[i].0 = entries[i].0.saturating_add(stack.at_peak_bytes),
            None => {
                index.insert(key, entries.len());
                entries.push((stack.at_peak_bytes, key));
            }
        }
    }
    // Stable: equal figures keep the order of report.json's stacks.
    entries.sort_by_key(|&(bytes, _)| std::cmp::Reverse(bytes));
    entries.truncate(count);
    entries
        .into_iter()
        .map(|(bytes, key)| (bytes, printed.text(&key)))
        .collect()
}

/// A chain as the summary shows it: the ids [`PrintedFrames`] gives its labels.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ChainKey {
    labels: [u32; CHAIN_FRAMES],
    len: u8,
    /// The program's own frame's label id (`u32::MAX`: none), and whether frames lie
    /// between it and the others.
    own: u32,
    skipped: bool,
}

/// One id per distinct label of a process's frames, made as frames are met: each label is
/// formatted once, however many stacks show its frame.
struct PrintedFrames<'p> {
    process: &'p ProcessReport,
    /// Each frame's label id, `u32::MAX` until met.
    label_of_frame: Vec<u32>,
    /// The first frame met with each label id.
    frame_of_label: Vec<u32>,
    by_text: WordMap<String, u32>,
    /// Each frame's class ([`class_of`]) with [`KNOWN`] set, 0 until asked: every stack's
    /// chain looks through frames of the table's, many of them in every stack, and a
    /// byte per frame is all it reads of them.
    class_of_frame: Vec<Cell<u8>>,
    /// The stack being keyed: its frames' indices (reused from stack to stack).
    indices: Vec<u32>,
}

/// Set in a frame's cached class once it is known.
const KNOWN: u8 = 128;

impl<'p> PrintedFrames<'p> {
    fn new(process: &'p ProcessReport) -> Self {
        PrintedFrames {
            process,
            label_of_frame: vec![u32::MAX; process.frames.len()],
            frame_of_label: Vec::new(),
            by_text: WordMap::default(),
            class_of_frame: vec![Cell::new(0); process.frames.len()],
            indices: Vec::new(),
        }
    }

    /// The key of the chain [`chain_of`] shows for a stack of `frames` (indices into the
    /// frame table; those missing from it are passed over, as `resolve` does).
    fn chain_key(&mut self, frames: &[u32]) -> ChainKey {
        let table: &'p [FrameReport] = &self.process.frames;
        self.indices.clear();
        self.indices
            .extend(frames.iter().filter(|&&i| (i as usize) < table.len()));
        let (indices, classes) = (&self.indices, &self.class_of_frame);
        let plan = plan(indices.len(), CHAIN_FRAMES, |at| {
            let index = indices[at] as usize;
            let known = &classes[index];
            if known.get() == 0 {
                known.set(class_of(&table[index]) | KNOWN);
            }
            known.get()
        });
        let mut key = ChainKey {
            labels: [0; CHAIN_FRAMES],
            len: 0,
            own: u32::MAX,
            skipped: false,
        };
        for at in plan.start..plan.end {
            key.labels[usize::from(key.len)] = self.label_id(self.indices[at] as usize);
            key.len += 1;
        }
        if let Some(at) = plan.own {
            key.own = self.label_id(self.indices[at] as usize);
            key.skipped = at > plan.end;
        }
        key
    }

    fn label_id(&mut self, frame: usize) -> u32 {
        if self.label_of_frame[frame] == u32::MAX {
            let next = self.frame_of_label.len() as u32;
            let text = shortened(self.process.frames[frame].label());
            let id = *self.by_text.entry(text).or_insert(next);
            if id == next {
                self.frame_of_label.push(frame as u32);
            }
            self.label_of_frame[frame] = id;
        }
        self.label_of_frame[frame]
    }

    fn label(&self, id: u32) -> String {
        let frame = self.frame_of_label[id as usize] as usize;
        shortened(self.process.frames[frame].label())
    }

    /// The chain's text, as [`chain_of`] writes it.
    fn text(&self, key: &ChainKey) -> String {
        let labels: Vec<String> = key.labels[..usize::from(key.len)]
            .iter()
            .map(|&id| self.label(id))
            .collect();
        let own = (key.own != u32::MAX).then(|| (key.skipped, self.label(key.own)));
        joined(&labels, own)
    }
}

/// Whether a frame only passes the allocation through.
fn is_allocator_frame(frame: &FrameReport) -> bool {
    let Some(function) = frame.function.as_deref() else {
        return false;
    };
    ALLOCATOR_FUNCTIONS.contains(&function)
        || ALLOCATOR_PREFIXES.iter().any(|p| function.starts_with(p))
}

/// Whether a frame is Python code of the program's own: a file that is neither frozen
/// into the interpreter nor in one of its library folders (the standard library's
/// `lib/pythonX.Y`, `site-packages`, `dist-packages`). `python -c` code (`<string>`) and
/// code typed in (`<stdin>`) are the program's.
fn is_own_python(frame: &FrameReport) -> bool {
    frame.kind == FrameKind::Python && frame.file.as_deref().is_some_and(|f| !is_library_file(f))
}

fn is_library_file(file: &str) -> bool {
    if file.starts_with("<frozen ") {
        return true;
    }
    let mut parts = file.split('/').peekable();
    while let Some(part) = parts.next() {
        if part == "site-packages" || part == "dist-packages" {
            return true;
        }
        let under_lib = part == "lib" || part == "lib64";
        if under_lib && parts.peek().is_some_and(|next| is_python_folder(next)) {
            return true;
        }
    }
    false
}

/// `python3.11`, `python3.13t`: the folder of a Python version's standard library.
fn is_python_folder(name: &str) -> bool {
    name.strip_prefix("python").is_some_and(|version| {
        let version = version.trim_end_matches('t');
        let mut numbers = version.split('.');
        let numeric = |n: Option<&str>| {
            n.is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        };
        numeric(numbers.next()) && numeric(numbers.next()) && numbers.next().is_none()
    })
}

pub(crate) fn shorten(label: &str) -> String {
    shortened(label.to_owned())
}

/// `label`, cut to [`MAX_LABEL`] characters and an ellipsis if longer.
pub(crate) fn shortened(mut label: String) -> String {
    if let Some((cut, _)) = label.char_indices().nth(MAX_LABEL) {
        label.truncate(cut);
        label.push('…');
    }
    label
}

#[cfg(test)]
#[path = "chain_tests.rs"]
mod tests;
