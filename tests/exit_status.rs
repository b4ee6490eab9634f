//! How the run ends: `memwarden run` exits with the target's status (128+signal when it
//! was killed), the profile of a process that dies by SIGKILL or a crash survives, and a
//! child killed by a signal and reaped by its parent shows that signal.

mod common;
use common::*;

/// GIVEN a program that allocates in doomed_alloc(), then ends as argv[1] says: "exit3",
/// "term" (raise SIGTERM), "kill" (SIGKILL on itself).
const ENDINGS: &str = r#"
#include <signal.h>
NOINLINE void doomed_alloc(void) { keep(malloc(6 * MiB + 9)); }
NOINLINE void freed_alloc(void) { void *p = malloc(1 * MiB); keep(p); free(p); }
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    freed_alloc();
    doomed_alloc();
    say("about to end\n");
    if (strcmp(argv[1], "exit3") == 0) exit(3);
    if (strcmp(argv[1], "term") == 0) raise(SIGTERM);
    if (strcmp(argv[1], "kill") == 0) kill(getpid(), SIGKILL);
    say("still alive\n");
    return 1;
}
"#;

fn ending(test: &str, how: &str) -> (Scratch, Profiled) {
    let scratch = Scratch::new(test);
    let prog = scratch.compile("endings", ENDINGS);
    let run = profile(&scratch, &[prog.arg(), how]);
    assert_eq!(
        run.outcome.stdout_text(),
        "about to end\n",
        "the target ran to its end"
    );
    (scratch, run)
}

