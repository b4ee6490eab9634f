//! `report.json` as the tests read it (the contract of issue 2), and the queries the tests
//! make on it: figures by the test-program function a stack belongs to.

use serde::Deserialize;
use std::fmt::Write as _;
use std::path::Path;

use super::PROGRAM_PREFIX;

#[derive(Debug, Deserialize)]
pub struct Report {
    pub format_version: serde_json::Value,
    pub command: Vec<String>,
    pub processes: Vec<Process>,
}

#[derive(Debug, Deserialize)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    pub argv: Vec<String>,
    /// `None` when the report does not know how the process ended.
    pub exit: Option<Exit>,
    pub peak_bytes: u64,
    pub peak_time_ms: f64,
    pub totals: Totals,
    pub not_freed_bytes: u64,
    pub stacks: Vec<Stack>,
    pub replaced_by_exec: bool,
    pub forked: bool,
    /// The program defines its own `malloc`, whose calls memwarden does not see.
    pub own_malloc: bool,
    /// Why tracking stopped early, or `None` if it did not.
    pub degraded: Option<String>,
    /// How small stacks were merged (`profile_stacks`, `merged_stacks`, `merged_entries`,
    /// `share`), or `None` when every stack is listed.
    pub pruned: Option<serde_json::Value>,
}

/// `{"code": N}` or `{"signal": N}`.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl Exit {
    pub fn code(code: i32) -> Exit {
        Exit {
            code: Some(code),
            signal: None,
        }
    }

    pub fn signal(signal: i32) -> Exit {
        Exit {
            code: None,
            signal: Some(signal),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct Totals {
    pub allocated_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
}

#[derive(Debug, Deserialize)]
pub struct Stack {
    pub id: u64,
    pub frames: Vec<Frame>,
    pub at_peak_bytes: u64,
    pub at_peak_blocks: u64,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub max_live_bytes: u64,
    pub allocated_bytes: u64,
    pub allocations: u64,
    /// How many of the profile's stacks this entry stands for (more than 1 once merged).
    pub merged_stacks: u64,
}

#[derive(Debug, Deserialize)]
pub struct Frame {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: Option<String>,
}

impl Stack {
    /// `(function, line)` of the frames in a program the test compiled, innermost first.
    pub fn program_lines(&self) -> Vec<(String, u32)> {
        self.frames
            .iter()
            .filter(|f| f.in_test_program())
            .map(|f| (f.function.clone().unwrap_or_default(), f.line.unwrap_or(0)))
            .collect()
    }
}

/// The last path component of `path`.
pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

impl Frame {
    /// Whether the frame is code of a program the test compiled.
    pub fn in_test_program(&self) -> bool {
        self.module
            .as_deref()
            .is_some_and(|m| basename(m).starts_with(PROGRAM_PREFIX))
    }
}

/// report.json at `path`, with every stack's frames as frame objects: since format 5 a
/// process lists its distinct frames once (`frames`), and its stacks, injected failures,
/// crash, heap errors and leaks name them by index; the indices are replaced by the frames
/// here.
pub fn read_report_json(path: &Path) -> Result<serde_json::Value, String> {
    let failed = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| failed(&e))?;
    let mut json: serde_json::Value = serde_json::from_str(&text).map_err(|e| failed(&e))?;
    for process in json["processes"].as_array_mut().into_iter().flatten() {
        let table = process["frames"].as_array().cloned().unwrap_or_default();
        // The format's promise: each distinct frame once.
        let distinct: std::collections::HashSet<String> =
            table.iter().map(|frame| frame.to_string()).collect();
        if distinct.len() != table.len() {
            return Err(failed(&format!(
                "{} of the {} frames of the table repeat another",
                table.len() - distinct.len(),
                table.len()
            )));
        }
        let resolve = |frames: &mut serde_json::Value| -> Result<(), String> {
            for frame in frames.as_array_mut().into_iter().flatten() {
                let index = frame
                    .as_u64()
                    .ok_or_else(|| failed(&"a frame is not an index"))?;
                *frame = table
                    .get(index as usize)
                    .cloned()
                    .ok_or_else(|| failed(&format!("frame index {index} past the table")))?;
            }
            Ok(())
        };
        for list in ["stacks", "injected_failures", "leaks"] {
            for item in process[list].as_array_mut().into_iter().flatten() {
                resolve(&mut item["frames"])?;
            }
        }
        if !process["crash"].is_null() {
            resolve(&mut process["crash"]["frames"])?;
        }
        for error in process["errors"].as_array_mut().into_iter().flatten() {
            for stack in ["stack", "alloc_stack", "free_stack"] {
                resolve(&mut error[stack])?;
            }
        }
    }
    Ok(json)
}

/// [`read_report_json`], deserialized as `T`; panics with the path and the error.
pub fn load_report_json<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    read_report_json(path)
        .and_then(|json| {
            serde_json::from_value(json).map_err(|e| format!("{}: {e}", path.display()))
        })
        .unwrap_or_else(|e| panic!("{e}"))
}

