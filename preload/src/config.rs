//! Configuration: the `MEMWARDEN_*` environment variables the CLI sets, each declared once
//! in [`NUMERIC_OPTIONS`] with its default and bounds, parsed once at start-up. An invalid
//! value is reported once on stderr and the option keeps its default: the target still runs.

use core::ffi::CStr;

use memwarden_abi::{defaults, MAX_DEPTH_LIMIT};

use crate::log;

/// Where the CLI wants the profile files (`<dir>/raw/*.mwp`); no variable, no profiling.
pub const OUTPUT_DIR_VARIABLE: &CStr = c"MEMWARDEN_OUTPUT_DIR";
/// The `--fail` rules, in `memwarden-faults`' text syntax joined with `;` (validated by
/// the CLI); no variable, no fault injection.
pub const FAIL_VARIABLE: &CStr = c"MEMWARDEN_FAIL";

/// A numeric option: its variable, default and accepted range.
pub struct NumericOption {
    pub variable: &'static CStr,
    pub default: u64,
    pub min: u64,
    pub max: u64,
}

/// Frames kept per stack.
pub const MAX_DEPTH: usize = 0;
/// Unique stacks the profile file has room for.
pub const STACK_CAPACITY: usize = 1;
/// Frame words the profile file has room for.
pub const FRAME_CAPACITY: usize = 2;
/// The seed of `p=` rules (`--seed`).
pub const SEED: usize = 3;

/// Every numeric option, indexed by the constants above.
pub const NUMERIC_OPTIONS: [NumericOption; 4] = [
    NumericOption {
        variable: c"MEMWARDEN_MAX_DEPTH",
        default: defaults::MAX_DEPTH as u64,
        min: 1,
        max: MAX_DEPTH_LIMIT as u64,
    },
    NumericOption {
        variable: c"MEMWARDEN_STACK_CAPACITY",
        default: defaults::STACK_CAPACITY,
        min: 16,
        // Stack ids share a word with block sizes in the address map (24 bits).
        max: 1 << 24,
    },
    NumericOption {
        variable: c"MEMWARDEN_FRAME_CAPACITY",
        default: defaults::FRAME_CAPACITY,
        min: 1024,
        max: 1 << 32,
    },
    NumericOption {
        variable: c"MEMWARDEN_SEED",
        default: 0,
        min: 0,
        max: u64::MAX,
    },
];

/// The options in force for this process.
pub struct Config {
    pub output_dir: Vec<u8>,
    pub fail_rules: Option<Vec<u8>>,
    pub numeric: [u64; NUMERIC_OPTIONS.len()],
}

impl Config {
    /// Reads the environment; `None` when no output folder is set.
    pub fn from_environment() -> Option<Config> {
        let output_dir = variable(OUTPUT_DIR_VARIABLE)?.to_bytes().to_vec();
        if output_dir.is_empty() {
            return None;
        }
        let mut numeric = [0u64; NUMERIC_OPTIONS.len()];
        for (value, option) in numeric.iter_mut().zip(NUMERIC_OPTIONS.iter()) {
            *value = read_numeric(option);
        }
        let fail_rules = variable(FAIL_VARIABLE)
            .map(|rules| rules.to_bytes().to_vec())
            .filter(|rules| !rules.is_empty());
        Some(Config {
            output_dir,
            fail_rules,
            numeric,
        })
    }

    pub fn max_depth(&self) -> usize {
        self.numeric[MAX_DEPTH] as usize
    }
}

fn variable(name: &CStr) -> Option<&'static CStr> {
    // SAFETY: getenv with a NUL-terminated name; the result, if any, points into the
    // environment, which the loader set up and which lives as long as the process (the
    // value is copied before anything could call setenv on it).
    let value = unsafe { libc::getenv(name.as_ptr()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(value) })
}

fn read_numeric(option: &NumericOption) -> u64 {
    let Some(text) = variable(option.variable) else {
        return option.default;
    };
    match parse_decimal(text.to_bytes()) {
        Some(value) if (option.min..=option.max).contains(&value) => value,
        _ => {
            let mut default_digits = [0u8; 20];
            log::say(&[
                b"invalid ",
                option.variable.to_bytes(),
                b"=",
                text.to_bytes(),
                b" (not a whole number in range); using the default ",
                log::decimal(option.default, &mut default_digits),
            ]);
            option.default
        }
    }
}

/// A non-empty string of ASCII digits that fits in u64.
pub fn parse_decimal(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.iter().try_fold(0u64, |value, &byte| {
        if byte.is_ascii_digit() {
            value.checked_mul(10)?.checked_add(u64::from(byte - b'0'))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::parse_decimal;

    #[test]
    fn decimals_parse_strictly() {
        assert_eq!(parse_decimal(b"64"), Some(64));
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"6x"), None);
        assert_eq!(parse_decimal(b"-1"), None);
        assert_eq!(parse_decimal(b"18446744073709551616"), None);
    }
}
