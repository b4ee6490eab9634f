//! The command line, heap-guard part: checks the guard options of `memwarden run`
//! (`--guard`, `--align`, fill patterns, sampling, checks, quarantine, `--error-exitcode`)
//! before anything starts, and turns them into the `MEMWARDEN_*` variables the preload
//! reads (docs/guards.md).

use std::ffi::{OsStr, OsString};

use crate::args::{no_value, number, usage, Flags, UsageError};

/// Smallest `--align`: the alignment glibc gives every block anyway is 16, and 8 is
/// `sizeof(void *)`, the smallest `posix_memalign` accepts.
pub const MIN_ALIGN: u64 = 8;
/// Largest `--align` (1 GiB), as the preload accepts it.
pub const MAX_ALIGN: u64 = 1 << 30;
/// Largest `--quarantine` (1 TiB), as the preload accepts it.
pub const MAX_QUARANTINE: u64 = 1 << 40;

/// The guard modes of `--guard`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardMode {
    /// Headers and canary redzones, checked at free, at exit and on request.
    Header,
    /// Every block flush against an inaccessible page.
    Page,
    /// One block in N in a guarded slot of a bounded pool.
    Sampled,
}

impl GuardMode {
    /// The name on the command line, in `MEMWARDEN_GUARD` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            GuardMode::Header => "header",
            GuardMode::Page => "page",
            GuardMode::Sampled => "sampled",
        }
    }

    fn parse(text: &str) -> Option<GuardMode> {
        [GuardMode::Header, GuardMode::Page, GuardMode::Sampled]
            .into_iter()
            .find(|mode| mode.name() == text)
    }
}

/// The guard options of one `memwarden run`; `None`/`false` when not given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuardArgs {
    /// `--guard MODE`.
    pub mode: Option<GuardMode>,
    /// `--align N`: a power of two from [`MIN_ALIGN`] to [`MAX_ALIGN`].
    pub align: Option<u64>,
    /// `--fill-alloc BYTE` (every mode; in sampled mode, the sampled blocks).
    pub fill_alloc: Option<u8>,
    /// `--fill-free BYTE` (header mode: page mode's freed blocks are inaccessible).
    pub fill_free: Option<u8>,
    /// `--guard-below` (page mode): the inaccessible page goes before each block.
    pub guard_below: bool,
    /// `--sample-rate N` (sampled mode): one allocation in N is guarded.
    pub sample_rate: Option<u64>,
    /// `--check-every N` (header mode): every live block is checked every N calls.
    pub check_every: Option<u64>,
    /// `--quarantine SIZE` (every mode): bytes of freed blocks kept back.
    pub quarantine: Option<u64>,
    /// `--error-exitcode N`: the run's exit status when any heap error was found.
    pub error_exitcode: Option<u8>,
}

/// The variables the preload reads, each set from its option or removed when the option is
/// absent, so that nothing leaks in from memwarden's own environment.
pub const VARIABLES: [&str; 8] = [
    "MEMWARDEN_GUARD",
    "MEMWARDEN_ALIGN",
    "MEMWARDEN_FILL_ALLOC",
    "MEMWARDEN_FILL_FREE",
    "MEMWARDEN_GUARD_BELOW",
    "MEMWARDEN_SAMPLE_RATE",
    "MEMWARDEN_CHECK_EVERY",
    "MEMWARDEN_QUARANTINE",
];

impl GuardArgs {
    /// Reads option `name` if it is a guard option (its value from `attached` or the next
    /// argument); `Ok(false)` if it is not one.
    pub(crate) fn take<I: Iterator<Item = OsString>>(
        &mut self,
        name: &str,
        attached: Option<OsString>,
        flags: &mut Flags<I>,
    ) -> Result<bool, UsageError> {
        if name == "--guard-below" {
            no_value(name, attached)?;
            self.guard_below = true;
            return Ok(true);
        }
        let known = [
            "--guard",
            "--align",
            "--fill-alloc",
            "--fill-free",
            "--sample-rate",
            "--check-every",
            "--quarantine",
            "--error-exitcode",
        ];
        if !known.contains(&name) {
            return Ok(false);
        }
        let value = flags.value(name, attached)?;
        match name {
            "--guard" => self.mode = Some(mode(&value)?),
            "--align" => self.align = Some(alignment(&value)?),
            "--fill-alloc" => self.fill_alloc = Some(byte(name, &value)?),
            "--fill-free" => self.fill_free = Some(byte(name, &value)?),
            "--sample-rate" => self.sample_rate = Some(number(name, &value, 1..=u64::MAX)?),
            "--check-every" => self.check_every = Some(number(name, &value, 0..=u64::MAX)?),
            "--quarantine" => self.quarantine = Some(size(name, &value)?),
            _ => self.error_exitcode = Some(number(name, &value, 0..=255)? as u8),
        }
        Ok(true)
    }

