//! Programs that run within tight limits, which must run under the preload as they do
//! without it:
//! - on small stacks: a thread made with the smallest stack glibc allows and a coroutine on
//!   an 8 KiB stack of its own. Capturing a stack needs more room than either has left, so
//!   the preload does that work on a stack of its own (on theirs it crashed the program);
//! - in a small address space (`ulimit -v`): the profile file is sparse, but its mapping
//!   counts in full against `RLIMIT_AS`, so the preload maps it with smaller capacities,
//!   says so, and profiles the process all the same;
//! - with memwarden itself under the address-space limit, which its report must fit in;
//! - out of address space altogether, by a limit the program sets itself: memwarden's own
//!   next allocation is refused too, so tracking stops, says why, and the program runs on.

mod common;
use common::*;

/// Compiles `source` as `mwt_<name>` and checks that it runs without memwarden: a failure
/// under the profiler must be the profiler's.
fn compiled_and_run_bare(scratch: &Scratch, name: &str, source: &str) -> Program {
    let program = scratch.compile(name, source);
    let bare = run_bare(scratch, &[program.arg()], None);
    assert_eq!(
        bare.code(),
        0,
        "the program itself must run: {}",
        bare.stderr_text()
    );
    program
}

/// GIVEN a thread with a `PTHREAD_STACK_MIN` stack whose function, a few kilobytes of
/// frames deep, allocates 3 KiB + 7 bytes, and a coroutine on an 8 KiB stack that allocates
/// 5 KiB + 3 bytes; both blocks are held together, then freed.
const SMALL_STACKS: &str = r#"
#include <limits.h>
#include <pthread.h>
#include <ucontext.h>
static void *held[2];
NOINLINE void *thread_block(void) { return malloc(3 * KiB + 7); }
NOINLINE void *coroutine_block(void) { return malloc(5 * KiB + 3); }
/* Uses about 2 KiB of the thread's stack per level before allocating. */
NOINLINE static int deep(int levels) {
    volatile char pad[2000];
    pad[levels] = (char)levels;
    if (levels == 0) {
        held[0] = thread_block();
        return pad[0];
    }
    return deep(levels - 1) + pad[levels];
}
NOINLINE static void *small_thread(void *arg) {
    deep(3);
    return arg;
}
static ucontext_t main_context, coroutine_context;
NOINLINE static void coroutine(void) { held[1] = coroutine_block(); }
int main(void) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (pthread_attr_setstacksize(&attr, PTHREAD_STACK_MIN) != 0) return 3;
    pthread_t thread;
    if (pthread_create(&thread, &attr, small_thread, NULL) != 0) return 4;
    pthread_join(thread, NULL);
    static char coroutine_stack[8 * 1024] __attribute__((aligned(16)));
    getcontext(&coroutine_context);
    coroutine_context.uc_stack.ss_sp = coroutine_stack;
    coroutine_context.uc_stack.ss_size = sizeof coroutine_stack;
    coroutine_context.uc_link = &main_context;
    makecontext(&coroutine_context, coroutine, 0);
    swapcontext(&main_context, &coroutine_context);
    say("both blocks made\n");
    free(held[0]);
    free(held[1]);
    return 0;
}
"#;

#[test]
fn a_smallest_thread_stack_and_a_coroutine_stack_are_profiled_without_a_crash() {
    let scratch = Scratch::new("small_stacks");
    let program = compiled_and_run_bare(&scratch, "small_stacks", SMALL_STACKS);

    let run = profile(&scratch, &[program.arg()]);

    assert_success(&run.outcome, "memwarden run on small stacks");
    assert_eq!(run.outcome.stdout_text(), "both blocks made\n");
    let p = run.report.only_process();
    assert_eq!(p.at_peak("thread_block"), 3 * KIB + 7, "{}", p.describe());
    assert_eq!(
        p.at_peak("coroutine_block"),
        5 * KIB + 3,
        "{}",
        p.describe()
    );
    assert_eq!(p.allocations("thread_block"), 1);
    assert_eq!(p.allocations("coroutine_block"), 1);
    assert_eq!(p.live("thread_block") + p.live("coroutine_block"), 0);
}

/// GIVEN a program that allocates 700 KiB + 9 bytes in `limited_block` and holds it.
const LIMITED: &str = r#"
NOINLINE void *limited_block(void) { return malloc(700 * KiB + 9); }
int main(void) {
    void *held = limited_block();
    say("allocated\n");
    free(held);
    return 0;
}
"#;

/// Runs the `LIMITED` program as `mwt_<name>` under the shell's `ulimit <limit>` and checks
/// what every limit must give: the program's own output, the preload's note of the smaller
/// profile, and the block's exact bytes at the peak; then `check` on the program's process.
fn profiled_under_limit(scratch: &Scratch, name: &str, limit: &str, check: impl Fn(&Process)) {
    let program = scratch.compile(name, LIMITED);
    let script = format!("ulimit {limit} && exec {}", program.arg());

    let run = profile(scratch, &["/bin/sh", "-c", &script]);

    assert_success(&run.outcome, &format!("memwarden run under ulimit {limit}"));
    assert_eq!(run.outcome.stdout_text(), "allocated\n");
    assert!(
        run.outcome
            .stderr_text()
            .contains("memwarden: the process's limits (ulimit -v or -f) leave no room for a full profile: it holds at most "),
        "{}",
        run.outcome.stderr_text()
    );
    let limited = run.report.process_of(program.arg());
    assert_eq!(
        limited.at_peak("limited_block"),
        700 * KIB + 9,
        "{}",
        limited.describe()
    );
    check(limited);
}

