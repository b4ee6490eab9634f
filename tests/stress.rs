//! Real and rough workloads run to completion under the profiler with unchanged results:
//! the sqlite3 shell, and threads churning the heap while the main thread forks.

mod common;
use common::sql::sql_script;
use common::*;
use std::fmt::Write as _;
use std::process::Command;

#[test]
fn sqlite3_shell_gives_the_same_output_under_the_profiler() {
    let sqlite = "/usr/bin/sqlite3";
    if Command::new(sqlite).arg("-version").output().is_err() {
        return skip_or_fail("sqlite3");
    }
    let scratch = Scratch::new("stress_sqlite");
    let script = scratch.write("script.sql", sql_script(50_000));
    let bare = run_bare(&scratch, &[sqlite, ":memory:"], Some(&script));
    assert_success(&bare, "sqlite3 without the profiler");
    assert!(
        bare.stdout.len() > 1000,
        "the script prints its query results"
    );

    let run = profile_with(
        &scratch,
        &[sqlite, ":memory:"],
        &RunOptions {
            stdin: Some(&script),
            ..Default::default()
        },
    );

    assert_success(&run.outcome, "sqlite3 under memwarden");
    assert!(
        run.outcome.stdout == bare.stdout,
        "the profiled output differs from the bare output"
    );
    let p = run.report.only_process();
    assert_eq!(p.exit, Some(Exit::code(0)));
    assert!(
        p.totals.allocations > 50_000,
        "sqlite3 allocated: {:?}",
        p.totals
    );
    assert_eq!(p.peak_bytes, p.at_peak_total(), "{}", p.describe());
}

/// GIVEN four threads churning malloc/calloc/realloc/free while the main thread forks 50
/// children, each of which allocates 100 blocks in child_work(), frees them and exits 0.
const FORK_CHURN: &str = r#"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#define THREADS 4
#define CHILDREN 50
atomic_int stop;
NOINLINE void *churn(void *arg) {
    unsigned seed = (unsigned)(long)arg * 2654435761u + 1;
    void *ring[256] = {0};
    while (!atomic_load(&stop)) {
        for (int i = 0; i < 1000; i++) {
            seed = seed * 1103515245u + 12345u;
            unsigned slot = (seed >> 8) % 256;
            size_t size = 16 + (seed >> 16) % 4080;
            switch (seed % 4) {
            case 0: free(ring[slot]); ring[slot] = malloc(size); break;
            case 1: free(ring[slot]); ring[slot] = calloc(1, size); break;
            case 2: { void *p = realloc(ring[slot], size); if (p) ring[slot] = p; break; }
            default: free(ring[slot]); ring[slot] = NULL; break;
            }
        }
    }
    for (int i = 0; i < 256; i++) free(ring[i]);
    return NULL;
}
NOINLINE void child_work(void) {
    void *blocks[100];
    for (int i = 0; i < 100; i++) blocks[i] = malloc(1000 + (size_t)i);
    for (int i = 0; i < 100; i++) free(blocks[i]);
}
int main(void) {
    pthread_t t[THREADS];
    pid_t kids[CHILDREN];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, churn, (void *)i);
    for (int i = 0; i < CHILDREN; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            child_work();
            exit(0);
        }
        if (kids[i] < 0) return 3;
    }
    int failed = 0;
    for (int i = 0; i < CHILDREN; i++) {
        int status = 0;
        if (waitpid(kids[i], &status, 0) != kids[i] || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    say(failed ? "some children failed\n" : "all children exited 0\n");
    return failed ? 1 : 0;
}
"#;

#[test]
fn forking_while_threads_churn_neither_hangs_nor_loses_a_child() {
    let scratch = Scratch::new("stress_fork_churn");
    let prog = scratch.compile("fork_churn", FORK_CHURN);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "the fork churn program under memwarden");
    assert_eq!(run.outcome.stdout_text(), "all children exited 0\n");
    let r = &run.report;
    assert_eq!(
        r.processes.len(),
        51,
        "the parent and 50 children\n{}",
        r.describe()
    );
    let parent = r.processes.iter().find(|p| !p.forked).expect("the parent");
    assert_eq!(parent.exit, Some(Exit::code(0)));
    assert_eq!(
        parent.live("churn"),
        0,
        "the threads freed their rings\n{}",
        parent.describe()
    );
    for child in r.processes.iter().filter(|p| p.forked) {
        assert_eq!(child.ppid, parent.pid);
        assert_eq!(child.exit, Some(Exit::code(0)), "{}", child.describe());
        assert_eq!(child.allocations("child_work"), 100, "{}", child.describe());
        assert_eq!(
            child.allocated("child_work"),
            100 * 1000 + 4950,
            "{}",
            child.describe()
        );
        assert_eq!(child.live("child_work"), 0, "{}", child.describe());
    }
}

/// A program of `n` functions `f0`..`f{n-1}`, `f{i}` allocating `i + 1` bytes once and
/// keeping them, all called from main through a table.
fn many_functions(n: u64) -> String {
    let mut c = String::new();
    for i in 0..n {
        let _ = writeln!(c, "NOINLINE void f{i}(void) {{ keep(malloc({})); }}", i + 1);
    }
    c.push_str("typedef void (*fn_t)(void);\nstatic fn_t const all[] = {");
    for i in 0..n {
        let _ = write!(c, "f{i},");
    }
    c.push_str("};\nint main(void) {\n    for (unsigned i = 0; i < sizeof all / sizeof all[0]; i++) all[i]();\n    return 0;\n}\n");
    c
}

#[test]
fn thousands_of_distinct_stacks_are_each_exact() {
    let scratch = Scratch::new("stress_many_stacks");
    let n = 3000;
    let prog = scratch.compile("many_stacks", &many_functions(n));

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    for i in 0..n {
        let f = format!("f{i}");
        assert_eq!(p.live(&f), i + 1, "{f}");
        assert_eq!(p.at_peak(&f), i + 1, "{f}");
        assert_eq!(p.allocations(&f), 1, "{f}");
    }
    p.assert_peak_near(n * (n + 1) / 2);
}
