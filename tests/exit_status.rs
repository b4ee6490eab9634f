//! How the run ends: `memwarden run` exits with the target's status (128+signal when it
//! was killed), and the profile of a process that dies by SIGKILL or a crash survives.

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
    // The parent reaped the child, so the report may not know the signal; it must not
    // claim a normal exit.
    assert!(
        matches!(
            child.exit,
            None | Some(Exit {
                code: None,
                signal: Some(11)
            })
        ),
        "a segfaulted child's exit is {{\"signal\": 11}} or unknown, not {:?}",
        child.exit
    );
}