impl Report {
    pub fn load(path: &Path) -> Result<Report, String> {
        let json = read_report_json(path)?;
        serde_json::from_value(json).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The processes whose argv[0] names the program `name` (a path or a file name).
    pub fn processes_of(&self, name: &str) -> Vec<&Process> {
        let name = basename(name);
        self.processes
            .iter()
            .filter(|p| p.argv.first().is_some_and(|a| basename(a) == name))
            .collect()
    }

    /// The one process whose argv[0] names `name`.
    pub fn process_of(&self, name: &str) -> &Process {
        let found = self.processes_of(name);
        assert_eq!(
            found.len(),
            1,
            "expected one process of {name}; report has:\n{}",
            self.describe()
        );
        found[0]
    }

    /// The only process of the report.
    pub fn only_process(&self) -> &Process {
        assert_eq!(
            self.processes.len(),
            1,
            "expected one process; report has:\n{}",
            self.describe()
        );
        &self.processes[0]
    }

    /// A short listing of every process, for failure messages.
    pub fn describe(&self) -> String {
        self.processes.iter().map(Process::describe).collect()
    }
}

impl Process {
    /// The function of the innermost frame of `stack` that is in the test program and has
    /// a name: the function the tests attribute the stack to.
    pub fn program_function(stack: &Stack) -> Option<&str> {
        stack
            .frames
            .iter()
            .find(|f| f.in_test_program() && f.function.is_some())
            .and_then(|f| f.function.as_deref())
    }

    /// The stacks attributed to `function`.
    pub fn stacks_in<'a>(&'a self, function: &'a str) -> impl Iterator<Item = &'a Stack> + 'a {
        self.stacks
            .iter()
            .filter(move |s| Self::program_function(s) == Some(function))
    }

    fn sum(&self, function: &str, field: fn(&Stack) -> u64) -> u64 {
        self.stacks_in(function).map(field).sum()
    }

    /// Bytes live at the process's peak in stacks attributed to `function`.
    pub fn at_peak(&self, function: &str) -> u64 {
        self.sum(function, |s| s.at_peak_bytes)
    }

    pub fn at_peak_blocks(&self, function: &str) -> u64 {
        self.sum(function, |s| s.at_peak_blocks)
    }

    /// Bytes live at exit in stacks attributed to `function`.
    pub fn live(&self, function: &str) -> u64 {
        self.sum(function, |s| s.live_bytes)
    }

    pub fn live_blocks(&self, function: &str) -> u64 {
        self.sum(function, |s| s.live_blocks)
    }

    pub fn allocated(&self, function: &str) -> u64 {
        self.sum(function, |s| s.allocated_bytes)
    }

    pub fn allocations(&self, function: &str) -> u64 {
        self.sum(function, |s| s.allocations)
    }

    /// The sum over `function`'s stacks of each stack's highest live bytes.
    pub fn max_live(&self, function: &str) -> u64 {
        self.sum(function, |s| s.max_live_bytes)
    }

    /// The sum of every stack's bytes at the peak.
    pub fn at_peak_total(&self) -> u64 {
        self.stacks.iter().map(|s| s.at_peak_bytes).sum()
    }

    /// The peak is consistent with its stacks and within 64 KiB above the bytes the test
    /// program knows it had live then (the C runtime allocates a little of its own).
    pub fn assert_peak_near(&self, known: u64) {
        assert_eq!(
            self.peak_bytes,
            self.at_peak_total(),
            "peak_bytes must equal the sum of the stacks' at_peak_bytes\n{}",
            self.describe()
        );
        assert!(
            self.peak_bytes >= known && self.peak_bytes < known + 64 * 1024,
            "peak_bytes {} should be in [{known}, {known} + 64 KiB)\n{}",
            self.peak_bytes,
            self.describe()
        );
    }

    /// A short listing of the process and its stacks with test-program frames (plus the
    /// count of the others), for failure messages.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "process pid {} ppid {} argv {:?} exit {:?} peak {} not_freed {} forked {} replaced_by_exec {} \
             ({} stacks)\n",
            self.pid,
            self.ppid,
            self.argv,
            self.exit,
            self.peak_bytes,
            self.not_freed_bytes,
            self.forked,
            self.replaced_by_exec,
            self.stacks.len()
        );
        let mut others = (0u64, 0u64, 0u64);
        for stack in &self.stacks {
            let Some(function) = Self::program_function(stack) else {
                others.0 += 1;
                others.1 += stack.at_peak_bytes;
                others.2 += stack.allocated_bytes;
                continue;
            };
            let frames: Vec<&str> = stack
                .frames
                .iter()
                .map(|f| f.function.as_deref().unwrap_or("?"))
                .collect();
            let _ = writeln!(
                out,
                "  {function}: at_peak {}/{} live {}/{} max_live {} allocated {} in {} [{}]",
                stack.at_peak_bytes,
                stack.at_peak_blocks,
                stack.live_bytes,
                stack.live_blocks,
                stack.max_live_bytes,
                stack.allocated_bytes,
                stack.allocations,
                frames.join(" < ")
            );
        }
        let _ = writeln!(
            out,
            "  + {} stacks outside the test program: at_peak {} allocated {}",
            others.0, others.1, others.2
        );
        out
    }
}
