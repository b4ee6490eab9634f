//! Shared helpers of the integration tests: find the built `memwarden`, compile C test
//! programs, run them under the profiler with a watchdog, and query `report.json`.
//!
//! Every test drives the real binaries (`target/release/memwarden` and
//! `target/release/libmemwarden.so`), so `cargo build --release` must have run first.
#![allow(dead_code, unused_imports)] // each test file uses a different subset of these helpers

pub mod failures;
pub mod guards;
pub mod leaks;
pub mod python;
pub mod report;
pub mod sql;

use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use report::{Exit, Frame, Process, Report, Stack};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;

/// How long any one command may run before the test calls it a hang and kills it.
pub const WATCHDOG: Duration = Duration::from_secs(120);

/// Every program a test compiles is named with this prefix; a frame whose module has it
/// belongs to "the test program" (see [`Process::program_function`]).
pub const PROGRAM_PREFIX: &str = "mwt_";

/// Flags of every C test program: optimised, with DWARF, but with no tail call merged into
/// `malloc` and no function inlined, so each allocation's stack names the function that
/// made it and the profiler has to unwind through code without frame pointers. Builtins
/// are off so that GCC cannot drop a `malloc`/`free` pair or turn `malloc`+`memset` into
/// `calloc`.
const CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fno-optimize-sibling-calls",
    "-fno-inline",
    "-fno-builtin",
    "-pthread",
    "-Wall",
    "-Werror",
];

/// Prepended to every C test program.
const C_PRELUDE: &str = r#"#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define NOINLINE __attribute__((noinline, noipa)) /* no inlining, cloning or merging: names stay */
#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)
/* Writes with write(2) so that no stdio buffer is allocated around the figures. */
__attribute__((unused)) NOINLINE static void say(const char *s) {
    ssize_t r = write(1, s, strlen(s));
    (void)r;
}
/* Stores a pointer where the compiler must assume it is used. */
void *volatile mwt_sink;
__attribute__((unused)) NOINLINE static void keep(void *p) { mwt_sink = p; }
"#;

/// The workspace's target directory (`CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

/// `target/release/memwarden`, after checking that it and the preload library are built.
pub fn memwarden() -> PathBuf {
    let release = target_dir().join("release");
    for name in ["memwarden", "libmemwarden.so"] {
        let path = release.join(name);
        assert!(
            path.is_file(),
            "{} is missing: run `cargo build --release` first (the tests drive the release binaries)",
            path.display()
        );
    }
    release.join("memwarden")
}

/// A C program a test compiled, with its full source (prelude included).
pub struct Program {
    pub path: PathBuf,
    pub source: String,
}

impl Program {
    /// The file name, which is what a frame's `module` ends with.
    pub fn name(&self) -> &str {
        self.path
            .file_name()
            .and_then(OsStr::to_str)
            .expect("program name")
    }

    /// The path as a `&str`, for argv.
    pub fn arg(&self) -> &str {
        self.path.to_str().expect("program path is UTF-8")
    }

    /// The 1-based line of the source that contains `marker` (exactly once).
    pub fn line_of(&self, marker: &str) -> u32 {
        line_of(&self.source, marker)
    }
}

/// The 1-based line of `source` that contains `marker` (exactly once).
pub fn line_of(source: &str, marker: &str) -> u32 {
    let lines: Vec<usize> = source
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "marker {marker:?} must occur once in the source"
    );
    lines[0] as u32
}

/// A scratch folder for one test, removed when the test passes and kept (its path printed)
/// when it fails.
pub struct Scratch {
    path: PathBuf,
    runs: AtomicU32,
}

