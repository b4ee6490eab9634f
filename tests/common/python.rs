//! Helpers of the Python tests: the repo's venv Python (with NumPy), scripts written into
//! the scratch folder with markers for their lines, runs under `memwarden run`, and
//! `report.json` read by Python line (the innermost frame in the test's own script).

use serde::Deserialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::report::basename;
use super::{profile_with, skip_or_fail, Outcome, RunOptions, Scratch};

/// `.venv/bin/python` of the repo (scripts/test.sh makes it), if it imports everything in
/// `modules`; otherwise `None`, after [`skip_or_fail`].
pub fn venv_python(modules: &str) -> Option<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let ready = std::process::Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if ready {
        Some(python)
    } else {
        skip_or_fail(&format!(".venv/bin/python with {modules}"));
        None
    }
}

/// A Python script a test wrote, with its source.
pub struct Script {
    pub path: PathBuf,
    pub source: String,
}

impl Script {
    /// Writes `source` to `name` in the scratch folder.
    pub fn new(scratch: &Scratch, name: &str, source: &str) -> Script {
        Script {
            path: scratch.write(name, source),
            source: source.to_owned(),
        }
    }

    pub fn arg(&self) -> &str {
        self.path.to_str().expect("script path is UTF-8")
    }

    /// The file name, which a Python frame's `file` ends with.
    pub fn name(&self) -> &str {
        basename(self.arg())
    }

    /// The 1-based line holding `marker` (exactly once).
    pub fn line_of(&self, marker: &str) -> u32 {
        super::line_of(&self.source, marker)
    }
}

/// `body`, a Python script, after the ctypes declarations of memwarden's NumPy handler:
/// `handler_allocator()` gives the handler's `allocator`, whose functions the script then
/// calls directly, as NumPy does.
pub fn with_handler_types(body: &str) -> String {
    format!("{HANDLER_TYPES}{body}")
}

const HANDLER_TYPES: &str = r#"import ctypes


class Allocator(ctypes.Structure):
    _fields_ = [
        ("ctx", ctypes.c_void_p),
        ("malloc", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)),
        ("calloc", ctypes.c_void_p),
        ("realloc", ctypes.c_void_p),
        ("free", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)),
    ]


class Handler(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8), ("allocator", Allocator)]


def handler_allocator():
    get = ctypes.CDLL(None).memwarden_numpy_handler
    get.restype = ctypes.POINTER(Handler)
    return get().contents.allocator


"#;

/// A finished `memwarden run` of a Python script and its report, read for Python.
pub struct PyRun {
    pub outcome: Outcome,
    pub dir: PathBuf,
    pub report: PyReport,
}

/// `memwarden run -- PYTHON SCRIPT ARGS...` with `env` added to memwarden's environment.
pub fn run_script(
    scratch: &Scratch,
    python: &Path,
    script: &Script,
    args: &[&str],
    env: &[(&str, &str)],
) -> PyRun {
    let options = RunOptions {
        env,
        ..RunOptions::default()
    };
    run_script_with(scratch, python, script, args, &options)
}

/// `memwarden run OPTIONS -- PYTHON SCRIPT ARGS...`, as `options` say.
pub fn run_script_with(
    scratch: &Scratch,
    python: &Path,
    script: &Script,
    args: &[&str],
    options: &RunOptions,
) -> PyRun {
    let mut argv = vec![python.to_str().expect("utf-8 path"), script.arg()];
    argv.extend(args);
    let run = profile_with(scratch, &argv, options);
    let report = PyReport::load(&run.dir.join("report.json"));
    PyRun {
        outcome: run.outcome,
        dir: run.dir,
        report,
    }
}

#[derive(Debug, Deserialize)]
pub struct PyReport {
    pub processes: Vec<PyProcess>,
}

#[derive(Debug, Deserialize)]
pub struct PyProcess {
    pub pid: u32,
    pub ppid: u32,
    pub argv: Vec<String>,
    pub forked: bool,
    pub exit: Option<super::Exit>,
    pub peak_bytes: u64,
    pub stacks: Vec<PyStack>,
    #[serde(default)]
    pub errors: Vec<HeapError>,
    /// The per-process NumPy summary, when the report has one.
    #[serde(default)]
    pub numpy: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct PyStack {
    pub id: u64,
    pub frames: Vec<PyFrame>,
    pub site: Option<String>,
    #[serde(default)]
    pub category: Option<String>,
    pub at_peak_bytes: u64,
    pub live_bytes: u64,
    pub max_live_bytes: u64,
    pub allocated_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
}

#[derive(Debug, Deserialize)]
pub struct PyFrame {
    /// `native`, `python`, `arena` or `elided`.
    pub kind: String,
    /// Whether a native frame is a function inlined into the frame that follows it.
    #[serde(default)]
    pub inlined: bool,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct HeapError {
    pub kind: String,
    pub block_size: u64,
    pub offset: i64,
    pub stack: Option<Vec<PyFrame>>,
    pub alloc_stack: Option<Vec<PyFrame>>,
    pub free_stack: Option<Vec<PyFrame>>,
}

impl PyReport {
    pub fn load(path: &Path) -> PyReport {
        super::report::load_report_json(path)
    }

