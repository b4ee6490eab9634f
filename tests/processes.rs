//! Every process the command starts is profiled: a forked child gets its own section with
//! its parent's pid, an exec'd image gets its own section with its argv, and so do programs
//! started through `/bin/sh -c` and `posix_spawn`.

mod common;
use common::*;

/// GIVEN a parent holding a block in parent_alloc() that forks a child; the child allocates
/// in child_alloc() and exits; the parent waits, allocates in parent_after() and frees all.
const FORK: &str = r#"
#include <sys/wait.h>
void *parent_block;
NOINLINE void parent_alloc(void) { parent_block = malloc(5 * MiB + 1); }
NOINLINE void *child_alloc(void) { return malloc(3 * MiB + 7); }
NOINLINE void parent_after(void) { void *p = malloc(1 * MiB + 5); keep(p); free(p); }
int main(void) {
    parent_alloc();
    pid_t pid = fork();
    if (pid == 0) {
        void *p = child_alloc();
        say("child holds its block\n");
        free(p);
        exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    parent_after();
    free(parent_block);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
"#;

#[test]
fn fork_gives_the_child_its_own_section_with_exact_peaks() {
    let scratch = Scratch::new("fork");
    let prog = scratch.compile("fork", FORK);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let r = &run.report;
    assert_eq!(r.processes.len(), 2, "{}", r.describe());
    let parent = r
        .processes
        .iter()
        .find(|p| !p.forked)
        .expect("a process not forked");
    let child = r
        .processes
        .iter()
        .find(|p| p.forked)
        .expect("a forked process");
    assert_eq!(child.ppid, parent.pid, "{}", r.describe());
    assert_ne!(child.pid, parent.pid);
    assert_eq!(
        child.argv, parent.argv,
        "fork does not change the command line"
    );
    assert_eq!(parent.exit, Some(Exit::code(0)));
    assert_eq!(child.exit, Some(Exit::code(0)));
    // THEN the parent's peak is its own two blocks; the child's allocation is not in it.
    assert_eq!(
        parent.at_peak("parent_alloc"),
        5 * MIB + 1,
        "{}",
        parent.describe()
    );
    assert_eq!(parent.at_peak("child_alloc"), 0, "{}", parent.describe());
    assert_eq!(
        parent.at_peak("parent_after"),
        MIB + 5,
        "{}",
        parent.describe()
    );
    parent.assert_peak_near(6 * MIB + 6);
    assert_eq!(parent.allocated("parent_after"), MIB + 5);
    assert_eq!(parent.allocated("child_alloc"), 0, "{}", parent.describe());
    // AND the child started with the parent's live heap, so its peak holds both blocks.
    assert_eq!(
        child.at_peak("child_alloc"),
        3 * MIB + 7,
        "{}",
        child.describe()
    );
    assert_eq!(
        child.at_peak("parent_alloc"),
        5 * MIB + 1,
        "inherited\n{}",
        child.describe()
    );
    assert_eq!(
        child.live("parent_alloc"),
        5 * MIB + 1,
        "the child never freed it"
    );
    assert_eq!(child.live("child_alloc"), 0);
    assert_eq!(child.allocated("parent_after"), 0, "{}", child.describe());
    child.assert_peak_near(8 * MIB + 8);
}

/// The image that gets exec'd: allocates in after_exec() and exits 0.
const EXEC_TARGET: &str = r#"
NOINLINE void *after_exec(void) { return malloc(1 * MiB + 5); }
int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    void *p = after_exec();
    say("exec'd image holds its block\n");
    free(p);
    return 0;
}
"#;

/// GIVEN a program that holds a block in before_exec() and execs EXEC_TARGET (path in
/// argv[1]) with arguments "alpha" "beta".
const EXEC: &str = r#"
NOINLINE void before_exec(void) { keep(malloc(2 * MiB + 1)); }
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    before_exec();
    char *args[] = {argv[1], "alpha", "beta", NULL};
    execv(argv[1], args);
    say("execv failed\n");
    return 1;
}
"#;

