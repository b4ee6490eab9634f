//! Fault-injection rules, shared by the CLI (which parses `--fail RULE` and passes the
//! canonical text on in `MEMWARDEN_FAIL`) and the preload (which parses that variable once
//! and asks, at each allocation, whether a rule makes it fail).
//!
//! `no_std` with `alloc`: the preload links this crate and must not pull in std. Nothing
//! here allocates after parsing: [`Rule::applies`], [`Rule::fires`], [`glob_match`] and
//! [`site_key`] are plain computations, safe to call inside an allocator hook.
//!
//! ```
//! use memwarden_faults::{parse_rule, to_text, Call, calls};
//! let rule = parse_rule("nth=3, size>=1KiB").unwrap();
//! assert_eq!(to_text(&rule), "calls=malloc,nth=3,size>=1KiB");
//! let call = Call { kind: calls::MALLOC, size: 4096, live_bytes: 0, allocated_before: 0 };
//! assert!(rule.applies(&call));
//! assert!(!rule.fires(2, 0, &call, 0, 0));
//! assert!(rule.fires(3, 0, &call, 0, 0));
//! ```
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(test)]
extern crate std;

use alloc::string::String;
use alloc::vec::Vec;

mod fire;
mod fnv;
mod glob;
mod number;
mod parse;
mod site;
mod text;

pub use fire::Call;
pub use fnv::Fnv1a;
pub use glob::glob_match;
pub use parse::{parse_rule, parse_rules, KEYS};
pub use site::site_key;
pub use text::to_text;

/// A size as rules write it (`100MB`, `64MiB`, `4096`: digits and an optional unit, in any
/// case), for other options that take sizes (`memwarden run --quarantine`); the error says
/// what is wrong with the text.
///
/// ```
/// assert_eq!(memwarden_faults::parse_size("64MiB"), Ok(64 << 20));
/// assert_eq!(memwarden_faults::parse_size("2kb"), Ok(2000));
/// assert!(memwarden_faults::parse_size("12XB").unwrap_err().starts_with("bad unit 'XB'"));
/// ```
pub fn parse_size(text: &str) -> Result<u64, String> {
    number::parse_size(text).map_err(|e| e.message)
}

/// Bits of [`Rule::calls`]: which kinds of call a rule can make fail.
pub mod calls {
    /// The malloc family (`malloc`, `calloc`, `realloc`, `posix_memalign`…).
    pub const MALLOC: u8 = 1;
    /// C++ `operator new` and `operator new[]` (a failure throws `std::bad_alloc`).
    pub const NEW: u8 = 2;
    /// Anonymous `mmap`.
    pub const MMAP: u8 = 4;
    /// All of the above (`calls=all`).
    pub const ALL: u8 = MALLOC | NEW | MMAP;
}

/// Separates rules in the `MEMWARDEN_FAIL` variable (one `--fail` each).
pub const RULE_SEPARATOR: char = ';';

/// What part of a frame an `in=` / `not-in=` glob is matched against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameTarget {
    /// Function, file or module: the glob matches if it matches any of the three.
    Any,
    /// The (demangled) function name.
    Function,
    /// The source file path.
    File,
    /// The module (executable or shared object) file name.
    Module,
}

/// One `in=` or `not-in=` item: a glob over one part of a stack frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameGlob {
    /// Which part of the frame the pattern is matched against.
    pub target: FrameTarget,
    /// The glob (see [`glob_match`]); never empty, never contains `,` or `;`.
    pub pattern: String,
}

impl FrameGlob {
    /// Whether the glob matches a frame with these names (empty if unknown).
    pub fn matches(&self, function: &[u8], file: &[u8], module: &[u8]) -> bool {
        let p = self.pattern.as_bytes();
        match self.target {
            FrameTarget::Function => glob_match(p, function),
            FrameTarget::File => glob_match(p, file),
            FrameTarget::Module => glob_match(p, module),
            FrameTarget::Any => {
                glob_match(p, function) || glob_match(p, file) || glob_match(p, module)
            }
        }
    }
}

/// One `--fail` rule: which calls it considers (filters) and which of those fail (triggers).
///
/// `Rule::default()` considers the malloc family and has no trigger: every call fails.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Set of [`calls`] bits; [`calls::MALLOC`] unless `calls=` says otherwise.
    pub calls: u8,
    /// Trigger: only the N-th applicable call (1-based).
    pub nth: Option<u64>,
    /// Trigger: every K-th applicable call.
    pub every: Option<u64>,
    /// Trigger: each applicable call with this probability, in (0, 1].
    pub probability: Option<f64>,
    /// At most this many failures from this rule.
    pub times: Option<u64>,
    /// Filter: only once the process has allocated this many bytes in total.
    pub after_bytes: Option<u64>,
    /// Filter: only requests of at least this many bytes.
    pub min_size: Option<u64>,
    /// Trigger: only when the live heap plus the request would exceed this many bytes.
    pub budget: Option<u64>,
    /// Filter: only when some frame of the calling stack matches one of these globs.
    pub only_in: Vec<FrameGlob>,
    /// Filter: never when some frame of the calling stack matches one of these globs.
    pub never_in: Vec<FrameGlob>,
    /// Filter: only calls whose stack has this [`site_key`].
    pub site: Option<u64>,
    /// Filter: only in processes whose executable's file name matches this glob.
    pub process: Option<String>,
}

impl Default for Rule {
    fn default() -> Self {
        Rule {
            calls: calls::MALLOC,
            nth: None,
            every: None,
            probability: None,
            times: None,
            after_bytes: None,
            min_size: None,
            budget: None,
            only_in: Vec::new(),
            never_in: Vec::new(),
            site: None,
            process: None,
        }
    }
}

/// A rule text that does not parse: what is wrong and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    /// What is wrong, one line, e.g. `unknown key 'sz'`.
    pub message: String,
    /// Byte offset of the first byte of the offending part of the text.
    pub start: usize,
    /// Byte offset one past its last byte (equal to `start` for a missing part).
    pub end: usize,
}

#[cfg(test)]
mod parse_tests;
