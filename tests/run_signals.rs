//! Stopping a run with a signal: SIGTERM sent to `memwarden run` alone reaches the command,
//! and SIGTERM from `timeout` (to memwarden, then its whole group) reaches it once; either way
//! memwarden outlives the command and writes the report. A run that leaves no report does
//! not leave the previous run's report files behind either, and its run.json names the
//! command's process.

mod common;
use common::*;

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// GIVEN a program that holds 3 MiB + 7 bytes from held_alloc(), says "ready", then waits
/// for signals. With "count" it catches SIGTERM, waits 300 ms for any second one, prints
/// how many it got and exits 0; with "exit" it exits at once; otherwise SIGTERM kills it.
const WAITER: &str = r#"
#include <signal.h>
#include <stdio.h>
static volatile sig_atomic_t terms;
static void on_term(int signal) { (void)signal; terms++; }
NOINLINE void held_alloc(void) { keep(malloc(3 * MiB + 7)); }
int main(int argc, char **argv) {
    held_alloc();
    const char *how = argc > 1 ? argv[1] : "";
    if (strcmp(how, "count") == 0) signal(SIGTERM, on_term);
    say("ready\n");
    if (strcmp(how, "exit") == 0) return 0;
    while (!terms) pause();
    usleep(300000);
    printf("terms: %d\n", (int)terms);
    return 0;
}
"#;

/// `argv` started with its output into files of `scratch` and in a process group of its own.
fn start(scratch: &Scratch, argv: &[&str]) -> Child {
    let mut command = Command::new(argv[0]);
    command
        .args(&argv[1..])
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .stdout(File::create(scratch.path().join("started.stdout")).unwrap())
        .stderr(File::create(scratch.path().join("started.stderr")).unwrap())
        .process_group(0);
    command.spawn().unwrap()
}

/// `memwarden run -o DIR -- PROGRAM` started as [`start`] does, once the program is ready.
fn start_run(scratch: &Scratch, dir: &Path, program: &str) -> Child {
    let memwarden = memwarden();
    let argv = [
        memwarden.to_str().unwrap(),
        "run",
        "-o",
        dir.to_str().unwrap(),
        "--",
        program,
    ];
    let run = start(scratch, &argv);
    wait_for_stdout(scratch, "ready");
    run
}

/// Waits until the started command has written `line` on its stdout.
fn wait_for_stdout(scratch: &Scratch, line: &str) {
    let started = Instant::now();
    let path = scratch.path().join("started.stdout");
    while !fs::read_to_string(&path).unwrap_or_default().contains(line) {
        assert!(
            started.elapsed() < WATCHDOG,
            "the command never said {line:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` (killing its group after the watchdog); its outcome.
fn finish(scratch: &Scratch, mut child: Child) -> Outcome {
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > WATCHDOG {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            panic!("the run did not end after its signal (hang?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        status,
        stdout: fs::read(scratch.path().join("started.stdout")).unwrap(),
        stderr: fs::read(scratch.path().join("started.stderr")).unwrap(),
    }
}

fn signal(target: &str, pid: u32) {
    let target = format!("{target}{pid}");
    let status = Command::new("kill")
        .args(["-TERM", "--", &target])
        .status()
        .unwrap();
    assert!(status.success(), "kill -TERM {target}");
}

/// The run left a report in `dir`, where the command ended with `exit` and held
/// held_alloc's block at the peak.
fn assert_reported(dir: &Path, outcome: &Outcome, exit: Exit) {
    let report = Report::load(&dir.join("report.json")).unwrap_or_else(|e| {
        panic!(
            "no report after the signal ({e}); exit {:?}, stderr:\n{}",
            outcome.status,
            outcome.stderr_text()
        )
    });
    let p = report.only_process();
    assert_eq!(p.exit, Some(exit), "{}", p.describe());
    assert_eq!(p.at_peak("held_alloc"), 3 * MIB + 7, "{}", p.describe());
}

#[test]
fn sigterm_to_memwarden_alone_stops_the_command_and_the_report_is_written() {
    let scratch = Scratch::new("sigterm_relayed");
    let prog = scratch.compile("waiter", WAITER);
    let dir = scratch.out_dir();
    let run = start_run(&scratch, &dir, prog.arg());

    // The signal goes to memwarden's pid only: without memwarden passing it on, the
    // command would wait for ever.
    signal("", run.id());
    let outcome = finish(&scratch, run);

    assert_eq!(outcome.code(), 128 + 15, "{}", outcome.stderr_text());
    assert_reported(&dir, &outcome, Exit::signal(15));
}

#[test]
fn sigterm_from_timeout_reaches_the_command_once() {
    let scratch = Scratch::new("sigterm_timeout");
    let prog = scratch.compile("waiter", WAITER);
    let dir = scratch.out_dir();
    let dir_arg = dir.to_str().unwrap();
    let memwarden = memwarden();
    // `timeout` signals memwarden, then its whole process group, the command among them:
    // memwarden must not pass on a signal the command had already. 5 s leave the program
    // time to install its handler on a loaded machine.
    let argv = [
        "timeout",
        "--preserve-status",
        "-s",
        "TERM",
        "5",
        memwarden.to_str().unwrap(),
        "run",
        "-o",
        dir_arg,
        "--",
        prog.arg(),
        "count",
    ];
    let outcome = finish(&scratch, start(&scratch, &argv));

    assert_eq!(outcome.code(), 0, "{}", outcome.stderr_text());
    assert_eq!(outcome.stdout_text(), "ready\nterms: 1\n", "delivered once");
    assert_reported(&dir, &outcome, Exit::code(0));
}

#[test]
fn a_run_without_a_report_leaves_no_earlier_report_behind() {
    let scratch = Scratch::new("stale_report");
    let prog = scratch.compile("waiter", WAITER);
    let first = profile(&scratch, &[prog.arg(), "exit"]);
    assert!(first.dir.join("report.json").exists());

    // The second run into the same folder is killed, memwarden with it: no report.
    let run = start_run(&scratch, &first.dir, prog.arg());
    let group = format!("-{}", run.id());
    let status = Command::new("kill").args(["-KILL", "--", &group]).status();
    assert!(status.unwrap().success());
    let _ = finish(&scratch, run);

    for stale in ["report.json", "peak.svg", "peak.folded", "allocated.svg"] {
        assert!(
            !first.dir.join(stale).exists(),
            "{stale} of the first run is left"
        );
    }
    // run.json says the run did not end, and names its root process.
    let record: serde_json::Value =
        serde_json::from_slice(&fs::read(first.dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["complete"], false, "{record}");
    assert!(
        record["root_pid"].as_u64().is_some_and(|pid| pid > 0),
        "{record}"
    );
    // The profile is there, for `memwarden report`.
    assert!(fs::read_dir(first.dir.join("raw")).unwrap().count() > 0);

    // What a killed run set aside and had no time to delete, the next run deletes.
    let left = first.dir.join(".memwarden-discard-1");
    fs::create_dir(&left).unwrap();
    fs::write(left.join("1-1.mwp"), b"old").unwrap();
    let dir = first.dir.to_str().unwrap();
    let third = memwarden_cmd(&scratch, &["run", "-o", dir, "--", prog.arg(), "exit"]);
    assert_success(&third, "the run after the killed one");
    assert!(first.dir.join("report.json").exists());
    let hidden: Vec<String> = fs::read_dir(&first.dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".memwarden-discard-"))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?} left in the output folder");
}