impl Scratch {
    pub fn new(test: &str) -> Scratch {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir()
            .join("memwarden-tests")
            .join(format!("{test}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create scratch folder");
        Scratch {
            path: path.canonicalize().expect("canonical scratch path"),
            runs: AtomicU32::new(0),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to a file of the scratch folder and returns its path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path.join(name);
        fs::write(&path, contents).expect("write scratch file");
        path
    }

    /// A fresh, not yet existing, output folder for `memwarden run -o`.
    pub fn out_dir(&self) -> PathBuf {
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        self.path.join(format!("out{n}"))
    }

    /// Compiles `body` (after the common prelude) into the program `mwt_<name>`.
    pub fn compile(&self, name: &str, body: &str) -> Program {
        self.compile_with(name, body, &[])
    }

    /// Like [`Scratch::compile`], with extra gcc arguments (`-static`, `-shared -fPIC`, …).
    pub fn compile_with(&self, name: &str, body: &str, extra: &[&str]) -> Program {
        self.build("gcc", "c", name, body, extra)
    }

    /// Compiles C++ `body` (after the common prelude) with g++ into `mwt_<name>`.
    pub fn compile_cpp(&self, name: &str, body: &str) -> Program {
        self.build("g++", "cpp", name, body, &[])
    }

    /// Compiles the Rust program `source` with rustc (optimised, with DWARF) into
    /// `mwt_<name>`: a program whose runtime, unlike C's, allocates before `main` from inside
    /// glibc calls that hold locks.
    pub fn compile_rust(&self, name: &str, source: &str) -> Program {
        let name = format!("{PROGRAM_PREFIX}{name}");
        let source_file = self.write(&format!("{name}.rs"), source);
        let path = self.path.join(&name);
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let mut command = Command::new(&rustc);
        command
            .args(["--edition", "2021", "-O", "-g", "-o"])
            .arg(&path)
            .arg(&source_file);
        run_compiler(
            command,
            "rustc",
            "cargo's toolchain provides it",
            &source_file,
        );
        Program {
            path,
            source: source.to_owned(),
        }
    }

    fn build(
        &self,
        driver: &str,
        extension: &str,
        name: &str,
        body: &str,
        extra: &[&str],
    ) -> Program {
        let name = format!("{PROGRAM_PREFIX}{name}");
        let source = format!("{C_PRELUDE}{body}");
        let source_file = self.write(&format!("{name}.{extension}"), &source);
        let path = self.path.join(&name);
        let mut command = Command::new(driver);
        command
            .args(CFLAGS)
            .args(extra)
            .arg("-o")
            .arg(&path)
            .arg(&source_file)
            .arg("-ldl");
        run_compiler(command, driver, "scripts/test.sh installs it", &source_file);
        Program { path, source }
    }
}

/// Runs `compiler` (`command`) on `source_file`; a failure fails the test with its messages.
fn run_compiler(mut command: Command, compiler: &str, where_from: &str, source_file: &Path) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler} ({e}); {where_from}"));
    assert!(
        out.status.success(),
        "{compiler} failed on {}:\n{}",
        source_file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "kept the scratch folder of the failed test: {}",
                self.path.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// What a finished command did.
#[derive(Debug)]
pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Outcome {
    /// The exit code; panics (with the output) if the command was killed by a signal.
    pub fn code(&self) -> i32 {
        match self.status.code() {
            Some(code) => code,
            None => panic!(
                "the command was killed by signal {:?}; stderr:\n{}",
                self.status.signal(),
                self.stderr_text()
            ),
        }
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Runs `cmd` to completion with stdout and stderr captured, stdin from `stdin` (or empty),
/// and kills its whole process group if it runs longer than `timeout` (then the test fails:
/// that is a hang, not a slow run).
pub fn run_watched(
    mut cmd: Command,
    stdin: Option<&Path>,
    timeout: Duration,
    scratch: &Scratch,
) -> Outcome {
    let n = scratch.runs.fetch_add(1, Ordering::Relaxed);
    let out_path = scratch.path.join(format!("run{n}.stdout"));
    let err_path = scratch.path.join(format!("run{n}.stderr"));
    cmd.stdout(File::create(&out_path).expect("stdout file"))
        .stderr(File::create(&err_path).expect("stderr file"))
        .stdin(match stdin {
            Some(path) => Stdio::from(File::open(path).expect("stdin file")),
            None => Stdio::null(),
        })
        .process_group(0);
    let description = format!("{cmd:?}");
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {description}: {e}"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the command") {
            break status;
        }
        if started.elapsed() > timeout {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
            panic!(
                "{description} did not finish within {timeout:?} (hang?); stderr so far:\n{}",
                String::from_utf8_lossy(&fs::read(&err_path).unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Outcome {
        status,
        stdout: fs::read(&out_path).expect("read stdout"),
        stderr: fs::read(&err_path).expect("read stderr"),
    }
}

/// `memwarden ARGS...`, run with the watchdog.
pub fn memwarden_cmd(scratch: &Scratch, args: &[&str]) -> Outcome {
    let mut cmd = Command::new(memwarden());
    cmd.args(args).current_dir(scratch.path());
    run_watched(cmd, None, WATCHDOG, scratch)
}

/// A finished `memwarden run` and the report it wrote.
pub struct Profiled {
    pub outcome: Outcome,
    pub dir: PathBuf,
    pub report: Report,
}

/// Options of one `memwarden run`.
#[derive(Default)]
pub struct RunOptions<'a> {
    /// Options placed between `run` and `--` (besides `-o`).
    pub options: &'a [&'a str],
    /// Extra environment variables of the `memwarden` process.
    pub env: &'a [(&'a str, &'a str)],
    /// A file given to the command as standard input.
    pub stdin: Option<&'a Path>,
    /// How long the run may take before it is killed (default [`WATCHDOG`]).
    pub watchdog: Option<Duration>,
}

/// `memwarden run -o <fresh dir> -- argv...`; loads the report it wrote.
pub fn profile(scratch: &Scratch, argv: &[&str]) -> Profiled {
    profile_with(scratch, argv, &RunOptions::default())
}

/// [`profile`] with options, environment or standard input.
pub fn profile_with(scratch: &Scratch, argv: &[&str], opts: &RunOptions) -> Profiled {
    let dir = scratch.out_dir();
    let mut cmd = Command::new(memwarden());
    cmd.arg("run")
        .arg("-o")
        .arg(&dir)
        .args(opts.options)
        .arg("--")
        .args(argv)
        .current_dir(scratch.path());
    for (key, value) in opts.env {
        cmd.env(key, value);
    }
    let watchdog = opts.watchdog.unwrap_or(WATCHDOG);
    let outcome = run_watched(cmd, opts.stdin, watchdog, scratch);
    let report = Report::load(&dir.join("report.json")).unwrap_or_else(|e| {
        panic!(
            "memwarden run -- {argv:?} wrote no readable report ({e}); exit {:?}, stderr:\n{}",
            outcome.status,
            outcome.stderr_text()
        )
    });
    Profiled {
        outcome,
        dir,
        report,
    }
}

/// Asserts that a command exited 0, showing its stderr otherwise.
pub fn assert_success(outcome: &Outcome, what: &str) {
    assert!(
        outcome.status.success(),
        "{what} failed with {:?}; stdout:\n{}\nstderr:\n{}",
        outcome.status,
        outcome.stdout_text(),
        outcome.stderr_text()
    );
}

/// Asserts the shape of every error: non-zero exit (not a signal), one line on stderr
/// starting with `memwarden:`, no panic message, nothing on stdout.
pub fn assert_one_line_error(outcome: &Outcome, what: &str) {
    let stderr = outcome.stderr_text();
    assert!(
        outcome.status.code().is_some_and(|c| c != 0),
        "{what}: expected a non-zero exit code, got {:?}; stderr:\n{stderr}",
        outcome.status
    );
    let line = stderr.trim();
    assert!(
        !line.contains('\n'),
        "{what}: the error must be one line, got:\n{stderr}"
    );
    assert!(
        line.starts_with("memwarden:"),
        "{what}: the error must start with `memwarden:`, got:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{what}: panicked:\n{stderr}");
    assert!(
        outcome.stdout.is_empty(),
        "{what}: stdout should be empty, got:\n{}",
        outcome.stdout_text()
    );
}

/// Runs a program without the profiler (to compare with a profiled run).
pub fn run_bare(scratch: &Scratch, argv: &[&str], stdin: Option<&Path>) -> Outcome {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]).current_dir(scratch.path());
    run_watched(cmd, stdin, WATCHDOG, scratch)
}

/// The real `python3` interpreter (not a version manager's shim script).
pub fn python3() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (out.status.success() && path.is_file()).then_some(path)
}

/// Called when a tool a test needs is missing: fails on CI (CI is set), where
/// scripts/test.sh installs everything, and otherwise says the test is skipped.
pub fn skip_or_fail(tool: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{tool} is not installed, and on CI (CI is set) scripts/test.sh must install it"
    );
    eprintln!("SKIPPED: {tool} is not installed (scripts/test.sh installs it)");
}
