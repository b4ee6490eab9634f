//! Report stage, between report.json and the `*.folded` files and flame graphs: every
//! stack of the report as a line of frame labels, root first, with each distinct label
//! once and each line a run of label ids. Lines are sorted once, as their text sorts,
//! without being written out; each measure then merges equal lines and skips zeros. For
//! the flame graphs, the frames too narrow to be drawn are cut off before inferno reads
//! the lines.

use std::cmp::Ordering;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::io::{self, Write};

use super::flamegraph::MIN_WIDTH_PERCENT;
use super::folded::{counts_as_leaked, process_label, sanitize, Measure};
use super::json::Report;
use crate::word_map::{WordHasher, WordMap};

/// Frames narrower than this share of the narrowest frame drawn are cut off. Below one, so that a
/// frame at the edge is left for inferno to decide.
const CUT_SHARE_OF_MIN_WIDTH: f64 = 0.5;

/// One stack's line: its label ids (a range of `Collapsed::ids`), and where its figures are.
#[derive(Clone, Copy, Debug)]
struct Line {
    start: u32,
    len: u32,
    process: u32,
    /// The index of its stack in the process's `stacks`, or of its leak in `leaks`.
    item: u32,
    leak: bool,
}

/// The stacks of a report as lines of label ids, sorted as the lines' text sorts.
pub struct Collapsed<'r> {
    report: &'r Report,
    /// Each distinct label (process roots and frames, `;` replaced), once.
    labels: Labels,
    /// Every line's label ids, root first, one after the other.
    ids: Vec<u32>,
    /// Every stack of every process, sorted.
    lines: Vec<Line>,
}

impl<'r> Collapsed<'r> {
    /// The lines of every stack of `report`.
    pub fn new(report: &'r Report) -> Self {
        let mut labels: Vec<String> = Vec::new();
        // Each label's id, found by the label's hash: the label itself is kept once, in
        // `labels` (a map keyed by the text kept a second copy of each).
        // `same_hash` chains each label to the one kept before it with the same hash.
        let mut last_of_hash: WordMap<u64, u32> = WordMap::default();
        let mut same_hash: Vec<u32> = Vec::new();
        let mut intern = |label: String| {
            let hash = BuildHasherDefault::<WordHasher>::default().hash_one(label.as_str());
            let last = last_of_hash.get(&hash).copied().unwrap_or(u32::MAX);
            let mut at = last;
            while at != u32::MAX {
                if labels[at as usize] == label {
                    return at;
                }
                at = same_hash[at as usize];
            }
            let id = labels.len() as u32;
            labels.push(label);
            same_hash.push(last);
            last_of_hash.insert(hash, id);
            id
        };
        // Each line holds its root and its frames: sized once, not grown by doubling (a
        // large profile's lines hold millions of ids).
        let line_count: usize = report
            .processes
            .iter()
            .map(|p| p.stacks.len() + p.leaks.len())
            .sum();
        let id_count: usize = report
            .processes
            .iter()
            .flat_map(|p| {
                let stacks = p.stacks.iter().map(|s| s.frames.len());
                stacks.chain(p.leaks.iter().map(|l| l.frames.len()))
            })
            .sum::<usize>()
            + line_count;
        let mut ids = Vec::with_capacity(id_count);
        let mut lines = Vec::with_capacity(line_count);
        for (p, process) in report.processes.iter().enumerate() {
            let root = intern(process_label(process));
            let frames: Vec<u32> = process
                .frames
                .iter()
                .map(|f| intern(sanitize(f.label())))
                .collect();
            let stacks = process.stacks.iter().map(|s| (&s.frames, false));
            let leaks = process.leaks.iter().map(|l| (&l.frames, true));
            let mut items = [0u32, 0u32];
            for (shown, leak) in stacks.chain(leaks) {
                let start = ids.len() as u32;
                ids.push(root);
                ids.extend(
                    shown
                        .iter()
                        .rev()
                        .filter_map(|&f| frames.get(f as usize).copied()),
                );
                lines.push(Line {
                    start,
                    len: ids.len() as u32 - start,
                    process: p as u32,
                    item: items[usize::from(leak)],
                    leak,
                });
                items[usize::from(leak)] += 1;
            }
        }
        let mut collapsed = Collapsed {
            report,
            labels: Labels::new(labels),
            ids,
            lines: Vec::new(),
        };
        // Equal lines end up side by side in any order, and are merged: the sort need not
        // be stable.
        lines.sort_unstable_by(|a, b| collapsed.labels.compare(collapsed.ids(a), collapsed.ids(b)));
        collapsed.lines = lines;
        collapsed
    }

