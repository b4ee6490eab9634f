//! One `memwarden run` of the sweep, as a subprocess of this very executable: in a process
//! group of its own, its stdin empty and its output in files of its folder, killed with
//! its whole group when the timeout expires or the sweep is interrupted (Ctrl-C).

use std::ffi::OsString;
use std::fs::{self, File};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use memwarden::run_record::RUN_RECORD_FILE;

use crate::io_reason;
use crate::sweep_outcome::Ended;

/// The run's standard output, in its folder.
pub const STDOUT_FILE: &str = "stdout.txt";
/// The run's standard error (the target's, then memwarden's summary), in its folder.
pub const STDERR_FILE: &str = "stderr.txt";
/// How often a waiting run looks at the interrupt flag.
const INTERRUPT_POLL: Duration = Duration::from_millis(100);
/// Status of `memwarden run` when it refuses its arguments or the target.
const REFUSED_STATUS: i32 = 2;
/// What starts every one-line error of memwarden.
const ERROR_PREFIX: &str = "memwarden: error: ";

/// Set by SIGINT, SIGTERM or SIGHUP once [`catch_interrupts`] ran.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// One run to make.
pub struct RunRequest<'a> {
    /// The `memwarden` executable.
    pub exe: &'a Path,
    /// The run's output folder (created if missing).
    pub dir: &'a Path,
    /// A `--fail` rule, or none for the discovery run.
    pub fail: Option<&'a str>,
    /// The command and its arguments.
    pub command: &'a [OsString],
    /// How long the run may take.
    pub timeout: Duration,
}

/// A finished run.
#[derive(Debug)]
pub struct Finished {
    /// How `memwarden run` ended.
    pub ended: Ended,
    /// How long it took.
    pub elapsed: Duration,
    /// `memwarden run` refused to start the target: its one-line reason.
    pub refused: Option<String>,
}

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Its folder or output files could not be created.
    #[error("cannot create {}: {reason}", path.display())]
    Files {
        /// What could not be created.
        path: PathBuf,
        /// Why, in a few words.
        reason: String,
    },
    /// `memwarden run` could not be started.
    #[error("cannot start {}: {reason}", exe.display())]
    Spawn {
        /// The executable.
        exe: PathBuf,
        /// Why, in a few words.
        reason: String,
    },
    /// The sweep was interrupted; the run was killed.
    #[error("interrupted")]
    Interrupted,
}

extern "C" fn on_interrupt(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// From now on Ctrl-C (SIGINT), SIGTERM and SIGHUP stop the sweep cleanly: the runs in
/// progress are killed with their process groups (which the terminal's signal misses).
pub fn catch_interrupts() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let handler: extern "C" fn(libc::c_int) = on_interrupt;
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, handler as libc::sighandler_t) };
    }
}

/// Whether an interrupt arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Makes the run and waits for it, at most `timeout`.
pub fn run_once(request: &RunRequest) -> Result<Finished, RunError> {
    let files_error = |path: &Path, e: std::io::Error| RunError::Files {
        path: path.to_owned(),
        reason: io_reason(&e),
    };
    fs::create_dir_all(request.dir).map_err(|e| files_error(request.dir, e))?;
    let output = |name: &str| {
        let path = request.dir.join(name);
        File::create(&path).map_err(|e| files_error(&path, e))
    };
    let mut command = Command::new(request.exe);
    command.arg("run").arg("-o").arg(request.dir);
    match request.fail {
        Some(rule) => {
            command.arg("--fail").arg(rule);
        }
        // The discovery run: every call site, however many stacks the program has.
        None => {
            command.arg("--all-stacks");
        }
    }
    command
        .arg("--")
        .args(request.command)
        .stdin(Stdio::null())
        .stdout(output(STDOUT_FILE)?)
        .stderr(output(STDERR_FILE)?)
        .process_group(0);
    if interrupted() {
        return Err(RunError::Interrupted);
    }
    let started = Instant::now();
    let child = command.spawn().map_err(|e| RunError::Spawn {
        exe: request.exe.to_owned(),
        reason: io_reason(&e),
    })?;
    let (ended, killed_for_interrupt) = wait(child, request.timeout);
    if killed_for_interrupt {
        return Err(RunError::Interrupted);
    }
    let refused = match ended {
        Ended::Exited(REFUSED_STATUS) if !request.dir.join(RUN_RECORD_FILE).exists() => {
            Some(refusal(&request.dir.join(STDERR_FILE)))
        }
        _ => None,
    };
    Ok(Finished {
        ended,
        elapsed: started.elapsed(),
        refused,
    })
}