#[test]
fn a_process_with_a_small_address_space_is_profiled_with_smaller_capacities() {
    let scratch = Scratch::new("address_space");
    // 400 MB of address space: less than the profile's mapping at its default capacities.
    profiled_under_limit(&scratch, "address_space", "-v 400000", |limited| {
        assert_eq!(limited.allocations("limited_block"), 1);
    });
}

/// GIVEN the whole `memwarden run` command under the shell's `ulimit -v 150000`, so that
/// memwarden's own process has the limit too: each of the report's threads took a glibc
/// heap of its own, 64 MiB of address space apiece, and the report ran out and aborted.
/// THEN the program runs as before, memwarden exits with its status, and the report holds
/// the block's exact bytes at the peak.
#[test]
fn memwarden_itself_under_an_address_space_limit_writes_its_report() {
    let scratch = Scratch::new("cli_address_space");
    let program = scratch.compile("cli_limited", LIMITED);
    let out = scratch.out_dir();
    let script = format!(
        "ulimit -v 150000 && exec {} run -o {} -- {}",
        memwarden().display(),
        out.display(),
        program.arg()
    );
    let output = std::process::Command::new("/bin/sh")
        .args(["-c", &script])
        .output()
        .expect("run /bin/sh");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "allocated\n");
    let report = common::report::Report::load(&out.join("report.json"))
        .unwrap_or_else(|e| panic!("no report ({e}): {stderr}"));
    let limited = report.process_of(program.arg());
    assert_eq!(
        limited.at_peak("limited_block"),
        700 * KIB + 9,
        "{}",
        limited.describe()
    );
}

#[test]
fn a_process_with_a_file_size_limit_is_profiled_and_not_killed() {
    let scratch = Scratch::new("file_size_limit");
    // 20–40 MB files (512- or 1024-byte blocks, as the shell counts): less than the sparse
    // profile file at its default capacities. Sizing a file past the limit is SIGXFSZ.
    profiled_under_limit(&scratch, "file_size_limit", "-f 40000", |limited| {
        assert_eq!(limited.exit, Some(Exit::code(0)), "{}", limited.describe());
    });
}

/// GIVEN a program that holds 3 KiB + 1 byte in `before_limit_block`, starts a thread that
/// waits, then lowers its own address-space limit to what it already uses and allocates until
/// glibc refuses (keeping one 2 KiB block free for the thread's own first allocations). The
/// thread then allocates, so memwarden must find memory for that thread's first stack walk
/// where there is none.
const EXHAUSTED: &str = r#"
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>
static int wake[2];
static void *held;
NOINLINE void *before_limit_block(void) { return malloc(3 * KiB + 1); }
NOINLINE static void *late_thread(void *arg) {
    char go;
    if (read(wake[0], &go, 1) != 1) return arg;
    keep(malloc(100));
    say("thread allocated\n");
    return arg;
}
/* The address space in use now, from /proc without allocating. */
static rlim_t address_space_in_use(void) {
    char text[128] = {0};
    int fd = open("/proc/self/statm", O_RDONLY);
    if (fd < 0 || read(fd, text, sizeof text - 1) <= 0) exit(5);
    close(fd);
    return (rlim_t)strtoull(text, NULL, 10) * (rlim_t)sysconf(_SC_PAGESIZE);
}
/* Allocates blocks of `size` until refused, chaining them through their first word. */
NOINLINE static void **exhaust(size_t size, void **chain) {
    for (void **block; (block = malloc(size)) != NULL; chain = block) *block = chain;
    return chain;
}
int main(void) {
    held = before_limit_block();
    pthread_t thread;
    if (pipe(wake) != 0 || pthread_create(&thread, NULL, late_thread, NULL) != 0) return 4;
    struct rlimit limit = {address_space_in_use(), RLIM_INFINITY};
    if (setrlimit(RLIMIT_AS, &limit) != 0) return 6;
    void **chain = exhaust(64 * KiB, NULL);
    void **spare = exhaust(2 * KiB, chain);
    chain = exhaust(16, *spare);
    free(spare); /* larger than glibc's per-thread cache takes: any thread can have it */
    if (write(wake[1], "g", 1) != 1) return 7;
    pthread_join(thread, NULL);
    say("done\n");
    keep(chain);
    return 0;
}
"#;

#[test]
fn a_program_that_uses_up_its_address_space_runs_on_and_its_profile_says_why_tracking_stopped() {
    let scratch = Scratch::new("exhausted");
    let program = compiled_and_run_bare(&scratch, "exhausted", EXHAUSTED);

    let run = profile(&scratch, &[program.arg()]);

    assert_success(&run.outcome, "memwarden run out of address space");
    assert_eq!(run.outcome.stdout_text(), "thread allocated\ndone\n");
    let stderr = run.outcome.stderr_text();
    assert!(
        stderr.contains("memwarden: stopped tracking: no memory left for memwarden's own use"),
        "{stderr}"
    );
    let p = run.report.only_process();
    assert_eq!(
        p.degraded.as_deref(),
        Some("own_memory_exhausted"),
        "{}",
        p.describe()
    );
    assert_eq!(p.exit, Some(Exit::code(0)), "{}", p.describe());
    assert_eq!(
        p.at_peak("before_limit_block"),
        3 * KIB + 1,
        "{}",
        p.describe()
    );
}
