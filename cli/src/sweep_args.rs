//! The command line of `memwarden sweep`: its options, their defaults and bounds, parsed
//! into [`SweepArgs`] or refused in one line (like `run` and `report` in `args`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::args::{number, usage, Arg, Command, Flags, UsageError};

/// Default output folder of `sweep`, relative to the current directory.
pub const DEFAULT_SWEEP_OUTPUT: &str = "memwarden-sweep";
/// Default bound on the fault-injection runs.
pub const DEFAULT_MAX_RUNS: usize = 200;
/// Default time one run may take before it counts as a hang.
pub const DEFAULT_TIMEOUT_SECS: u64 = 30;
/// Largest `--max-runs` accepted.
const MAX_MAX_RUNS: u64 = 1_000_000;
/// Largest `--timeout` accepted: one day.
const MAX_TIMEOUT_SECS: u64 = 86_400;
/// Largest `--jobs` accepted.
const MAX_JOBS: u64 = 1024;

/// Options of `memwarden sweep`.
#[derive(Debug, PartialEq, Eq)]
pub struct SweepArgs {
    /// Output folder.
    pub output: PathBuf,
    /// Most fault-injection runs (the discovery run is not counted); 0 only lists the sites.
    pub max_runs: usize,
    /// A run still going after this long is killed and counted as a hang.
    pub timeout: Duration,
    /// Runs at once; `None`: the available parallelism.
    pub jobs: Option<usize>,
    /// The command and its arguments (never empty).
    pub command: Vec<OsString>,
}

/// Parses the arguments after `sweep`.
pub fn parse(args: impl Iterator<Item = OsString>) -> Result<Command, UsageError> {
    let mut flags = Flags {
        args: args.peekable(),
    };
    let mut output = PathBuf::from(DEFAULT_SWEEP_OUTPUT);
    let mut max_runs = DEFAULT_MAX_RUNS;
    let mut timeout = Duration::from_secs(DEFAULT_TIMEOUT_SECS);
    let mut jobs = None;
    let mut command = Vec::new();
    while let Some(arg) = flags.next() {
        match arg {
            Arg::EndOfOptions => break,
            Arg::Plain(program) => {
                command.push(program);
                break;
            }
            Arg::Option(name, attached) => {
                let value = |flags: &mut Flags<_>| flags.value(&name, attached);
                match name.as_str() {
                    "-o" | "--output" => output = value(&mut flags)?.into(),
                    "--max-runs" => {
                        let text = value(&mut flags)?;
                        max_runs = number(&name, &text, 0..=MAX_MAX_RUNS)? as usize;
                    }
                    "--timeout" => {
                        let text = value(&mut flags)?;
                        let secs = number(&name, &text, 1..=MAX_TIMEOUT_SECS)?;
                        timeout = Duration::from_secs(secs);
                    }
                    "--jobs" | "-j" => {
                        let text = value(&mut flags)?;
                        jobs = Some(number(&name, &text, 1..=MAX_JOBS)? as usize);
                    }
                    "-h" | "--help" => return Ok(Command::Help),
                    _ => {
                        return Err(usage(format!(
                            "unknown option '{name}' for `memwarden sweep`"
                        )))
                    }
                }
            }
        }
    }
    command.extend(flags.rest());
    if command.is_empty() {
        return Err(usage(
            "missing the command to sweep: memwarden sweep [options] -- CMD [ARGS...]",
        ));
    }
    if output.as_os_str().is_empty() {
        return Err(usage("option -o needs a non-empty folder"));
    }
    Ok(Command::Sweep(SweepArgs {
        output,
        max_runs,
        timeout,
        jobs,
        command,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<SweepArgs, String> {
        match parse(args.iter().map(OsString::from)) {
            Ok(Command::Sweep(args)) => Ok(args),
            Ok(other) => panic!("{args:?} gave {other:?}"),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn options_then_the_command() {
        let args = parse_strs(&[
            "-o",
            "out",
            "--max-runs=7",
            "--timeout",
            "5",
            "-j",
            "3",
            "--",
            "prog",
            "--timeout",
            "x",
        ])
        .unwrap();
        assert_eq!(
            args,
            SweepArgs {
                output: "out".into(),
                max_runs: 7,
                timeout: Duration::from_secs(5),
                jobs: Some(3),
                command: ["prog", "--timeout", "x"].map(OsString::from).to_vec(),
            }
        );
    }

    #[test]
    fn defaults_and_a_command_without_double_dash() {
        let args = parse_strs(&["prog", "-o", "x"]).unwrap();
        assert_eq!(
            args,
            SweepArgs {
                output: DEFAULT_SWEEP_OUTPUT.into(),
                max_runs: DEFAULT_MAX_RUNS,
                timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
                jobs: None,
                command: ["prog", "-o", "x"].map(OsString::from).to_vec(),
            }
        );
        assert_eq!(parse_strs(&["--max-runs", "0", "p"]).unwrap().max_runs, 0);
        let help = parse(["--timeout", "3", "--help"].map(OsString::from).into_iter());
        assert_eq!(help, Ok(Command::Help));
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        let cases: &[(&[&str], &str)] = &[
            (
                &[],
                "missing the command to sweep: memwarden sweep [options] -- CMD [ARGS...]",
            ),
            (
                &["-o", "d", "--"],
                "missing the command to sweep: memwarden sweep [options] -- CMD [ARGS...]",
            ),
            (
                &["--timeout", "0", "p"],
                "option --timeout expects a whole number from 1 to 86400, not '0'",
            ),
            (
                &["--jobs=many", "p"],
                "option --jobs expects a whole number from 1 to 1024, not 'many'",
            ),
            (
                &["--max-runs", "-1", "p"],
                "option --max-runs expects a whole number from 0 to 1000000, not '-1'",
            ),
            (&["--timeout"], "option --timeout needs a value"),
            (
                &["--fail", "nth=1", "p"],
                "unknown option '--fail' for `memwarden sweep`",
            ),
            (&["-o", "", "p"], "option -o needs a non-empty folder"),
        ];
        for (args, message) in cases {
            assert_eq!(
                parse_strs(args).unwrap_err(),
                format!("{message} (see memwarden --help)"),
                "{args:?}"
            );
        }
    }
}