    /// Refuses options given without the mode they belong to.
    pub fn check(&self) -> Result<(), UsageError> {
        let mode = self.mode;
        let needs = |option: &str, given: bool, allowed: &[GuardMode], what: &str| {
            if given && !mode.is_some_and(|m| allowed.contains(&m)) {
                Err(usage(format!("{option} needs {what}")))
            } else {
                Ok(())
            }
        };
        use GuardMode::{Header, Page, Sampled};
        needs(
            "--guard-below",
            self.guard_below,
            &[Page],
            "--guard page (it puts the inaccessible page before each block)",
        )?;
        needs(
            "--sample-rate",
            self.sample_rate.is_some(),
            &[Sampled],
            "--guard sampled",
        )?;
        needs(
            "--check-every",
            self.check_every.is_some(),
            &[Header],
            "--guard header",
        )?;
        let all = &[Header, Page, Sampled];
        needs(
            "--quarantine",
            self.quarantine.is_some(),
            all,
            "--guard header, page or sampled",
        )?;
        needs(
            "--fill-alloc",
            self.fill_alloc.is_some(),
            all,
            "--guard header, page or sampled",
        )?;
        needs(
            "--fill-free",
            self.fill_free.is_some(),
            &[Header],
            "--guard header (in page mode a freed block is inaccessible)",
        )
    }

    /// Each of [`VARIABLES`] with its value, or `None` to remove it.
    pub fn variables(&self) -> [(&'static str, Option<String>); 8] {
        let decimal = |n: Option<u64>| n.map(|n| n.to_string());
        let values = [
            self.mode.map(|m| m.name().to_owned()),
            decimal(self.align),
            decimal(self.fill_alloc.map(u64::from)),
            decimal(self.fill_free.map(u64::from)),
            self.guard_below.then(|| "1".to_owned()),
            decimal(self.sample_rate),
            decimal(self.check_every),
            decimal(self.quarantine),
        ];
        let mut pairs = VARIABLES.map(|name| (name, None));
        for (pair, value) in pairs.iter_mut().zip(values) {
            pair.1 = value;
        }
        pairs
    }
}

fn mode(value: &OsStr) -> Result<GuardMode, UsageError> {
    let text = value.to_string_lossy();
    GuardMode::parse(&text).ok_or_else(|| {
        usage(format!(
            "option --guard expects header, page or sampled, not '{}'",
            text.escape_debug()
        ))
    })
}

fn alignment(value: &OsStr) -> Result<u64, UsageError> {
    let text = value.to_string_lossy();
    match text.parse::<u64>() {
        Ok(n) if n.is_power_of_two() && (MIN_ALIGN..=MAX_ALIGN).contains(&n) => Ok(n),
        _ => Err(usage(format!(
            "option --align expects a power of two from {MIN_ALIGN} to {MAX_ALIGN}, not '{}'",
            text.escape_debug()
        ))),
    }
}

/// A byte: decimal (`221`) or hexadecimal (`0xdd`), 0 to 255.
fn byte(name: &str, value: &OsStr) -> Result<u8, UsageError> {
    let text = value.to_string_lossy();
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u8::from_str_radix(hex, 16).ok()
        }
        Some(_) => None,
        None if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            text.parse::<u8>().ok()
        }
        None => None,
    };
    parsed.ok_or_else(|| {
        usage(format!(
            "option {name} expects a byte, 0 to 255 or 0x00 to 0xff, not '{}'",
            text.escape_debug()
        ))
    })
}

fn size(name: &str, value: &OsStr) -> Result<u64, UsageError> {
    let text = value.to_string_lossy();
    let refused = |reason: String| {
        usage(format!(
            "option {name} expects a size such as 64MiB, not '{}': {reason}",
            text.escape_debug()
        ))
    };
    match memwarden_faults::parse_size(&text) {
        Ok(n) if n <= MAX_QUARANTINE => Ok(n),
        Ok(_) => Err(refused(format!("more than {MAX_QUARANTINE} bytes (1 TiB)"))),
        Err(reason) => Err(refused(reason)),
    }
}

#[cfg(test)]
#[path = "guard_args_tests.rs"]
mod tests;
