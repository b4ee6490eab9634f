//! The command line, leak part: `--leak-check` and the gate's options for `memwarden run`,
//! turned into the preload's variables and the report's [`LeakGate`], and the
//! `memwarden leaks --write-baseline REPORT` subcommand.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use memwarden::report::leak_gate::{parse_suppressions, LeakGate};
use memwarden::report::leaks::kind_code;

use crate::args::{no_value, number, usage, Flags, UsageError};

/// The leak options of one `memwarden run`; `None`/`false` when not given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeakArgs {
    /// `--leak-check`.
    pub check: bool,
    /// `--leak-kinds definite,indirect,possible,reachable`.
    pub kinds: Option<Vec<u32>>,
    /// `--leak-view lsan` (true) or `memcheck`.
    pub lsan: bool,
    /// `--max-leaked-bytes N`.
    pub max_leaked_bytes: Option<u64>,
    /// `--suppressions FILE`.
    pub suppressions: Option<PathBuf>,
    /// `--baseline FILE`.
    pub baseline: Option<PathBuf>,
}

/// The variables the preload reads for the leak check.
pub const VARIABLES: [&str; 2] = ["MEMWARDEN_LEAK_CHECK", "MEMWARDEN_LEAK_VIEW"];

impl LeakArgs {
    /// Takes `name` if it is a leak option; `Ok(false)` if it is not one.
    pub(crate) fn take<I: Iterator<Item = OsString>>(
        &mut self,
        name: &str,
        attached: Option<OsString>,
        flags: &mut Flags<I>,
    ) -> Result<bool, UsageError> {
        if name == "--leak-check" {
            no_value(name, attached)?;
            self.check = true;
            return Ok(true);
        }
        let known = [
            "--leak-kinds",
            "--leak-view",
            "--max-leaked-bytes",
            "--suppressions",
            "--baseline",
        ];
        if !known.contains(&name) {
            return Ok(false);
        }
        let value = flags.value(name, attached)?;
        let text = value.to_string_lossy();
        match name {
            "--leak-kinds" => self.kinds = Some(kinds(&text)?),
            "--leak-view" => {
                self.lsan = match text.as_ref() {
                    "lsan" => true,
                    "memcheck" => false,
                    other => {
                        return Err(usage(format!(
                            "option --leak-view expects memcheck or lsan, not '{other}'"
                        )))
                    }
                }
            }
            "--max-leaked-bytes" => {
                self.max_leaked_bytes = Some(number(name, &value, 0..=u64::MAX)?)
            }
            "--suppressions" => self.suppressions = Some(value.into()),
            _ => self.baseline = Some(value.into()),
        }
        Ok(true)
    }

    /// Refuses gate options without `--leak-check`, and the guard modes (not supported yet).
    pub fn check(&self, guard: bool) -> Result<(), UsageError> {
        let gate_given = self.kinds.is_some()
            || self.lsan
            || self.max_leaked_bytes.is_some()
            || self.suppressions.is_some()
            || self.baseline.is_some();
        if gate_given && !self.check {
            return Err(usage(
                "--leak-kinds, --leak-view, --max-leaked-bytes, --suppressions and --baseline need --leak-check",
            ));
        }
        if self.check && guard {
            return Err(usage("--leak-check does not work with --guard yet"));
        }
        Ok(())
    }

