//! The `memwarden` command: the user's entry to the pipeline. `run` starts a program with
//! the preload (interposed call → event → store) and then renders its report
//! (analysis → report); `report` renders an earlier run's report again.
#![deny(unsafe_op_in_unsafe_fn)]

mod args;
mod discard;
mod fail_args;
mod guard_args;
mod leak_args;
mod library_pools;
mod look_ahead;
mod output_dir;
mod preload_lib;
mod python_bytecode;
mod python_env;
mod report_cmd;
mod run;
mod run_signals;
mod sweep;
mod sweep_args;
mod sweep_outcome;
mod sweep_progress;
mod sweep_report;
mod sweep_result;
mod sweep_runner;
mod sweep_summary;
mod target_check;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use args::Command;

/// Under an address-space limit (`ulimit -v`, which the target and memwarden share), glibc
/// keeps one heap for all of memwarden's threads: each further heap reserves 64 MiB of
/// address space, and three threads reporting at once ran a 200 MB limit out and aborted
/// the report. Without a limit, nothing changes.
fn fit_address_space_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct passed; mallopt only sets a malloc
    // parameter, before any other thread exists.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_AS, &mut limit) == 0
            && limit.rlim_cur != libc::RLIM_INFINITY
        {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

/// Exit status of a refused command line or target.
const USAGE_STATUS: u8 = 2;
/// Exit status of `report` on unreadable input.
const REPORT_FAILED_STATUS: u8 = 1;
/// Exit status of `sweep` when a site crashed or hung (the CI gate).
const SWEEP_FOUND_STATUS: u8 = 1;

fn main() -> ExitCode {
    fit_address_space_limit();
    let command = match args::parse(std::env::args_os().skip(1).collect()) {
        Ok(command) => command,
        Err(e) => return fail(&e.to_string(), USAGE_STATUS),
    };
    match command {
        Command::Help => {
            let _ = std::io::stdout().write_all(args::USAGE.as_bytes());
            ExitCode::SUCCESS
        }
        Command::Version => {
            let _ = writeln!(std::io::stdout(), "memwarden {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Run(run_args) => {
            match run::run(&run_args, colour(std::io::stderr().is_terminal())) {
                Ok(status) => ExitCode::from(status.clamp(0, 255) as u8),
                Err(message) => fail(&message, USAGE_STATUS),
            }
        }
        Command::Sweep(sweep_args) => {
            match sweep::sweep(&sweep_args, std::io::stderr().is_terminal()) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(SWEEP_FOUND_STATUS),
                Err(e) => fail(&e.to_string(), e.status()),
            }
        }
        Command::Leaks(leaks_args) => match leak_args::write_baseline(&leaks_args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => fail(&message, REPORT_FAILED_STATUS),
        },
        Command::Report(report_args) => {
            match report_cmd::report(&report_args, colour(std::io::stdout().is_terminal())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e.to_string(), REPORT_FAILED_STATUS),
            }
        }
    }
}

/// Nothing is left to do with `value` but free it, and the process is about to exit
/// (`run` and `report` end so): the kernel takes its memory back at once, where freeing it
/// would walk every allocation and unmap each debug file. On the imports workload that was
/// 45 ms after the report was written (the symbolizer's debug information 20 ms, the
/// loaded profile and the report 12 ms each); on the NumPy one, 15 ms.
pub(crate) fn leave_to_exit<T>(value: T) {
    std::mem::forget(value);
}

/// The lowest priority (highest nice value) on Linux.
const LOWEST_PRIORITY: libc::c_int = 19;

/// Sets the calling thread's nice value to the lowest priority, for work that should only
/// take CPU time the target leaves idle. On Linux the nice value is per thread, so the
/// rest of the CLI keeps its own. Failure leaves it as it was.
pub(crate) fn lower_own_priority() {
    // SAFETY: gettid has no preconditions; setpriority on our own thread id only changes
    // this thread's scheduling priority, and its failure is harmless.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, LOWEST_PRIORITY);
    }
}

/// Bold headings only on a terminal, and never when `NO_COLOR` is set.
fn colour(terminal: bool) -> bool {
    terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// A file-system error in a few words, for one-line messages.
fn io_reason(error: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::NotFound => "no such file".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        ErrorKind::NotADirectory => "a file is in the way (not a folder)".into(),
        ErrorKind::AlreadyExists => "exists and is not a folder".into(),
        ErrorKind::ReadOnlyFilesystem => "read-only file system".into(),
        _ => error.to_string(),
    }
}

fn fail(message: &str, status: u8) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "memwarden: error: {message}");
    ExitCode::from(status)
}
