//! Report stage, the leak gate: which leaks count against a run — their kinds, LeakSanitizer
//! `leak:PATTERN` suppressions (the user's and the built-in ones), a baseline of known leak
//! ids — and the verdict `memwarden run` turns into its exit status.

use std::collections::BTreeSet;

use super::json::{FrameReport, Report};
use super::leaks::{counted, DEFAULT_GATE_KINDS};

/// What the leak gate counts and leaves out.
#[derive(Clone, Debug)]
pub struct LeakGate {
    /// Kinds that count (`memwarden_abi::leak_kind` codes).
    pub kinds: Vec<u32>,
    /// The run passes while counted bytes stay at or below this; `None`: any counted leak
    /// fails it.
    pub max_leaked_bytes: Option<u64>,
    /// `leak:` patterns, the user's and the built-in ones.
    pub suppressions: Vec<String>,
    /// Leak ids that no longer count (`--baseline`).
    pub baseline: Option<BTreeSet<String>>,
}

impl Default for LeakGate {
    fn default() -> Self {
        LeakGate {
            kinds: DEFAULT_GATE_KINDS.to_vec(),
            max_leaked_bytes: None,
            suppressions: BUILT_IN_SUPPRESSIONS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            baseline: None,
        }
    }
}

/// What the C runtime and the loader keep until the process dies, by design. Empty so far:
/// the roots cover them (see docs/leaks.md); kept as the place to add one, with its reason.
pub const BUILT_IN_SUPPRESSIONS: &[&str] = &[];

/// Counted leaks over the whole run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Bytes counted.
    pub bytes: u64,
    /// Blocks counted.
    pub blocks: u64,
    /// True when the gate fails the run.
    pub fails: bool,
}

impl LeakGate {
    /// Marks the leaks a suppression or the baseline takes out of the gate.
    pub fn mark_suppressed(&self, report: &mut Report) {
        for process in &mut report.processes {
            let table = &process.frames;
            for leak in &mut process.leaks {
                let frames: Vec<&FrameReport> = leak
                    .frames
                    .iter()
                    .filter_map(|&index| table.get(index as usize))
                    .collect();
                let suppressed = self.suppressions.iter().any(|p| matches_leak(p, &frames));
                let known = self
                    .baseline
                    .as_ref()
                    .is_some_and(|ids| ids.contains(&leak.id));
                leak.suppressed = suppressed || known;
            }
        }
    }

    /// The counted leaks of every process, and whether they fail the run.
    pub fn verdict(&self, report: &Report) -> Verdict {
        let (mut bytes, mut blocks) = (0, 0);
        for process in &report.processes {
            for leak in counted(process, &self.kinds) {
                bytes = leak.bytes.saturating_add(bytes);
                blocks = leak.blocks.saturating_add(blocks);
            }
        }
        let fails = match self.max_leaked_bytes {
            Some(max) => bytes > max,
            None => blocks > 0,
        };
        Verdict {
            bytes,
            blocks,
            fails,
        }
    }
}

/// Reads a LeakSanitizer suppressions file: `leak:PATTERN` lines, `#` comments and blank
/// lines. Any other line is an error naming its number.
pub fn parse_suppressions(text: &str) -> Result<Vec<String>, String> {
    let mut patterns = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.strip_prefix("leak:") {
            Some(pattern) if !pattern.trim().is_empty() => patterns.push(pattern.trim().to_owned()),
            _ => {
                return Err(format!(
                    "line {}: expected `leak:PATTERN`, found `{line}`",
                    number + 1
                ))
            }
        }
    }
    Ok(patterns)
}

/// Whether `pattern` matches the function, file or module of any of a leak's `frames`.
pub fn matches_leak(pattern: &str, frames: &[&FrameReport]) -> bool {
    frames.iter().any(|frame| {
        [&frame.function, &frame.file, &frame.module]
            .into_iter()
            .flatten()
            .any(|text| template_match(pattern, text))
    })
}

/// LeakSanitizer's template match: `*` matches any run of characters; the pattern matches
/// anywhere in `text` unless anchored with a leading `^` or a trailing `$`.
pub fn template_match(pattern: &str, text: &str) -> bool {
    let mut full = String::with_capacity(pattern.len() + 2);
    match pattern.strip_prefix('^') {
        Some(rest) => full.push_str(rest),
        None => {
            full.push('*');
            full.push_str(pattern);
        }
    }
    match full.strip_suffix('$') {
        Some(rest) => full = rest.to_owned(),
        None => full.push('*'),
    }
    glob(full.as_bytes(), text.as_bytes())
}

/// `*`-only glob over the whole text, iterative with one backtrack point.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
#[path = "leak_gate_tests.rs"]
mod tests;
