//! The profiler is invisible to the target: its stdout comes out byte for byte, its
//! stderr comes before the summary, stdin reaches it, and a user's own LD_PRELOAD still
//! works (libmemwarden.so is prepended to it, not put in its place).

mod common;
use common::*;

/// GIVEN a program writing known bytes (with a NUL and no final newline) to stdout and a
/// known line to stderr, around an allocation.
const OUTPUT: &str = r#"
NOINLINE void output_alloc(void) { keep(malloc(123456)); }
int main(void) {
    static const char out[] = "line one\n\0\xff binary\nno final newline";
    ssize_t r = write(1, out, sizeof out - 1);
    r = write(2, "target stderr line\n", 19);
    output_alloc();
    r = write(1, "\nafter\n", 7);
    (void)r;
    return 0;
}
"#;

#[test]
fn target_stdout_is_exactly_its_own_and_its_stderr_comes_first() {
    let scratch = Scratch::new("output");
    let prog = scratch.compile("output", OUTPUT);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    assert_eq!(
        run.outcome.stdout,
        b"line one\n\0\xff binary\nno final newline\nafter\n".to_vec()
    );
    let target_err = b"target stderr line\n";
    assert!(
        run.outcome.stderr.starts_with(target_err),
        "stderr should start with the target's own stderr, got:\n{}",
        run.outcome.stderr_text()
    );
    assert!(
        run.outcome.stderr.len() > target_err.len(),
        "memwarden prints a summary after the target's stderr"
    );
    assert_eq!(run.report.only_process().live("output_alloc"), 123456);
}

/// GIVEN a program that copies its stdin to its stdout.
const CAT: &str = r#"
int main(void) {
    char buf[4096];
    ssize_t n;
    while ((n = read(0, buf, sizeof buf)) > 0)
        if (write(1, buf, (size_t)n) != n) return 1;
    return n < 0;
}
"#;

#[test]
fn stdin_reaches_the_target() {
    let scratch = Scratch::new("stdin");
    let prog = scratch.compile("cat", CAT);
    let input: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let stdin = scratch.write("input.bin", &input);

    let run = profile_with(
        &scratch,
        &[prog.arg()],
        &RunOptions {
            stdin: Some(&stdin),
            ..Default::default()
        },
    );

    assert_success(&run.outcome, "memwarden run");
    assert!(
        run.outcome.stdout == input,
        "stdout differs from stdin ({} bytes)",
        run.outcome.stdout.len()
    );
}

/// A library of the user's own, preloaded: its constructor says in which program it runs.
const MARKER_LIB: &str = r#"
__attribute__((constructor)) static void marker(void) {
    const char *name = program_invocation_short_name;
    ssize_t r = write(2, "marker-loaded-in:", 17);
    r = write(2, name, strlen(name));
    r = write(2, "\n", 1);
    (void)r;
}
"#;

/// GIVEN a program that prints its LD_PRELOAD and allocates.
const SHOW_PRELOAD: &str = r#"
NOINLINE void preload_alloc(void) { keep(malloc(4321000)); }
int main(void) {
    const char *v = getenv("LD_PRELOAD");
    say(v ? v : "(unset)");
    say("\n");
    preload_alloc();
    return 0;
}
"#;

#[test]
fn libmemwarden_is_prepended_to_an_existing_ld_preload() {
    let scratch = Scratch::new("ld_preload");
    let marker = scratch.compile_with("marker.so", MARKER_LIB, &["-shared", "-fPIC"]);
    let prog = scratch.compile("show_preload", SHOW_PRELOAD);
    let env = [("LD_PRELOAD", marker.arg())];

    let run = profile_with(
        &scratch,
        &[prog.arg()],
        &RunOptions {
            env: &env,
            ..Default::default()
        },
    );

    assert_success(&run.outcome, "memwarden run");
    let stderr = run.outcome.stderr_text();
    assert!(
        stderr.contains(&format!("marker-loaded-in:{}\n", prog.name())),
        "the user's preload must still load in the target; stderr:\n{stderr}"
    );
    let seen = run.outcome.stdout_text();
    let entries: Vec<&str> = seen
        .trim_end()
        .split([':', ' '])
        .filter(|e| !e.is_empty())
        .collect();
    assert!(
        entries
            .first()
            .is_some_and(|e| e.ends_with("/libmemwarden.so")),
        "libmemwarden.so comes first in the target's LD_PRELOAD, got {seen:?}"
    );
    assert!(
        entries.contains(&marker.arg()),
        "the user's entry is kept, got {seen:?}"
    );
    let p = run.report.only_process();
    assert_eq!(p.live("preload_alloc"), 4321000, "{}", p.describe());
}