/// Waits for `child`, killing its process group on timeout or interrupt; the second value
/// says it was killed for an interrupt.
fn wait(mut child: std::process::Child, timeout: Duration) -> (Ended, bool) {
    let group = child.id() as libc::pid_t;
    let (sender, receiver) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = sender.send(child.wait());
    });
    let deadline = Instant::now() + timeout;
    let mut killed = None;
    let status = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let slice = match killed {
            Some(_) => INTERRUPT_POLL,
            None => left.min(INTERRUPT_POLL),
        };
        match receiver.recv_timeout(slice) {
            Ok(status) => break status,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let interrupt = interrupted();
                if killed.is_none() && (interrupt || left.is_zero()) {
                    // SAFETY: kill takes plain integers; a negative pid names the process
                    // group the child leads (it was spawned with process_group(0) and is
                    // not reaped yet, so the group id is still its own).
                    unsafe { libc::kill(-group, libc::SIGKILL) };
                    killed = Some(interrupt);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break receiver_gone(),
        }
    };
    let _ = waiter.join();
    match killed {
        Some(interrupt) => (Ended::TimedOut, interrupt),
        None => (ended(status), false),
    }
}

/// The waiter thread ended without sending: treated as a failed wait.
fn receiver_gone() -> std::io::Result<ExitStatus> {
    Err(std::io::Error::other("the waiting thread ended"))
}

fn ended(status: std::io::Result<ExitStatus>) -> Ended {
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => Ended::Exited(code),
            (None, Some(signal)) => Ended::Signalled(signal),
            (None, None) => Ended::Exited(1),
        },
        Err(_) => Ended::Exited(1),
    }
}

/// The reason `memwarden run` gave for refusing, from its stderr file.
fn refusal(stderr_file: &Path) -> String {
    let text = fs::read(stderr_file).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    text.lines()
        .rev()
        .find_map(|line| line.strip_prefix(ERROR_PREFIX))
        .map_or_else(
            || format!("memwarden run refused it (see {})", stderr_file.display()),
            str::to_owned,
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(exe: &'a Path, dir: &'a Path, command: &'a [OsString]) -> RunRequest<'a> {
        RunRequest {
            exe,
            dir,
            fail: None,
            command,
            timeout: Duration::from_secs(5),
        }
    }

    /// A stand-in for `memwarden`: a shell script given `run -o DIR -- CMD…`.
    fn stub(scratch: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = scratch.join("stub.sh");
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn the_status_and_output_files_of_a_run() {
        let scratch = tempfile::tempdir().unwrap();
        let exe = stub(scratch.path(), "echo \"$@\"; echo oops >&2; exit 3");
        let dir = scratch.path().join("runs/001");
        let command = [OsString::from("prog"), OsString::from("x")];
        let finished = run_once(&request(&exe, &dir, &command)).unwrap();
        assert_eq!((finished.ended, finished.refused), (Ended::Exited(3), None));
        let stdout = fs::read_to_string(dir.join(STDOUT_FILE)).unwrap();
        // The discovery run (no rule) lists every stack, so that every call site is found.
        let expected = format!("run -o {} --all-stacks -- prog x\n", dir.display());
        assert_eq!(stdout, expected);
        assert_eq!(fs::read_to_string(dir.join(STDERR_FILE)).unwrap(), "oops\n");
    }

    #[test]
    fn a_timeout_kills_the_whole_group() {
        let scratch = tempfile::tempdir().unwrap();
        let marker = scratch.path().join("survived");
        let exe = stub(
            scratch.path(),
            &format!("(sleep 2; touch {}) & sleep 30", marker.display()),
        );
        let dir = scratch.path().join("run");
        let mut request = request(&exe, &dir, &[]);
        request.timeout = Duration::from_millis(300);
        let finished = run_once(&request).unwrap();
        assert_eq!(finished.ended, Ended::TimedOut);
        assert!(finished.elapsed < Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(2500));
        assert!(!marker.exists(), "the background child was killed too");
    }

    #[test]
    fn a_refusal_is_recognised_by_its_status_and_missing_run_record() {
        let scratch = tempfile::tempdir().unwrap();
        let exe = stub(
            scratch.path(),
            "echo 'memwarden: error: no such program: nope' >&2; exit 2",
        );
        let dir = scratch.path().join("run");
        let finished = run_once(&request(&exe, &dir, &[])).unwrap();
        assert_eq!(finished.refused.as_deref(), Some("no such program: nope"));
        fs::write(dir.join(RUN_RECORD_FILE), "{}").unwrap();
        let finished = run_once(&request(&exe, &dir, &[])).unwrap();
        assert_eq!((finished.ended, finished.refused), (Ended::Exited(2), None));
    }
}