#[test]
fn exit_code_is_passed_through() {
    let (_scratch, run) = ending("exit_code", "exit3");

    assert_eq!(
        run.outcome.code(),
        3,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    let p = run.report.only_process();
    assert_eq!(p.exit, Some(Exit::code(3)), "{}", p.describe());
    assert_eq!(p.live("doomed_alloc"), 6 * MIB + 9);
}

#[test]
fn death_by_sigterm_exits_143() {
    let (_scratch, run) = ending("exit_sigterm", "term");

    assert_eq!(
        run.outcome.code(),
        128 + 15,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    let p = run.report.only_process();
    assert_eq!(p.exit, Some(Exit::signal(15)), "{}", p.describe());
    assert_eq!(p.at_peak("doomed_alloc"), 6 * MIB + 9, "{}", p.describe());
}

#[test]
fn death_by_sigkill_exits_137_and_keeps_the_profile() {
    let (_scratch, run) = ending("exit_sigkill", "kill");

    assert_eq!(
        run.outcome.code(),
        128 + 9,
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
    let p = run.report.only_process();
    assert_eq!(p.exit, Some(Exit::signal(9)), "{}", p.describe());
    assert_eq!(p.at_peak("doomed_alloc"), 6 * MIB + 9, "{}", p.describe());
    assert_eq!(p.live("doomed_alloc"), 6 * MIB + 9, "{}", p.describe());
    assert_eq!(p.at_peak("freed_alloc"), 0, "{}", p.describe());
    assert_eq!(p.allocated("freed_alloc"), MIB);
    p.assert_peak_near(6 * MIB + 9);
}

/// GIVEN a parent whose forked child allocates in child_before_crash() then dereferences
/// NULL; the parent checks that the child died of SIGSEGV and exits 0.
const CRASHING_CHILD: &str = r#"
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
NOINLINE void child_before_crash(void) { keep(malloc(3 * MiB + 5)); }
NOINLINE void crash(void) { *(volatile int *)mwt_sink = 1; }
int main(void) {
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        child_before_crash();
        mwt_sink = NULL;
        crash();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSEGV) return 1;
    say("child segfaulted\n");
    return 0;
}
"#;

#[test]
fn a_segfaulting_child_keeps_its_profile() {
    let scratch = Scratch::new("segv_child");
    let prog = scratch.compile("segv_child", CRASHING_CHILD);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    assert_eq!(run.outcome.stdout_text(), "child segfaulted\n");
    let r = &run.report;
    assert_eq!(r.processes.len(), 2, "{}", r.describe());
    let child = r
        .processes
        .iter()
        .find(|p| p.forked)
        .expect("the forked child");
    assert_eq!(
        child.at_peak("child_before_crash"),
        3 * MIB + 5,
        "{}",
        child.describe()
    );
    assert_eq!(
        child.live("child_before_crash"),
        3 * MIB + 5,
        "{}",
        child.describe()
    );
    // The parent reaped the child: its waitpid wrote the signal into the child's profile.
    assert_eq!(child.exit, Some(Exit::signal(11)), "{}", child.describe());
}

/// GIVEN a parent whose forked child allocates in child_alloc(), then waits; the parent
/// ends it with SIGTERM and reaps it with the call argv[1] names: "waitpid", "wait" (with a
/// null status) or "waitid".
const TERMINATED_CHILD: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
NOINLINE void child_alloc(void) { keep(malloc(2 * MiB + 3)); }
int main(int argc, char **argv) {
    int ready[2];
    if (argc < 2 || pipe(ready) != 0) return 2;
    pid_t pid = fork();
    if (pid == 0) {
        child_alloc();
        if (write(ready[1], "r", 1) != 1) _exit(3);
        for (;;) pause();
    }
    char byte;
    if (read(ready[0], &byte, 1) != 1) return 4;
    kill(pid, SIGTERM);
    if (strcmp(argv[1], "waitpid") == 0) {
        int status = 0;
        if (waitpid(pid, &status, 0) != pid || WTERMSIG(status) != SIGTERM) return 5;
    } else if (strcmp(argv[1], "wait") == 0) {
        if (wait(NULL) != pid) return 6;
    } else {
        siginfo_t info;
        if (waitid(P_PID, pid, &info, WEXITED) != 0 || info.si_status != SIGTERM) return 7;
    }
    printf("reaped with %s\n", argv[1]);
    return 0;
}
"#;

#[test]
fn a_child_its_parent_kills_and_reaps_shows_the_signal() {
    let scratch = Scratch::new("terminated_child");
    let prog = scratch.compile("terminated_child", TERMINATED_CHILD);
    for call in ["waitpid", "wait", "waitid"] {
        let run = profile(&scratch, &[prog.arg(), call]);

        assert_success(&run.outcome, call);
        assert_eq!(run.outcome.stdout_text(), format!("reaped with {call}\n"));
        let r = &run.report;
        let child = r.processes.iter().find(|p| p.forked).expect("the child");
        assert_eq!(
            child.exit,
            Some(Exit::signal(15)),
            "{call}: {}",
            child.describe()
        );
        assert_eq!(
            child.live("child_alloc"),
            2 * MIB + 3,
            "{}",
            child.describe()
        );
    }
}

/// GIVEN a parent that reaps its children in a SIGCHLD handler (`waitpid(-1, WNOHANG)`, the
/// classic pattern) while its main loop allocates and frees: each of 20 children says it is
/// ready, then the parent ends it with SIGTERM.
const REAPED_IN_A_HANDLER: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#define CHILDREN 20
static volatile sig_atomic_t reaped;
static void on_child(int signal) {
    (void)signal;
    int status;
    while (waitpid(-1, &status, WNOHANG) > 0)
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) reaped++;
}
NOINLINE void child_alloc(void) { keep(malloc(1 * MiB + 1)); }
int main(void) {
    signal(SIGCHLD, on_child);
    for (int i = 0; i < CHILDREN; i++) {
        int ready[2];
        if (pipe(ready) != 0) return 2;
        pid_t pid = fork();
        if (pid == 0) {
            child_alloc();
            if (write(ready[1], "r", 1) != 1) _exit(3);
            for (;;) pause();
        }
        char byte;
        while (read(ready[0], &byte, 1) != 1) {}
        close(ready[0]);
        close(ready[1]);
        kill(pid, SIGTERM);
        for (int j = 0; j < 2000; j++) free(malloc(64 + j % 512));
    }
    while (reaped < CHILDREN) {
        free(malloc(100));
        usleep(1000);
    }
    printf("reaped %d\n", (int)reaped);
    return 0;
}
"#;

#[test]
fn children_reaped_in_a_sigchld_handler_show_their_signal() {
    let scratch = Scratch::new("reaped_in_handler");
    let prog = scratch.compile("reaped_in_handler", REAPED_IN_A_HANDLER);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    assert_eq!(run.outcome.stdout_text(), "reaped 20\n");
    let children: Vec<_> = run.report.processes.iter().filter(|p| p.forked).collect();
    assert_eq!(children.len(), 20, "{}", run.report.describe());
    for child in children {
        assert_eq!(child.exit, Some(Exit::signal(15)), "{}", child.describe());
        assert_eq!(child.live("child_alloc"), MIB + 1, "{}", child.describe());
    }
}