/// Allocates 48 bytes from a stack `depth` frames deep: a thousand depths make enough
/// distinct stacks for the profile to need more disk blocks.
const CHURN_BLOCK: &str = r#"
NOINLINE void *churn_block(int depth) {
    if (depth == 0) return malloc(48);
    void *p = churn_block(depth - 1);
    keep(p);
    return p;
}
"#;

/// GIVEN a program that closes every descriptor above stderr (as daemons and test runners
/// do), opens a file of its own (which gets the lowest free number, the profile's old one)
/// and writes 5 bytes to it, then allocates from a thousand distinct stacks (enough for the
/// profile to need more disk blocks) and holds 77,777 bytes from `after_close_block`.
const CLOSES_DESCRIPTORS: &str = r#"
#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <stdio.h>
NOINLINE void *after_close_block(void) { return malloc(77777); }
int main(int argc, char **argv) {
    (void)argc;
    if (syscall(SYS_close_range, 3, ~0U, 0) != 0) return 3;
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "hello", 5) != 5) return 4;
    for (int depth = 0; depth < 1000; depth++) free(churn_block(depth));
    void *held = after_close_block();
    struct stat st;
    if (fstat(fd, &st) != 0) return 5;
    char line[64];
    snprintf(line, sizeof line, "fd %d, size %lld\n", fd, (long long)st.st_size);
    say(line);
    close(fd);
    free(held);
    return 0;
}
"#;

#[test]
fn a_program_that_closes_the_profiles_descriptor_is_tracked_and_its_files_kept_intact() {
    let scratch = Scratch::new("closes_descriptors");
    let prog = scratch.compile(
        "closes_descriptors",
        &format!("{CHURN_BLOCK}{CLOSES_DESCRIPTORS}"),
    );
    let own_file = scratch.path().join("own.txt");
    let own = own_file.to_str().expect("UTF-8 path");

    let run = profile(&scratch, &[prog.arg(), own]);

    assert_success(&run.outcome, "memwarden run");
    // The program's file keeps exactly what it wrote: the profile's blocks went elsewhere.
    assert_eq!(run.outcome.stdout_text(), "fd 3, size 5\n");
    assert_eq!(
        std::fs::read(&own_file).expect("the program's file"),
        b"hello"
    );
    let stderr = run.outcome.stderr_text();
    assert!(!stderr.contains("stopped tracking"), "{stderr}");
    let p = run.report.only_process();
    assert_eq!(p.at_peak("after_close_block"), 77777, "{}", p.describe());
    assert_eq!(p.allocations("churn_block"), 1000, "{}", p.describe());
}

/// GIVEN a program that lists its open descriptors, closes its stdin and executes itself
/// with that list; the new image allocates from a thousand distinct stacks (enough for
/// the profile to need more disk blocks), holds 55,555 bytes from `fd_check_block`, and
/// says whether it has the same descriptors as before, less stdin (as `posix_spawn` with a
/// close action, or a daemon, starts a program).
const KEEPS_DESCRIPTORS: &str = r#"
#include <fcntl.h>
#include <stdio.h>
NOINLINE void *fd_check_block(void) { return malloc(55555); }
static void list_open(char *out, size_t size, int skip) {
    out[0] = 0;
    for (int fd = 0; fd < 4096; fd++) {
        if (fd == skip || fcntl(fd, F_GETFD) == -1) continue;
        size_t used = strlen(out);
        snprintf(out + used, size - used, "%d,", fd);
    }
}
int main(int argc, char **argv) {
    static char before[8192], after[8192];
    if (argc == 1) {
        list_open(before, sizeof before, 0);
        close(0);
        execl("/proc/self/exe", argv[0], before, (char *)0);
        return 9;
    }
    for (int depth = 0; depth < 1000; depth++) free(churn_block(depth));
    void *held = fd_check_block();
    list_open(after, sizeof after, -1);
    if (strcmp(after, argv[1]) == 0) {
        say("same descriptors\n");
    } else {
        say("other descriptors: "); say(after); say(" before: "); say(argv[1]); say("\n");
    }
    free(held);
    return 0;
}
"#;

#[test]
fn the_profile_takes_no_descriptor_of_the_program_not_even_a_closed_stdin() {
    let scratch = Scratch::new("keeps_descriptors");
    let prog = scratch.compile(
        "keeps_descriptors",
        &format!("{CHURN_BLOCK}{KEEPS_DESCRIPTORS}"),
    );

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    assert_eq!(run.outcome.stdout_text(), "same descriptors\n");
    let stderr = run.outcome.stderr_text();
    assert!(!stderr.contains("stopped tracking"), "{stderr}");
    let after_exec = run
        .report
        .processes
        .iter()
        .find(|p| p.allocations("churn_block") > 0)
        .expect("the image after exec is profiled");
    assert_eq!(after_exec.allocations("churn_block"), 1000);
    assert_eq!(after_exec.at_peak("fd_check_block"), 55555);
}
