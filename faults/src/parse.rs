//! Rule text → [`Rule`]: comma-separated `key=value` items (and `size>=SIZE`), each error
//! located by its byte range so the CLI can point at it.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use crate::glob::check_glob;
use crate::number::{parse_count, parse_hex, parse_probability, parse_size, ValueError};
use crate::{calls, FrameGlob, FrameTarget, Rule, RuleError, RULE_SEPARATOR};

/// The keys a rule item may have, as listed in error messages.
pub const KEYS: &str =
    "calls, nth, every, p, times, after-bytes, size>=, budget, in, not-in, site, process";

/// Every key, in the order of [`KEYS`]; its index is its bit in the duplicate check.
const KEY_NAMES: [&str; 12] = [
    "calls",
    "nth",
    "every",
    "p",
    "times",
    "after-bytes",
    "size>=",
    "budget",
    "in",
    "not-in",
    "site",
    "process",
];

/// Keys that may be given more than once.
const REPEATABLE: [&str; 2] = ["in", "not-in"];

/// Keys whose value is a glob (so a `,` after them was probably meant inside the glob).
const GLOB_KEYS: [&str; 3] = ["in", "not-in", "process"];

/// `in=` prefixes and the part of the frame they select.
pub(crate) const TARGET_PREFIXES: [(&str, FrameTarget); 4] = [
    ("function:", FrameTarget::Function),
    ("file:", FrameTarget::File),
    ("module:", FrameTarget::Module),
    ("any:", FrameTarget::Any),
];

fn error(message: String, start: usize, end: usize) -> RuleError {
    RuleError {
        message,
        start,
        end,
    }
}

/// The sub-slice of `text` between byte offsets, with surrounding ASCII blanks removed.
fn trimmed(text: &str, start: usize, end: usize) -> (usize, usize) {
    let s = &text[start..end];
    let lead = s.len() - s.trim_start().len();
    let trail = s.len() - s.trim_end().len();
    if lead == s.len() {
        (start, start)
    } else {
        (start + lead, end - trail)
    }
}

/// Parses one rule (the text of one `--fail`).
pub fn parse_rule(text: &str) -> Result<Rule, RuleError> {
    if let Some(at) = text.find(RULE_SEPARATOR) {
        return Err(error(
            "';' is not allowed in a rule (give each rule its own --fail; globs cannot contain ';')"
                .to_string(),
            at,
            at + 1,
        ));
    }
    if text.trim().is_empty() {
        return Err(error(
            format!("empty rule (expected items such as nth=3; keys: {KEYS})"),
            0,
            text.len(),
        ));
    }
    let mut rule = Rule::default();
    let mut seen = 0u32;
    let mut previous_key: Option<&str> = None;
    let mut item_start = 0;
    for piece in text.split(',') {
        let item_end = item_start + piece.len();
        let (s, e) = trimmed(text, item_start, item_end);
        let item = &text[s..e];
        let key_value = split_item(item);
        if let (None, Some(prev)) = (key_value, previous_key) {
            if GLOB_KEYS.contains(&prev) && !item.is_empty() {
                return Err(error(
                    format!("',' inside the glob of '{prev}' (globs cannot contain ',' or ';')"),
                    item_start - 1,
                    item_start,
                ));
            }
        }
        if item.is_empty() {
            return Err(error("empty item".to_string(), s, s));
        }
        let Some((key, at_least, value_at)) = key_value else {
            return Err(error(
                format!("expected key=value or size>=SIZE, found '{item}'"),
                s,
                e,
            ));
        };
        let (ks, ke) = trimmed(text, s, s + key.len());
        let key = match (&text[ks..ke], at_least) {
            ("size", true) => "size>=",
            (key, false) if key != "size" => key,
            (key, _) if KEY_NAMES.contains(&key) || key == "size" => {
                let written = if at_least { ">=" } else { "=" };
                return Err(error(
                    format!("'{key}' cannot be followed by '{written}' (write nth=N, size>=SIZE…)"),
                    ks,
                    s + value_at,
                ));
            }
            (key, _) => return Err(error(format!("unknown key '{key}'"), ks, ke)),
        };
        let Some(index) = KEY_NAMES.iter().position(|k| *k == key) else {
            return Err(error(format!("unknown key '{key}'"), ks, ke));
        };
        if seen & (1 << index) != 0 && !REPEATABLE.contains(&key) {
            return Err(error(format!("duplicate key '{key}'"), ks, ke));
        }
        seen |= 1 << index;
        let (vs, ve) = trimmed(text, s + value_at, e);
        if vs == ve {
            return Err(error(format!("missing value for '{key}'"), vs, ve));
        }
        set(&mut rule, key, &text[vs..ve])
            .map_err(|v| error(v.message, vs + v.start, vs + v.end))?;
        previous_key = Some(KEY_NAMES[index]);
        item_start = item_end + 1;
    }
    Ok(rule)
}

