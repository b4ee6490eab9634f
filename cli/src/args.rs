//! The command line, before anything runs: parses `memwarden run …` / `memwarden report …`
//! (and, through `sweep_args`, `memwarden sweep …`) into typed options, or a one-line
//! usage error.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use memwarden_abi::MAX_DEPTH_LIMIT;

use crate::guard_args::GuardArgs;
use crate::leak_args::LeakArgs;

/// Default output folder of `run`, relative to the current directory.
pub const DEFAULT_OUTPUT: &str = "memwarden-out";
/// Default number of stacks shown per process in the summary.
pub const DEFAULT_TOP: usize = 5;
/// Largest `--top` accepted.
const MAX_TOP: usize = 1000;

/// Shown by `memwarden --help`.
pub const USAGE: &str = "\
memwarden: a heap profiler and heap checker for Linux programs

usage:
  memwarden run [-o DIR] [--max-depth N] [--top N] [--all-stacks] [--python-objects]
                [--fail RULE]... [--seed S] [--guard MODE] [guard options]
                [--leak-check [leak options]] [--error-exitcode N] [--] CMD [ARGS...]
  memwarden report [--top N] [--all-stacks] DIR
  memwarden leaks --write-baseline REPORT [-o FILE]
  memwarden sweep [-o DIR] [--max-runs N] [--timeout SECS] [--jobs N] [--] CMD [ARGS...]

memwarden run      runs CMD with libmemwarden.so preloaded, follows every process it
                   starts and waits for all of them (background ones included), then
                   writes the report into DIR and prints a summary on stderr. Python
                   shows its own lines; NumPy arrays go through memwarden's data-memory
                   handler, installed by a sitecustomize put first on PYTHONPATH
                   (docs/python.md)
  -o, --output DIR   output folder (default: ./memwarden-out); profiles of an
                     earlier run in DIR/raw/ are deleted first
  --max-depth N      deepest call stack recorded, 1-256 (default: 64)
  --top N            stacks shown per process in the summary (default: 5)
  --all-stacks       list every stack, however many: by default, past 100,000 stacks
                     in a process those under 1/10,000 of its totals are merged
                     along their call tree ([smaller stacks]; docs/report-format.md)
  --python-objects   Python: every object through malloc (PYTHONMALLOC=malloc), so that
                     objects under 512 bytes are seen one by one, not only pymalloc's
                     arenas; the program runs slower (docs/python.md)
  --fail RULE        make allocations fail on purpose, e.g. nth=3, p=1%, budget=100MB,
                     calls=new,in=function:parse_*; repeatable (docs/fault-injection.md)
  --seed S           seed of the p= rules, 0 to 2^64-1 (default: 0): same seed, same failures
  --guard MODE       find heap errors (overflows, use after free, bad frees): header (cheap),
                     page (each block against an inaccessible page) or sampled (one
                     block in N guarded by a page); see docs/guards.md
  --align N          every block N-aligned (a power of two, 8 to 2^30); with or
                     without --guard
  --fill-alloc BYTE  fill new blocks with BYTE (0-255 or 0x00-0xff)
  --fill-free BYTE   header mode: fill freed blocks with BYTE
  --guard-below      page mode: the inaccessible page goes before each block
  --sample-rate N    sampled mode: one allocation in N is guarded (default: 1000)
  --check-every N    header mode: check every live block every N allocation calls
                     (default: 0, only at free and at exit)
  --quarantine SIZE  freed bytes kept back to catch use after free, e.g. 16MiB
                     (default: 64MiB in page and sampled modes and with --fill-free,
                     none otherwise)
  --leak-check       when each process exits, find the blocks nothing points to any
                     more (definite, indirect, possible, reachable, as Valgrind
                     memcheck says); see docs/leaks.md
  --leak-kinds K,..  kinds the gate counts (default: definite,indirect)
  --leak-view V      memcheck (default) or lsan (interior pointers count as pointers)
  --max-leaked-bytes N  the gate passes while counted leaks total at most N bytes
  --suppressions FILE   LeakSanitizer-style `leak:PATTERN` lines
  --baseline FILE    leaks listed there (by `memwarden leaks --write-baseline`) do not count
  --error-exitcode N exit with N (0-255) when a heap error was found, or a leak the
                     gate counts (with --leak-check)

