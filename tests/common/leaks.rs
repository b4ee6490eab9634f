//! The leak-check part of `report.json` as the tests read it (report format 5, frames resolved), the runs
//! that produce it, and Valgrind memcheck as the oracle: its `definitely lost: X bytes in Y
//! blocks` lines, parsed, for the same program.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use super::{profile_with, Outcome, Profiled, RunOptions, Scratch, WATCHDOG};

#[derive(Debug, Deserialize)]
pub struct LeakReport {
    pub processes: Vec<LeakProcess>,
}

#[derive(Debug, Deserialize)]
pub struct LeakProcess {
    pub pid: u32,
    pub ppid: u32,
    pub argv: Vec<String>,
    pub leak_check: Option<LeakCheck>,
    pub leaks: Vec<Leak>,
    pub leak_summary: Option<Summary>,
}

#[derive(Debug, Deserialize)]
pub struct LeakCheck {
    pub status: String,
    pub view: String,
    pub scanned_bytes: u64,
    pub scan_ms: f64,
    pub threads_stopped: u32,
    pub threads_missed: u32,
}

#[derive(Debug, Deserialize, Clone)]
pub struct Leak {
    pub kind: String,
    pub bytes: u64,
    pub blocks: u64,
    pub stack_id: u32,
    pub id: String,
    pub suppressed: bool,
    pub frames: Vec<LeakFrame>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct LeakFrame {
    pub function: Option<String>,
}

impl Leak {
    /// Whether one of its frames is `function`.
    pub fn has_function(&self, function: &str) -> bool {
        self.frames
            .iter()
            .any(|f| f.function.as_deref() == Some(function))
    }
}

/// `(bytes, blocks)` of one kind.
#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
pub struct Total {
    pub bytes: u64,
    pub blocks: u64,
}

/// Totals per kind.
#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub definite: Total,
    pub indirect: Total,
    pub possible: Total,
    pub reachable: Total,
}

impl Summary {
    /// Each kind's `(bytes, blocks)`, in the order definite, indirect, possible, reachable.
    pub fn kinds(&self) -> [(u64, u64); 4] {
        [self.definite, self.indirect, self.possible, self.reachable].map(|t| (t.bytes, t.blocks))
    }
}

/// A finished `memwarden run --leak-check` and its leak figures.
pub struct LeakRun {
    pub profiled: Profiled,
    pub report: LeakReport,
}

impl LeakRun {
    pub fn outcome(&self) -> &Outcome {
        &self.profiled.outcome
    }

    /// The only process whose command is `name` (a test program's file name).
    pub fn process(&self, name: &str) -> &LeakProcess {
        let found: Vec<&LeakProcess> = self
            .report
            .processes
            .iter()
            .filter(|p| {
                p.argv
                    .first()
                    .is_some_and(|a| Path::new(a).file_name().is_some_and(|f| f == name))
            })
            .collect();
        assert_eq!(found.len(), 1, "one process of {name}: {:?}", self.report);
        found[0]
    }

    /// The summary of the one process, which must have had its check done.
    pub fn summary(&self, name: &str) -> Summary {
        let p = self.process(name);
        let check = p.leak_check.as_ref().expect("a leak check");
        assert_eq!(check.status, "done", "{p:?}");
        p.leak_summary.expect("a leak summary")
    }
}

/// `memwarden run --leak-check [options] -- argv...`.
pub fn run_leak_check(scratch: &Scratch, options: &[&str], argv: &[&str]) -> LeakRun {
    let mut all = vec!["--leak-check"];
    all.extend_from_slice(options);
    let profiled = profile_with(
        scratch,
        argv,
        &RunOptions {
            options: &all,
            ..RunOptions::default()
        },
    );
    let report: LeakReport = super::report::load_report_json(&profiled.dir.join("report.json"));
    LeakRun { profiled, report }
}

/// Valgrind memcheck's summary of `argv`, per process id, in its own words: `definitely`,
/// `indirectly`, `possibly`, `still reachable` lost bytes and blocks. `None` when valgrind
/// is not installed.
pub fn valgrind(scratch: &Scratch, argv: &[&str]) -> Option<BTreeMap<u32, Summary>> {
    memcheck_output(scratch, argv, "--trace-children=yes").map(|text| parse_valgrind(&text))
}

/// What memcheck writes on stderr for `argv` (full leak check, every kind shown, and
/// `option`); `None` when valgrind is not installed.
fn memcheck_output(scratch: &Scratch, argv: &[&str], option: &str) -> Option<String> {
    let probe = Command::new("valgrind").arg("--version").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        super::skip_or_fail("valgrind");
        return None;
    }
    let mut cmd = Command::new("valgrind");
    // glibc's and libstdc++'s free-at-exit routines are off: memwarden's check sees the
    // process as it ends, with what the C runtime keeps.
    cmd.args([
        "--leak-check=full",
        "--show-leak-kinds=all",
        "--run-libc-freeres=no",
        "--run-cxx-freeres=no",
        option,
    ])
    .args(argv)
    .current_dir(scratch.path());
    let outcome = super::run_watched(cmd, None, WATCHDOG, scratch);
    Some(outcome.stderr_text())
}