    /// The process whose argv runs `script` and that was not forked: the script's main
    /// process.
    pub fn main_process(&self, script: &Script) -> &PyProcess {
        let found: Vec<&PyProcess> = self
            .processes
            .iter()
            .filter(|p| !p.forked && p.argv.iter().any(|a| a == script.arg()))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "one main process; argvs: {:?}",
            self.argvs()
        );
        found[0]
    }

    pub fn argvs(&self) -> Vec<&Vec<String>> {
        self.processes.iter().map(|p| &p.argv).collect()
    }
}

/// The innermost frame of `frames` in `script` (by file name).
pub fn frame_in<'f>(frames: &'f [PyFrame], script: &Script) -> Option<&'f PyFrame> {
    frames.iter().find(|f| {
        f.file
            .as_deref()
            .is_some_and(|file| basename(file) == script.name())
    })
}

/// The line of the innermost frame of `frames` in `script`.
/// A heap error as the Python tests compare it: its kind, block size and offset (for a
/// size mismatch, the size `free` named), and the lines of `script` in its stacks.
#[derive(Debug, PartialEq, Eq)]
pub struct ErrorLines<'a> {
    pub kind: &'a str,
    pub block_size: u64,
    pub offset: i64,
    /// Where the block was allocated.
    pub alloc: Option<u32>,
    /// Where it was freed (for a double free, the first free).
    pub freed: Option<u32>,
    /// The call that found the error.
    pub found: Option<u32>,
}

/// The heap errors of `process`, as lines of `script`.
pub fn error_lines<'a>(process: &'a PyProcess, script: &Script) -> Vec<ErrorLines<'a>> {
    let line = |frames: &Option<Vec<PyFrame>>| frames.as_deref().and_then(|f| line_in(f, script));
    process
        .errors
        .iter()
        .map(|e| ErrorLines {
            kind: e.kind.as_str(),
            block_size: e.block_size,
            offset: e.offset,
            alloc: line(&e.alloc_stack),
            freed: line(&e.free_stack),
            found: line(&e.stack),
        })
        .collect()
}

pub fn line_in(frames: &[PyFrame], script: &Script) -> Option<u32> {
    frame_in(frames, script).and_then(|f| f.line)
}

impl PyProcess {
    /// The exit code, if the process exited (not killed by a signal).
    pub fn exit_code(&self) -> Option<i32> {
        self.exit.as_ref().and_then(|e| e.code)
    }

    /// The stacks whose innermost frame in `script` is at `line`.
    pub fn stacks_at<'a>(
        &'a self,
        script: &'a Script,
        line: u32,
    ) -> impl Iterator<Item = &'a PyStack> + 'a {
        self.stacks
            .iter()
            .filter(move |s| line_in(&s.frames, script) == Some(line))
    }

    /// Bytes at the peak of the stacks at `line` of `script`.
    pub fn at_peak_at(&self, script: &Script, line: u32) -> u64 {
        self.stacks_at(script, line).map(|s| s.at_peak_bytes).sum()
    }

    /// Bytes allocated over the run by the stacks at `line` of `script`.
    pub fn allocated_at(&self, script: &Script, line: u32) -> u64 {
        self.stacks_at(script, line)
            .map(|s| s.allocated_bytes)
            .sum()
    }

    /// The stacks at `line` of `script` whose category is `numpy`.
    pub fn numpy_stacks_at<'a>(
        &'a self,
        script: &'a Script,
        line: u32,
    ) -> impl Iterator<Item = &'a PyStack> + 'a {
        self.stacks_at(script, line)
            .filter(|s| s.category.as_deref() == Some("numpy"))
    }

    /// The stacks with a frame in `script` that are NumPy data or had 10,000 bytes or more
    /// (at the peak or allocated), one line each, for failure messages.
    pub fn describe(&self, script: &Script) -> String {
        let mut out = format!(
            "pid {} ppid {} forked {} argv {:?} peak {} ({} stacks)\n",
            self.pid,
            self.ppid,
            self.forked,
            self.argv,
            self.peak_bytes,
            self.stacks.len()
        );
        for stack in &self.stacks {
            let Some(frame) = frame_in(&stack.frames, script) else {
                continue;
            };
            let big = stack.at_peak_bytes.max(stack.allocated_bytes) >= 10_000;
            if !big && stack.category.as_deref() != Some("numpy") {
                continue;
            }
            let _ = writeln!(
                out,
                "  stack {} {:?} at {}:{:?} ({:?}): at_peak {} live {} allocated {} in {}; frame 0 {:?}",
                stack.id,
                stack.category,
                script.name(),
                frame.line,
                frame.function,
                stack.at_peak_bytes,
                stack.live_bytes,
                stack.allocated_bytes,
                stack.allocations,
                stack.frames.first().and_then(|f| f.function.as_deref()),
            );
        }
        out
    }
}

/// The path of `name` among the tests NumPy ships in its wheel (`numpy/_core/tests/`).
pub fn numpy_test_file(python: &Path, name: &str) -> String {
    let program = format!(
        "import numpy, os; print(os.path.join(os.path.dirname(numpy.__file__), '_core', 'tests', {name:?}))"
    );
    let output = std::process::Command::new(python)
        .args(["-c", &program])
        .output()
        .expect("python runs");
    String::from_utf8(output.stdout)
        .expect("utf-8 path")
        .trim()
        .to_owned()
}