    /// Each preload variable and its value, `None` to remove it.
    pub fn variables(&self) -> [(&'static str, Option<String>); 2] {
        [
            (VARIABLES[0], self.check.then(|| "1".to_owned())),
            (
                VARIABLES[1],
                (self.check && self.lsan).then(|| "1".to_owned()),
            ),
        ]
    }

    /// The report's gate, with the suppressions and baseline files read; a one-line error
    /// if one cannot be read.
    pub fn gate(&self) -> Result<LeakGate, String> {
        let mut gate = LeakGate::default();
        if let Some(kinds) = &self.kinds {
            gate.kinds = kinds.clone();
        }
        gate.max_leaked_bytes = self.max_leaked_bytes;
        if let Some(path) = &self.suppressions {
            let text = read(path)?;
            let patterns = parse_suppressions(&text)
                .map_err(|e| format!("suppressions file {}: {e}", path.display()))?;
            gate.suppressions.extend(patterns);
        }
        if let Some(path) = &self.baseline {
            gate.baseline = Some(read_baseline(path)?);
        }
        Ok(gate)
    }
}

fn kinds(text: &str) -> Result<Vec<u32>, UsageError> {
    let mut codes = Vec::new();
    for name in text.split(',') {
        let Some(code) = kind_code(name.trim()) else {
            return Err(usage(format!(
                "option --leak-kinds expects definite, indirect, possible or reachable, not '{name}'"
            )));
        };
        codes.push(code);
    }
    Ok(codes)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Name of the format of a baseline file.
const BASELINE_FORMAT: &str = "memwarden-leak-baseline";

/// The leak ids of a baseline file.
pub fn read_baseline(path: &Path) -> Result<BTreeSet<String>, String> {
    let text = read(path)?;
    let bad = |what: &str| format!("baseline {}: {what}", path.display());
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(&format!("not JSON ({e})")))?;
    if value.get("format").and_then(|f| f.as_str()) != Some(BASELINE_FORMAT) {
        return Err(bad(&format!("not a {BASELINE_FORMAT} file")));
    }
    let leaks = value
        .get("leaks")
        .and_then(|l| l.as_array())
        .ok_or_else(|| bad("no `leaks` array"))?;
    leaks
        .iter()
        .map(|leak| {
            leak.get("id")
                .and_then(|id| id.as_str())
                .map(str::to_owned)
                .ok_or_else(|| bad("a leak without an `id`"))
        })
        .collect()
}

/// `memwarden leaks --write-baseline REPORT [-o FILE]`.
#[derive(Debug, PartialEq, Eq)]
pub struct LeaksArgs {
    /// A report.json, or the output folder that holds one.
    pub report: PathBuf,
    /// Where the baseline goes; `None`: stdout.
    pub output: Option<PathBuf>,
}

pub(crate) fn parse_leaks(args: impl Iterator<Item = OsString>) -> Result<LeaksArgs, UsageError> {
    let mut flags = Flags {
        args: args.peekable(),
    };
    let mut report = None;
    let mut output = None;
    while let Some(arg) = flags.next() {
        match arg {
            crate::args::Arg::Option(name, attached) => match name.as_str() {
                "--write-baseline" => report = Some(flags.value(&name, attached)?.into()),
                "-o" | "--output" => output = Some(flags.value(&name, attached)?.into()),
                _ => {
                    return Err(usage(format!(
                        "unknown option '{name}' for `memwarden leaks`"
                    )))
                }
            },
            _ => {
                return Err(usage(
                    "`memwarden leaks` takes --write-baseline REPORT [-o FILE]",
                ))
            }
        }
    }
    let report =
        report.ok_or_else(|| usage("missing --write-baseline REPORT for `memwarden leaks`"))?;
    Ok(LeaksArgs { report, output })
}

/// Writes the baseline of every leak in the report (every kind, suppressed or not).
pub fn write_baseline(args: &LeaksArgs) -> Result<(), String> {
    let path = if args.report.is_dir() {
        args.report.join(memwarden::report::REPORT_FILE)
    } else {
        args.report.clone()
    };
    let report: memwarden::report::json::Report = serde_json::from_str(&read(&path)?)
        .map_err(|e| format!("{}: not a memwarden report ({e})", path.display()))?;
    let mut leaks = Vec::new();
    for process in &report.processes {
        for leak in &process.leaks {
            let frames: Vec<String> = process.frames_of(&leak.frames).map(|f| f.label()).collect();
            leaks.push(serde_json::json!({
                "id": leak.id,
                "kind": leak.kind,
                "bytes": leak.bytes,
                "blocks": leak.blocks,
                "frames": frames,
            }));
        }
    }
    let baseline = serde_json::json!({
        "format": BASELINE_FORMAT,
        "version": 1,
        "command": report.command,
        "leaks": leaks,
    });
    let text = serde_json::to_string_pretty(&baseline).map_err(|e| e.to_string())? + "\n";
    match &args.output {
        Some(out) => {
            std::fs::write(out, text).map_err(|e| format!("cannot write {}: {e}", out.display()))
        }
        None => {
            use std::io::Write;
            let _ = std::io::stdout().write_all(text.as_bytes());
            Ok(())
        }
    }
}
