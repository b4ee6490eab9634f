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
/// Alignment of every block (`--align`; 0: glibc's own).
pub const ALIGN: usize = 4;
/// Byte written over new blocks (`--fill-alloc`; 256: none).
pub const FILL_ALLOC: usize = 5;
/// Byte written over freed blocks (`--fill-free`; 256: none).
pub const FILL_FREE: usize = 6;
/// Check every live block every N allocation calls (`--check-every`; 0: never).
pub const CHECK_EVERY: usize = 7;
/// Bytes of freed blocks kept back (`--quarantine`).
pub const QUARANTINE: usize = 8;
/// `MEMWARDEN_QUARANTINE` not given: see [`quarantine_bytes`].
pub const QUARANTINE_AUTO: u64 = u64::MAX;

/// The quarantine in force: as given, or by default 64 MiB where it serves a purpose — page
/// modes (freed pages stay inaccessible) and `--fill-free` (writes after free show in the
/// pattern) — and none otherwise (a double free is still found by the freed block's header).
pub fn quarantine_bytes(given: u64, page_mode: bool, fill_free: bool) -> u64 {
    match given {
        QUARANTINE_AUTO if page_mode || fill_free => 64 << 20,
        QUARANTINE_AUTO => 0,
        given => given,
    }
}
/// Page guard before the block instead of after it (`--guard-below`; 0 or 1).
pub const GUARD_BELOW: usize = 9;
/// One allocation in N goes to a guarded page (`--sample-rate`, sampled mode).
pub const SAMPLE_RATE: usize = 10;

/// Scan for leaks when the process exits (`--leak-check`; 0 or 1).
pub const LEAK_CHECK: usize = 11;
/// How the leak check classifies: `memwarden_abi::leak_view` (`--leak-view`; 0 memcheck,
/// 1 lsan).
pub const LEAK_VIEW: usize = 12;

/// The guard mode (`--guard header|page|sampled`); no variable, no guard.
pub const GUARD_VARIABLE: &CStr = c"MEMWARDEN_GUARD";

/// Every numeric option, indexed by the constants above.
pub const NUMERIC_OPTIONS: [NumericOption; 13] = [
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
    NumericOption {
        variable: c"MEMWARDEN_ALIGN",
        default: 0,
        min: 0,
        max: 1 << 30,
    },
    NumericOption {
        variable: c"MEMWARDEN_FILL_ALLOC",
        default: 256,
        min: 0,
        max: 256,
    },
    NumericOption {
        variable: c"MEMWARDEN_FILL_FREE",
        default: 256,
        min: 0,
        max: 256,
    },
    NumericOption {
        variable: c"MEMWARDEN_CHECK_EVERY",
        default: 0,
        min: 0,
        max: u64::MAX,
    },
    NumericOption {
        variable: c"MEMWARDEN_QUARANTINE",
        default: QUARANTINE_AUTO,
        min: 0,
        max: QUARANTINE_AUTO,
    },
    NumericOption {
        variable: c"MEMWARDEN_GUARD_BELOW",
        default: 0,
        min: 0,
        max: 1,
    },
    NumericOption {
        variable: c"MEMWARDEN_SAMPLE_RATE",
        default: 1000,
        min: 1,
        max: u64::MAX,
    },
    NumericOption {
        variable: c"MEMWARDEN_LEAK_CHECK",
        default: 0,
        min: 0,
        max: 1,
    },
    NumericOption {
        variable: c"MEMWARDEN_LEAK_VIEW",
        default: 0,
        min: 0,
        max: 1,
    },
];

/// The options in force for this process.
pub struct Config {
    pub output_dir: Vec<u8>,
    pub fail_rules: Option<Vec<u8>>,
    /// One of `memwarden_abi::guard_mode`.
    pub guard_mode: u32,
    pub numeric: [u64; NUMERIC_OPTIONS.len()],
}

impl Config {
    /// Reads the environment; `None` when no output folder is set.
    pub fn from_environment() -> Option<Config> {
        let output_dir = absolute(variable(OUTPUT_DIR_VARIABLE)?.to_bytes());
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
            guard_mode: read_guard_mode(),
            numeric,
        })
    }

    pub fn max_depth(&self) -> usize {
        self.numeric[MAX_DEPTH] as usize
    }
}

/// `dir` made absolute against the working directory at start-up, which the program may
/// change: the profile file is opened again by its path each time it needs disk blocks
/// (`profile_fd`). Kept as it is when the working directory cannot be read.
fn absolute(dir: &[u8]) -> Vec<u8> {
    if dir.is_empty() || dir.starts_with(b"/") {
        return dir.to_vec();
    }
    let mut cwd = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: getcwd writes at most `cwd.len()` bytes, NUL included, into the buffer.
    if unsafe { libc::getcwd(cwd.as_mut_ptr().cast(), cwd.len()) }.is_null() {
        return dir.to_vec();
    }
    cwd.truncate(cwd.iter().position(|&b| b == 0).unwrap_or(cwd.len()));
    cwd.push(b'/');
    cwd.extend_from_slice(dir);
    cwd
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

fn read_guard_mode() -> u32 {
    use memwarden_abi::guard_mode;
    let Some(text) = variable(GUARD_VARIABLE) else {
        return guard_mode::NONE;
    };
    match text.to_bytes() {
        b"header" => guard_mode::HEADER,
        b"page" => guard_mode::PAGE,
        b"sampled" => guard_mode::SAMPLED,
        other => {
            log::say(&[
                b"invalid MEMWARDEN_GUARD=",
                other,
                b" (header, page or sampled); no guard",
            ]);
            guard_mode::NONE
        }
    }
}

/// `value` if it is a power of two of at least 8 (an alignment), else 0 (said once).
pub fn alignment(value: u64) -> usize {
    if value == 0 || (value >= 8 && value.is_power_of_two()) {
        return value as usize;
    }
    let mut digits = [0u8; 20];
    log::say(&[
        b"invalid MEMWARDEN_ALIGN=",
        log::decimal(value, &mut digits),
        b" (a power of two of at least 8); not aligning",
    ]);
    0
}

/// A fill byte option: `None` for 256 (no fill).
pub fn fill(value: u64) -> Option<u8> {
    u8::try_from(value).ok()
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
    use super::{absolute, parse_decimal};

    #[test]
    fn a_relative_output_folder_is_made_absolute_against_the_working_directory() {
        let cwd = std::env::current_dir().unwrap();
        let made = absolute(b"out/run1");
        assert_eq!(made, cwd.join("out/run1").as_os_str().as_encoded_bytes());
        assert_eq!(absolute(b"/tmp/out"), b"/tmp/out");
        assert_eq!(absolute(b""), b"");
    }

    #[test]
    fn decimals_parse_strictly() {
        assert_eq!(parse_decimal(b"64"), Some(64));
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"6x"), None);
        assert_eq!(parse_decimal(b"-1"), None);
        assert_eq!(parse_decimal(b"18446744073709551616"), None);
    }
}