    fn ids(&self, line: &Line) -> &[u32] {
        &self.ids[line.start as usize..(line.start + line.len) as usize]
    }

    /// The distinct lines of `measure` in order, equal lines merged and zero counts left
    /// out: each as its label ids and its count.
    fn counted(&self, measure: Measure) -> Vec<(&[u32], u64)> {
        let mut counted: Vec<(&[u32], u64)> = Vec::new();
        for line in &self.lines {
            let process = &self.report.processes[line.process as usize];
            let count = match (line.leak, measure) {
                (false, _) => measure.of_stack(&process.stacks[line.item as usize]),
                (true, Measure::Leaked) => {
                    let leak = &process.leaks[line.item as usize];
                    if counts_as_leaked(leak) {
                        leak.bytes
                    } else {
                        0
                    }
                }
                (true, _) => 0,
            };
            if count == 0 {
                continue;
            }
            let ids = self.ids(line);
            match counted.last_mut() {
                Some((last, total)) if *last == ids => *total = total.saturating_add(count),
                _ => counted.push((ids, count)),
            }
        }
        counted
    }

    /// Writes the collapsed lines of `measure` (`root;…;leaf COUNT`, each ending with a
    /// newline).
    pub fn write(&self, measure: Measure, out: &mut impl Write) -> io::Result<()> {
        // Each line is put together first, then written whole: a large profile's lines
        // hold millions of labels, and a write per label was most of the time.
        let mut line = Vec::new();
        for (ids, count) in self.counted(measure) {
            line.clear();
            self.push_line(ids, count, &mut line);
            out.write_all(&line)?;
        }
        Ok(())
    }

    /// Appends the line of `ids` and `count`, newline included, to `text`.
    fn push_line(&self, ids: &[u32], count: u64, text: &mut Vec<u8>) {
        for (i, &id) in ids.iter().enumerate() {
            if i > 0 {
                text.push(b';');
            }
            text.extend_from_slice(self.labels.text[id as usize].as_bytes());
        }
        // Writing into a Vec cannot fail.
        let _ = writeln!(text, " {count}");
    }