#[test]
fn exec_gives_each_image_its_own_section_with_its_argv() {
    let scratch = Scratch::new("exec");
    let target = scratch.compile("exec_target", EXEC_TARGET);
    let prog = scratch.compile("exec", EXEC);

    let run = profile(&scratch, &[prog.arg(), target.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let r = &run.report;
    assert_eq!(r.command, [prog.arg(), target.arg()]);
    assert_eq!(r.processes.len(), 2, "{}", r.describe());
    let first = r.process_of(prog.name());
    let second = r.process_of(target.name());
    assert_eq!(first.argv, [prog.arg(), target.arg()]);
    assert_eq!(second.argv, [target.arg(), "alpha", "beta"]);
    assert_eq!(first.pid, second.pid, "exec keeps the pid");
    assert_eq!(first.ppid, second.ppid);
    assert!(first.replaced_by_exec, "{}", first.describe());
    assert!(!second.replaced_by_exec, "{}", second.describe());
    assert!(!second.forked);
    assert_eq!(second.exit, Some(Exit::code(0)));
    assert_eq!(
        first.at_peak("before_exec"),
        2 * MIB + 1,
        "{}",
        first.describe()
    );
    assert_eq!(
        first.live("before_exec"),
        2 * MIB + 1,
        "live when the image was replaced"
    );
    first.assert_peak_near(2 * MIB + 1);
    assert_eq!(
        second.at_peak("after_exec"),
        MIB + 5,
        "{}",
        second.describe()
    );
    assert_eq!(
        second.at_peak("before_exec"),
        0,
        "exec discards the old heap\n{}",
        second.describe()
    );
    second.assert_peak_near(MIB + 5);
}

#[test]
fn programs_started_by_a_shell_are_each_profiled() {
    let scratch = Scratch::new("shell");
    let target = scratch.compile("shell_target", EXEC_TARGET);
    let script = format!("{0} one; {0} two", target.arg());

    let run = profile(&scratch, &["/bin/sh", "-c", &script]);

    assert_success(&run.outcome, "memwarden run");
    let r = &run.report;
    assert_eq!(r.command, ["/bin/sh", "-c", script.as_str()]);
    assert!(
        r.processes
            .iter()
            .any(|p| p.argv == ["/bin/sh", "-c", script.as_str()]),
        "the shell has a section\n{}",
        r.describe()
    );
    let runs = r.processes_of(target.name());
    assert_eq!(runs.len(), 2, "{}", r.describe());
    for arg in ["one", "two"] {
        let p = runs
            .iter()
            .find(|p| p.argv == [target.arg(), arg])
            .unwrap_or_else(|| {
                panic!(
                    "no section with argv [{}, {arg}]\n{}",
                    target.arg(),
                    r.describe()
                )
            });
        assert_eq!(p.at_peak("after_exec"), MIB + 5, "{}", p.describe());
        assert_eq!(p.exit, Some(Exit::code(0)));
        p.assert_peak_near(MIB + 5);
    }
}

/// GIVEN a parent that allocates, starts EXEC_TARGET with posix_spawn (clone + exec, where
/// no fork handler runs) and with vfork + execv, then allocates again.
const SPAWN: &str = r#"
#include <spawn.h>
#include <sys/wait.h>
extern char **environ;
NOINLINE void *spawner_alloc(size_t n) { return malloc(n); }
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *before = spawner_alloc(2 * MiB + 7);
    pid_t pid;
    char *args[] = {argv[1], "spawned", NULL};
    if (posix_spawn(&pid, argv[1], NULL, NULL, args, environ) != 0) return 3;
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 4;
    char *vargs[] = {argv[1], "vforked", NULL};
    pid = vfork();
    if (pid == 0) {
        execv(argv[1], vargs);
        _exit(127);
    }
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 5;
    void *after = spawner_alloc(1 * MiB + 3);
    free(after);
    free(before);
    return 0;
}
"#;

#[test]
fn posix_spawn_and_vfork_children_are_profiled_and_the_parent_stays_exact() {
    let scratch = Scratch::new("spawn");
    let target = scratch.compile("spawn_target", EXEC_TARGET);
    let prog = scratch.compile("spawn", SPAWN);

    let run = profile(&scratch, &[prog.arg(), target.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let r = &run.report;
    let parent = r.process_of(prog.name());
    assert_eq!(parent.exit, Some(Exit::code(0)));
    assert_eq!(
        parent.at_peak("spawner_alloc"),
        3 * MIB + 10,
        "both blocks are live after the children ran\n{}",
        parent.describe()
    );
    assert_eq!(
        parent.allocated("spawner_alloc"),
        3 * MIB + 10,
        "{}",
        parent.describe()
    );
    assert_eq!(parent.live("spawner_alloc"), 0);
    assert_eq!(
        parent.allocated("after_exec"),
        0,
        "the child's allocations are not the parent's"
    );
    for arg in ["spawned", "vforked"] {
        let child = r
            .processes
            .iter()
            .find(|p| p.argv == [target.arg(), arg])
            .unwrap_or_else(|| panic!("no section for the {arg} child\n{}", r.describe()));
        assert_eq!(child.ppid, parent.pid, "{}", r.describe());
        assert_eq!(child.at_peak("after_exec"), MIB + 5, "{}", child.describe());
        assert_eq!(
            child.at_peak("spawner_alloc"),
            0,
            "exec discards the parent's heap"
        );
        assert_eq!(child.exit, Some(Exit::code(0)));
    }
}

/// GIVEN a target that starts a grandchild in the background (fork, fork, the middle
/// process exits) and exits 0 at once. The grandchild blocks on a pipe until the target
/// has exited (EOF), then allocates in orphan_alloc() and exits 7.
const ORPHAN: &str = r#"
#include <sys/wait.h>
NOINLINE void orphan_alloc(void) { keep(malloc(4 * MiB + 3)); }
int main(void) {
    int fds[2];
    if (pipe(fds) != 0) return 2;
    pid_t middle = fork();
    if (middle == 0) {
        if (fork() == 0) {
            char c;
            close(fds[1]);
            while (read(fds[0], &c, 1) > 0) {}
            orphan_alloc();
            _exit(7);
        }
        _exit(0);
    }
    close(fds[0]);
    waitpid(middle, NULL, 0);
    say("target exits, its grandchild still runs\n");
    return 0;
}
"#;

#[test]
fn a_background_process_that_outlives_the_target_is_waited_for() {
    let scratch = Scratch::new("orphan");
    let prog = scratch.compile("orphan", ORPHAN);

    let run = profile(&scratch, &[prog.arg()]);

    assert_eq!(
        run.outcome.code(),
        0,
        "the target's status, not the grandchild's"
    );
    let r = &run.report;
    assert_eq!(r.processes.len(), 3, "{}", r.describe());
    let orphan = r
        .processes
        .iter()
        .find(|p| p.allocated("orphan_alloc") > 0)
        .unwrap_or_else(|| panic!("no process allocated in orphan_alloc\n{}", r.describe()));
    assert!(orphan.forked);
    assert_eq!(orphan.exit, Some(Exit::code(7)), "{}", orphan.describe());
    assert_eq!(
        orphan.live("orphan_alloc"),
        4 * MIB + 3,
        "{}",
        orphan.describe()
    );
    assert_eq!(
        orphan.at_peak("orphan_alloc"),
        4 * MIB + 3,
        "{}",
        orphan.describe()
    );
}

#[test]
fn a_command_found_on_path_and_a_shebang_script_are_profiled() {
    let scratch = Scratch::new("path_and_script");
    let target = scratch.compile("path_target", EXEC_TARGET);
    let script = scratch.write(
        "start.sh",
        format!("#!/bin/sh\nexec {} from-script\n", target.arg()),
    );
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let path = format!("{}:/usr/bin:/bin", scratch.path().display());
    let env = [("PATH", path.as_str())];

    let by_name = profile_with(
        &scratch,
        &[target.name(), "from-path"],
        &RunOptions {
            env: &env,
            ..Default::default()
        },
    );
    let by_script = profile(&scratch, &[script.to_str().expect("utf-8")]);

    assert_success(&by_name.outcome, "memwarden run -- <name on PATH>");
    let p = by_name.report.only_process();
    assert_eq!(p.argv, [target.name(), "from-path"]);
    assert_eq!(p.at_peak("after_exec"), MIB + 5, "{}", p.describe());
    assert_success(&by_script.outcome, "memwarden run -- <shebang script>");
    let r = &by_script.report;
    let p = r
        .processes
        .iter()
        .find(|p| p.argv == [target.arg(), "from-script"])
        .unwrap_or_else(|| {
            panic!(
                "the script's exec'd program has a section\n{}",
                r.describe()
            )
        });
    assert_eq!(p.at_peak("after_exec"), MIB + 5, "{}", p.describe());
}