/// Parses valgrind's `LEAK SUMMARY` lines, per `==pid==` prefix.
pub fn parse_valgrind(text: &str) -> BTreeMap<u32, Summary> {
    let mut all: BTreeMap<u32, Summary> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("==") else {
            continue;
        };
        let Some((pid, body)) = rest.split_once("==") else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let body = body.trim();
        let Some((kind, figures)) = body.split_once(':') else {
            continue;
        };
        let index = match kind {
            "definitely lost" => 0,
            "indirectly lost" => 1,
            "possibly lost" => 2,
            "still reachable" => 3,
            _ => continue,
        };
        // " 1,234 bytes in 5 blocks"
        let numbers: Vec<u64> = figures
            .split_whitespace()
            .filter_map(|w| w.replace(',', "").parse().ok())
            .collect();
        if let [bytes, blocks] = numbers[..] {
            let summary = all.entry(pid).or_default();
            let slot = match index {
                0 => &mut summary.definite,
                1 => &mut summary.indirect,
                2 => &mut summary.possible,
                _ => &mut summary.reachable,
            };
            *slot = Total { bytes, blocks };
        }
    }
    all
}

/// The one process valgrind reported on.
pub fn only(summaries: BTreeMap<u32, Summary>) -> Summary {
    assert_eq!(
        summaries.len(),
        1,
        "one process in valgrind's output: {summaries:?}"
    );
    summaries.into_values().next().unwrap()
}

/// One loss record of memcheck: its process, kind (`definite`, `indirect`, `possible`,
/// `reachable`), direct bytes, blocks and the functions of its stack.
#[derive(Debug, Clone)]
pub struct LossRecord {
    pub pid: u32,
    pub kind: &'static str,
    pub bytes: u64,
    pub blocks: u64,
    pub functions: Vec<String>,
}

/// Valgrind memcheck's loss records for `argv` (every kind shown). `None` when valgrind is
/// not installed.
pub fn valgrind_records(scratch: &Scratch, argv: &[&str]) -> Option<Vec<LossRecord>> {
    memcheck_output(scratch, argv, "--num-callers=40").map(|text| parse_loss_records(&text))
}

/// Parses memcheck's `… bytes in N blocks are … lost in loss record …` paragraphs.
pub fn parse_loss_records(text: &str) -> Vec<LossRecord> {
    let mut records: Vec<LossRecord> = Vec::new();
    let mut open = false;
    for line in text.lines() {
        let Some((pid, body)) = line
            .strip_prefix("==")
            .and_then(|rest| rest.split_once("=="))
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let body = body.trim();
        if body.contains(" in loss record ") {
            let kind = if body.contains("definitely lost") {
                "definite"
            } else if body.contains("indirectly lost") {
                "indirect"
            } else if body.contains("possibly lost") {
                "possible"
            } else {
                "reachable"
            };
            // "160 (32 direct, 128 indirect) bytes in 1 blocks …" or "77 bytes in 1 blocks …"
            let number = |text: &str| -> u64 {
                let digits: String = text
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == ',')
                    .filter(|c| *c != ',')
                    .collect();
                digits.parse().unwrap_or(0)
            };
            let bytes = match body.split_once('(') {
                Some((_, direct)) if body.contains(" direct, ") => number(direct),
                _ => number(body),
            };
            let blocks = body
                .split(" bytes in ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.replace(',', "").parse().ok())
                .unwrap_or(0);
            records.push(LossRecord {
                pid,
                kind,
                bytes,
                blocks,
                functions: Vec::new(),
            });
            open = true;
        } else if open && (body.starts_with("at 0x") || body.starts_with("by 0x")) {
            if let Some(function) = body
                .split_once(": ")
                .map(|(_, rest)| rest.split(" (").next().unwrap_or(rest).to_owned())
            {
                records.last_mut().unwrap().functions.push(function);
            }
        } else {
            open = false;
        }
    }
    records
}

/// `(bytes, blocks)` per kind (definite, indirect, possible, reachable) of the records
/// whose stack holds one of `functions`.
pub fn valgrind_kinds_of(records: &[LossRecord], functions: &[&str]) -> [(u64, u64); 4] {
    by_kind(
        records
            .iter()
            .filter(|r| r.functions.iter().any(|f| functions.contains(&f.as_str())))
            .map(|r| (r.kind, r.bytes, r.blocks)),
    )
}

/// The same for memwarden's leaks of one process.
pub fn our_kinds_of(process: &LeakProcess, functions: &[&str]) -> [(u64, u64); 4] {
    by_kind(
        process
            .leaks
            .iter()
            .filter(|leak| functions.iter().any(|f| leak.has_function(f)))
            .map(|leak| (leak.kind.as_str(), leak.bytes, leak.blocks)),
    )
}

/// memcheck's figures per kind over every loss record.
pub fn valgrind_totals(records: &[LossRecord]) -> [(u64, u64); 4] {
    by_kind(records.iter().map(|r| (r.kind, r.bytes, r.blocks)))
}

/// `(bytes, blocks)` summed per kind, in the order definite, indirect, possible, reachable.
fn by_kind<'a>(items: impl Iterator<Item = (&'a str, u64, u64)>) -> [(u64, u64); 4] {
    let mut kinds = [(0, 0); 4];
    for (kind, bytes, blocks) in items {
        let index = ["definite", "indirect", "possible", "reachable"]
            .iter()
            .position(|k| *k == kind)
            .unwrap();
        kinds[index].0 += bytes;
        kinds[index].1 += blocks;
    }
    kinds
}