/// Splits an item at its first `=` into the key's text, whether the key was written
/// with `>=` (the `>` is then not part of the key's text) and the byte offset of its
/// value; `None` without `=`.
fn split_item(item: &str) -> Option<(&str, bool, usize)> {
    let eq = item.find('=')?;
    Some(match item[..eq].strip_suffix('>') {
        Some(key) => (key, true, eq + 1),
        None => (&item[..eq], false, eq + 1),
    })
}

/// Stores one item's value in the rule.
fn set(rule: &mut Rule, key: &str, value: &str) -> Result<(), ValueError> {
    match key {
        "calls" => rule.calls = parse_calls(value)?,
        "nth" => rule.nth = Some(at_least_one(key, value)?),
        "every" => rule.every = Some(at_least_one(key, value)?),
        "times" => rule.times = Some(at_least_one(key, value)?),
        "p" => rule.probability = Some(parse_probability(value)?),
        "after-bytes" => rule.after_bytes = Some(parse_size(value)?),
        "size>=" => rule.min_size = Some(parse_size(value)?),
        "budget" => rule.budget = Some(parse_size(value)?),
        "in" => rule.only_in.push(parse_frame_glob(value)?),
        "not-in" => rule.never_in.push(parse_frame_glob(value)?),
        "site" => rule.site = Some(parse_hex(value)?),
        _ => {
            glob_checked(value, 0)?;
            rule.process = Some(value.to_string());
        }
    }
    Ok(())
}

fn at_least_one(key: &str, value: &str) -> Result<u64, ValueError> {
    match parse_count(value)? {
        0 => Err(ValueError {
            message: format!("{key} must be at least 1"),
            start: 0,
            end: value.len(),
        }),
        n => Ok(n),
    }
}

/// `malloc+new+mmap`, or `all`.
fn parse_calls(value: &str) -> Result<u8, ValueError> {
    let mut set = 0u8;
    let mut at = 0;
    for name in value.split('+') {
        let bit = match name {
            "malloc" => calls::MALLOC,
            "new" => calls::NEW,
            "mmap" => calls::MMAP,
            "all" => calls::ALL,
            _ => {
                return Err(ValueError {
                    message: format!(
                        "unknown call '{name}' (calls: malloc, new, mmap, all; join with +)"
                    ),
                    start: at,
                    end: at + name.len(),
                })
            }
        };
        if set & bit != 0 {
            return Err(ValueError {
                message: format!("call '{name}' given twice"),
                start: at,
                end: at + name.len(),
            });
        }
        set |= bit;
        at += name.len() + 1;
    }
    Ok(set)
}

/// `[function:|file:|module:|any:]GLOB`.
fn parse_frame_glob(value: &str) -> Result<FrameGlob, ValueError> {
    let (target, skip) = TARGET_PREFIXES
        .iter()
        .find(|(prefix, _)| value.starts_with(prefix))
        .map_or((FrameTarget::Any, 0), |&(prefix, target)| {
            (target, prefix.len())
        });
    let pattern = &value[skip..];
    glob_checked(pattern, skip)?;
    Ok(FrameGlob {
        target,
        pattern: pattern.to_string(),
    })
}

fn glob_checked(pattern: &str, offset: usize) -> Result<(), ValueError> {
    match check_glob(pattern) {
        None => Ok(()),
        Some((message, s, e)) => Err(ValueError {
            message: message.to_string(),
            start: offset + s,
            end: offset + e,
        }),
    }
}

/// Parses the rules of `MEMWARDEN_FAIL`, separated by [`RULE_SEPARATOR`]; an empty text
/// has no rules. Error ranges are offsets in `joined`.
pub fn parse_rules(joined: &str) -> Result<Vec<Rule>, RuleError> {
    if joined.is_empty() {
        return Ok(Vec::new());
    }
    let mut rules = Vec::new();
    let mut offset = 0;
    for text in joined.split(RULE_SEPARATOR) {
        let rule =
            parse_rule(text).map_err(|e| error(e.message, offset + e.start, offset + e.end))?;
        rules.push(rule);
        offset += text.len() + RULE_SEPARATOR.len_utf8();
    }
    Ok(rules)
}

impl RuleError {
    /// One line for a user: the message, where it is in `text` (1-based character
    /// positions) and, for an unknown key, the keys there are. `text` is the rule the
    /// error came from.
    pub fn describe(&self, text: &str) -> String {
        let chars_before = |at: usize| text.get(..at).map_or(at, |s| s.chars().count());
        let first = chars_before(self.start) + 1;
        let last = chars_before(self.end);
        let position = if last > first {
            format!("at characters {first}-{last}")
        } else {
            format!("at character {first}")
        };
        let hint = if self.message.starts_with("unknown key ") {
            format!(" (keys: {KEYS})")
        } else {
            String::new()
        };
        format!("{} {position}{hint}", self.message)
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (bytes {}..{})", self.message, self.start, self.end)
    }
}