memwarden report   renders the report of an earlier run again, from DIR/raw/*.mwp
                   and DIR/run.json, and prints the summary on stdout
  --top N            stacks shown per process in the summary (default: 5)
  --all-stacks       list every stack, however many (as for run)

memwarden leaks    --write-baseline REPORT writes the leaks of a report.json (or of the
                   folder holding it) as a baseline file, to FILE or stdout

memwarden sweep    runs CMD once to find its allocation call sites, then once per site
                   with that site's first allocation failing, and reports which sites
                   the program handled and which crashed or hung (DIR/sweep.json)
  -o, --output DIR   output folder (default: ./memwarden-sweep)
  --max-runs N       most fault-injection runs (default: 200)
  --timeout SECS     a run still going after SECS seconds is a hang (default: 30)
  --jobs N           runs at once (default: the number of available CPUs)

Files written into DIR: report.json, peak.svg, not-freed.svg, allocated.svg and the
same graphs as collapsed stacks (*.folded), run.json, raw/*.mwp.

Exit status: `run` exits with CMD's status (128+N when signal N killed it), or with
--error-exitcode's N when a heap error was found; 2 when memwarden refuses its
arguments or the target; `report` exits 1 on unreadable input;
`sweep` exits 0 when no site crashed or hung, 1 otherwise or when it cannot finish.
";

/// What the user asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// `memwarden run`.
    Run(RunArgs),
    /// `memwarden report`.
    Report(ReportArgs),
    /// `memwarden sweep`.
    Sweep(crate::sweep_args::SweepArgs),
    Leaks(crate::leak_args::LeaksArgs),
    /// `--help`: print [`USAGE`].
    Help,
    /// `--version`.
    Version,
}

/// Options of `memwarden run`.
#[derive(Debug, PartialEq, Eq)]
pub struct RunArgs {
    /// Output folder.
    pub output: PathBuf,
    /// `MEMWARDEN_MAX_DEPTH` for the preload.
    pub max_depth: Option<u32>,
    /// Stacks per process in the summary.
    pub top: usize,
    /// `--python-objects`: Python's small objects through malloc.
    pub python_objects: bool,
    /// `--all-stacks`: no merging of small stacks, however many a process has.
    pub all_stacks: bool,
    /// `--fail` rules, validated, in canonical text, in command-line order.
    pub fail: Vec<String>,
    /// `--seed`: the seed of `p=` rules.
    pub seed: u64,
    /// `--guard` and the options that go with it.
    pub guard: GuardArgs,
    /// `--leak-check` and the gate's options.
    pub leak: LeakArgs,
    /// The command and its arguments (never empty).
    pub command: Vec<OsString>,
}

/// Options of `memwarden report`.
#[derive(Debug, PartialEq, Eq)]
pub struct ReportArgs {
    /// The output folder of an earlier run.
    pub dir: PathBuf,
    /// Stacks per process in the summary.
    pub top: usize,
    /// `--all-stacks`: no merging of small stacks, however many a process has.
    pub all_stacks: bool,
}

/// A command line memwarden cannot accept, said in one line.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} (see memwarden --help)")]
pub struct UsageError(String);

pub(crate) fn usage(message: impl Into<String>) -> UsageError {
    UsageError(message.into())
}

/// Parses the arguments after the program name.
pub fn parse(args: Vec<OsString>) -> Result<Command, UsageError> {
    let mut args = args.into_iter();
    let Some(first) = args.next() else {
        return Err(usage(
            "missing command: expected `run`, `report` or `sweep`",
        ));
    };
    match first.to_str() {
        Some("run") => parse_run(args),
        Some("report") => parse_report(args),
        Some("sweep") => crate::sweep_args::parse(args),
        Some("leaks") => crate::leak_args::parse_leaks(args).map(Command::Leaks),
        Some("-h" | "--help" | "help") => Ok(Command::Help),
        Some("-V" | "--version") => Ok(Command::Version),
        _ => Err(usage(format!(
            "unknown command '{}': expected `run`, `report` or `sweep`",
            first.to_string_lossy()
        ))),
    }
}

/// The command line as a stream of options (`--name value`, `--name=value`, `-o value`)
/// and plain arguments.
pub(crate) struct Flags<I: Iterator<Item = OsString>> {
    pub(crate) args: std::iter::Peekable<I>,
}

/// An element of the command line.
pub(crate) enum Arg {
    /// An option with its name (as written) and, for `--name=value`, its value.
    Option(String, Option<OsString>),
    /// `--`.
    EndOfOptions,
    /// Anything that is not an option.
    Plain(OsString),
}

/// Checks that option `name`, a switch, came without a value (`--name=VALUE`).
pub(crate) fn no_value(name: &str, attached: Option<OsString>) -> Result<(), UsageError> {
    match attached {
        Some(_) => Err(usage(format!("option {name} takes no value"))),
        None => Ok(()),
    }
}

impl<I: Iterator<Item = OsString>> Flags<I> {
    pub(crate) fn next(&mut self) -> Option<Arg> {
        let arg = self.args.next()?;
        let Some(text) = arg.to_str().filter(|t| t.starts_with('-') && t.len() > 1) else {
            return Some(Arg::Plain(arg));
        };
        if text == "--" {
            return Some(Arg::EndOfOptions);
        }
        Some(match text.split_once('=') {
            Some((name, value)) if name.starts_with("--") => {
                Arg::Option(name.to_owned(), Some(value.into()))
            }
            _ => Arg::Option(text.to_owned(), None),
        })
    }

    /// The value of option `name`: attached, or the next argument.
    pub(crate) fn value(
        &mut self,
        name: &str,
        attached: Option<OsString>,
    ) -> Result<OsString, UsageError> {
        attached
            .or_else(|| self.args.next())
            .ok_or_else(|| usage(format!("option {name} needs a value")))
    }

    pub(crate) fn rest(self) -> Vec<OsString> {
        self.args.collect()
    }
}

pub(crate) fn number(
    name: &str,
    value: &OsStr,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, UsageError> {
    let text = value.to_string_lossy();
    match text.parse::<u64>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(usage(format!(
            "option {name} expects a whole number from {} to {}, not '{text}'",
            range.start(),
            range.end()
        ))),
    }
}

fn parse_run(args: impl Iterator<Item = OsString>) -> Result<Command, UsageError> {
    let mut flags = Flags {
        args: args.peekable(),
    };
    let mut output = PathBuf::from(DEFAULT_OUTPUT);
    let mut max_depth = None;
    let mut top = DEFAULT_TOP;
    let mut python_objects = false;
    let mut all_stacks = false;
    let mut fail = Vec::new();
    let mut seed = 0;
    let mut guard = GuardArgs::default();
    let mut leak = LeakArgs::default();
    let mut command = Vec::new();
    while let Some(arg) = flags.next() {
        match arg {
            Arg::EndOfOptions => break,
            Arg::Plain(program) => {
                command.push(program);
                break;
            }
            Arg::Option(name, attached) => match name.as_str() {
                "-o" | "--output" => output = flags.value(&name, attached)?.into(),
                "--max-depth" => {
                    let value = flags.value(&name, attached)?;
                    max_depth = Some(number(&name, &value, 1..=MAX_DEPTH_LIMIT.into())? as u32);
                }
                "--top" => {
                    let value = flags.value(&name, attached)?;
                    top = number(&name, &value, 0..=MAX_TOP as u64)? as usize;
                }
                "--python-objects" => {
                    no_value(&name, attached)?;
                    python_objects = true;
                }
                "--all-stacks" => {
                    no_value(&name, attached)?;
                    all_stacks = true;
                }
                "--fail" => fail.push(crate::fail_args::rule(&flags.value(&name, attached)?)?),
                "--seed" => seed = number(&name, &flags.value(&name, attached)?, 0..=u64::MAX)?,
                "-h" | "--help" => return Ok(Command::Help),
                _ => {
                    if leak.take(&name, attached.clone(), &mut flags)? {
                        continue;
                    }
                    if !guard.take(&name, attached, &mut flags)? {
                        return Err(usage(format!(
                            "unknown option '{name}' for `memwarden run`"
                        )));
                    }
                }
            },
        }
    }
    command.extend(flags.rest());
    if command.is_empty() {
        return Err(usage(
            "missing the command to run: memwarden run [options] -- CMD [ARGS...]",
        ));
    }
    if output.as_os_str().is_empty() {
        return Err(usage("option -o needs a non-empty folder"));
    }
    guard.check()?;
    leak.check(guard.mode.is_some())?;
    Ok(Command::Run(RunArgs {
        output,
        max_depth,
        top,
        python_objects,
        all_stacks,
        fail,
        seed,
        guard,
        leak,
        command,
    }))
}

fn parse_report(args: impl Iterator<Item = OsString>) -> Result<Command, UsageError> {
    let mut flags = Flags {
        args: args.peekable(),
    };
    let mut top = DEFAULT_TOP;
    let mut all_stacks = false;
    let mut dirs = Vec::new();
    while let Some(arg) = flags.next() {
        match arg {
            Arg::Plain(dir) => dirs.push(dir),
            Arg::EndOfOptions => break,
            Arg::Option(name, attached) => match name.as_str() {
                "--top" => {
                    let value = flags.value(&name, attached)?;
                    top = number(&name, &value, 0..=MAX_TOP as u64)? as usize;
                }
                "--all-stacks" => {
                    no_value(&name, attached)?;
                    all_stacks = true;
                }
                "-h" | "--help" => return Ok(Command::Help),
                _ => {
                    return Err(usage(format!(
                        "unknown option '{name}' for `memwarden report`"
                    )))
                }
            },
        }
    }
    dirs.extend(flags.rest());
    match <[OsString; 1]>::try_from(dirs) {
        Ok([dir]) => Ok(Command::Report(ReportArgs {
            dir: dir.into(),
            top,
            all_stacks,
        })),
        Err(dirs) if dirs.is_empty() => {
            Err(usage("missing the output folder: memwarden report DIR"))
        }
        Err(_) => Err(usage("`memwarden report` takes one folder")),
    }
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
