//! [`Rule`] → its canonical text, the form the CLI passes to the preload in
//! `MEMWARDEN_FAIL`: items in a fixed order, sizes in their shortest exact unit, and
//! `parse_rule(&to_text(r)) == Ok(r.clone())` for every rule `parse_rule` can return.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::number::format_size;
use crate::parse::TARGET_PREFIXES;
use crate::{calls, FrameGlob, FrameTarget, Rule};

/// The canonical text of a rule (always starts with `calls=`, so it is never empty).
pub fn to_text(rule: &Rule) -> String {
    let mut items: Vec<String> = Vec::new();
    items.push(format!("calls={}", calls_text(rule.calls)));
    if let Some(n) = rule.nth {
        items.push(format!("nth={n}"));
    }
    if let Some(k) = rule.every {
        items.push(format!("every={k}"));
    }
    if let Some(p) = rule.probability {
        // `Display` for f64 prints the shortest decimal that reads back as the same value,
        // never in exponent form.
        items.push(format!("p={p}"));
    }
    if let Some(t) = rule.times {
        items.push(format!("times={t}"));
    }
    if let Some(b) = rule.after_bytes {
        items.push(format!("after-bytes={}", format_size(b)));
    }
    if let Some(s) = rule.min_size {
        items.push(format!("size>={}", format_size(s)));
    }
    if let Some(b) = rule.budget {
        items.push(format!("budget={}", format_size(b)));
    }
    for glob in &rule.only_in {
        items.push(format!("in={}", glob_text(glob)));
    }
    for glob in &rule.never_in {
        items.push(format!("not-in={}", glob_text(glob)));
    }
    if let Some(site) = rule.site {
        items.push(format!("site={site:016x}"));
    }
    if let Some(process) = &rule.process {
        items.push(format!("process={process}"));
    }
    items.join(",")
}

fn calls_text(set: u8) -> String {
    if set == calls::ALL {
        return String::from("all");
    }
    let names: Vec<&str> = [
        (calls::MALLOC, "malloc"),
        (calls::NEW, "new"),
        (calls::MMAP, "mmap"),
    ]
    .iter()
    .filter(|(bit, _)| set & bit != 0)
    .map(|&(_, name)| name)
    .collect();
    names.join("+")
}

fn glob_text(glob: &FrameGlob) -> String {
    let prefix = match glob.target {
        FrameTarget::Function => "function:",
        FrameTarget::File => "file:",
        FrameTarget::Module => "module:",
        // A bare pattern that itself starts with a prefix needs the explicit `any:`.
        FrameTarget::Any
            if TARGET_PREFIXES
                .iter()
                .any(|(p, _)| glob.pattern.starts_with(p)) =>
        {
            "any:"
        }
        FrameTarget::Any => "",
    };
    format!("{prefix}{}", glob.pattern)
}