    /// The lines of `measure` for the flame graph: like [`Collapsed::write`]'s, but each
    /// cut off at its first frame too narrow for inferno to draw, and the lines that then
    /// become equal merged. Every frame inferno draws keeps its width, and the total is
    /// the same.
    pub fn flame_lines(&self, measure: Measure) -> String {
        let mut counted = self.counted(measure);
        // Figures of a corrupt file can add up past what inferno's total holds (a u64):
        // scaled down alike, they keep their proportions.
        let sum: u128 = counted.iter().map(|&(_, count)| u128::from(count)).sum();
        let shift = 64u32.saturating_sub(sum.leading_zeros());
        if shift > 0 {
            counted.iter_mut().for_each(|(_, count)| *count >>= shift);
            counted.retain(|&(_, count)| count > 0);
        }
        let total: u64 = counted.iter().map(|&(_, count)| count).sum();
        let narrow = MIN_WIDTH_PERCENT / (100.0 / total as f64) * CUT_SHARE_OF_MIN_WIDTH;
        let kept = kept_depths(&counted, |width| (width as f64) < narrow);
        // The lines under a frame cut off all become the same line, and they are
        // consecutive: merged first, they leave a tenth as many lines to sort (the lines
        // cut to a frame of which wider children were kept still have to find their place).
        let mut cut: Vec<(&[u32], u64)> = Vec::new();
        for (&(ids, count), depth) in counted.iter().zip(kept) {
            let ids = &ids[..depth];
            match cut.last_mut() {
                Some((last, total)) if *last == ids => *total += count,
                _ => cut.push((ids, count)),
            }
        }
        cut.sort_by(|a, b| self.labels.compare(a.0, b.0));
        let mut out = Vec::new();
        let mut lines = cut.into_iter().peekable();
        while let Some((ids, mut count)) = lines.next() {
            while let Some((_, more)) = lines.next_if(|(next, _)| *next == ids) {
                count += more;
            }
            self.push_line(ids, count, &mut out);
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// How many labels of each line to keep so that no frame of width `narrow` remains: a
/// frame is a run of consecutive lines with the same labels up to its depth (as inferno
/// merges them), and its width the sum of their counts. The root is always kept.
fn kept_depths(lines: &[(&[u32], u64)], narrow: impl Fn(u64) -> bool) -> Vec<usize> {
    let mut kept: Vec<usize> = lines.iter().map(|(ids, _)| ids.len()).collect();
    // The frames open at the current line, outermost first: (first line, width).
    let mut open: Vec<(usize, u64)> = Vec::new();
    let mut close = |open: &mut Vec<(usize, u64)>, depth: usize, end: usize| {
        while open.len() > depth {
            let (first, width) = open.pop().unwrap_or_default();
            let depth = open.len().max(1);
            if narrow(width) {
                for keep in &mut kept[first..end] {
                    *keep = (*keep).min(depth);
                }
            }
        }
    };
    let mut previous: &[u32] = &[];
    for (i, &(ids, count)) in lines.iter().enumerate() {
        let common = previous.iter().zip(ids).take_while(|(a, b)| a == b).count();
        close(&mut open, common, i);
        while open.len() < ids.len() {
            open.push((i, 0));
        }
        for frame in &mut open {
            frame.1 += count;
        }
        previous = ids;
    }
    close(&mut open, 0, lines.len());
    kept
}

/// The distinct labels of the lines, by id, and their ranks.
struct Labels {
    text: Vec<String>,
    /// Each label's place among all of them, ordered as the label followed by a `;`.
    rank: Vec<u32>,
}

impl Labels {
    fn new(text: Vec<String>) -> Labels {
        let mut order: Vec<u32> = (0..text.len() as u32).collect();
        order.sort_unstable_by(|&x, &y| {
            followed_by_separator(text[x as usize].as_bytes(), text[y as usize].as_bytes())
        });
        let mut rank = vec![0; text.len()];
        for (place, &id) in order.iter().enumerate() {
            rank[id as usize] = place as u32;
        }
        Labels { text, rank }
    }

    /// The order of two lines' texts (their labels joined by `;`), from their label ids.
    /// Labels hold no `;`, and equal labels have equal ids.
    fn compare(&self, a: &[u32], b: &[u32]) -> Ordering {
        let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) else {
            return a.len().cmp(&b.len());
        };
        if i + 1 < a.len() && i + 1 < b.len() {
            // Both lines go on, each label with a `;` after it: as no label holds a `;`,
            // the first difference lies within the shorter label and its `;`, which is
            // how the ranks are ordered.
            let (x, y) = (a[i] as usize, b[i] as usize);
            return self.rank[x].cmp(&self.rank[y]);
        }
        compare_text(&self.text, a, b, i)
    }
}

/// The order of `a;` and `b;`, compared a slice at a time (byte by byte through a chained
/// iterator, sorting the NumPy benchmark's 3,900 labels took 1.9 ms).
fn followed_by_separator(a: &[u8], b: &[u8]) -> Ordering {
    let common = a.len().min(b.len());
    match a[..common].cmp(&b[..common]) {
        Ordering::Equal => match (a.get(common), b.get(common)) {
            (None, None) => Ordering::Equal,
            (None, Some(&next)) => b';'.cmp(&next),
            (Some(&next), _) => next.cmp(&b';'),
        },
        unequal => unequal,
    }
}

/// The order of two lines' texts that first differ at label `i`, the last of one of them.
fn compare_text(labels: &[String], a: &[u32], b: &[u32], i: usize) -> Ordering {
    let (x, y) = (
        labels[a[i] as usize].as_bytes(),
        labels[b[i] as usize].as_bytes(),
    );
    let common = x.iter().zip(y).take_while(|(p, q)| p == q).count();
    // When one label is a prefix of the other, what follows it in its line (`;`, or the
    // line's end) meets the rest of the other.
    match (x.get(common), y.get(common)) {
        (Some(p), Some(q)) => p.cmp(q),
        (None, Some(q)) => next_byte(a, i).map_or(Ordering::Less, |p| p.cmp(q)),
        (Some(p), None) => next_byte(b, i).map_or(Ordering::Greater, |q| p.cmp(&q)),
        (None, None) => Ordering::Equal,
    }
}

/// The byte after label `i` of `line`: `;` when another label follows, none at its end.
fn next_byte(line: &[u32], i: usize) -> Option<u8> {
    (i + 1 < line.len()).then_some(b';')
}

#[cfg(test)]
#[path = "collapsed_tests.rs"]
mod tests;
