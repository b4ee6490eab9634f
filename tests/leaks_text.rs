//! What `memwarden run --leak-check` says on stderr besides the leaks themselves: a check
//! that found no counted leak says so, with what it found of the kinds it does not count,
//! and a thread that blocks every signal (pyarrow's jemalloc thread does) is left running,
//! not waited for, and named as not stopped.

mod common;
use common::leaks::run_leak_check;
use common::*;

/// GIVEN a program whose one block of its own is still reachable at exit (a global holds
/// it), and nothing lost.
const CLEAN: &str = r#"
void *kept;
NOINLINE void keep_one(void) { kept = malloc(12); }
int main(void) { keep_one(); return 0; }
"#;

#[test]
fn a_check_that_finds_no_counted_leak_says_so() {
    let scratch = Scratch::new("leaks_text_clean");
    let prog = scratch.compile("clean", CLEAN);

    let run = run_leak_check(&scratch, &["--error-exitcode", "42"], &[prog.arg()]);

    assert_eq!(run.outcome().code(), 0, "{}", run.outcome().stderr_text());
    let p = run.process(prog.name());
    let reachable = p.leak_summary.expect("leak_summary").reachable;
    assert!(reachable.bytes >= 12, "{reachable:?}");
    let text = run.outcome().stderr_text();
    let expected = format!(
        "memwarden: pid {}: leak check: no definite or indirect leaks; not counted: ",
        p.pid
    );
    let line = text
        .lines()
        .find(|l| l.starts_with(&expected))
        .unwrap_or_else(|| panic!("a line starting {expected:?}:\n{text}"));
    let blocks = reachable.blocks;
    assert!(
        line.ends_with(&format!(
            " still reachable in {blocks} block{}",
            if blocks == 1 { "" } else { "s" }
        )),
        "{line}"
    );
    assert!(!text.contains("SUMMARY: memwarden:"), "{text}");
    assert!(!text.contains("could not be stopped"), "{text}");

    // WHEN possible leaks count too, THEN the line names the three kinds.
    let three = run_leak_check(
        &scratch,
        &["--leak-kinds", "definite,indirect,possible"],
        &[prog.arg()],
    );
    let text = three.outcome().stderr_text();
    assert!(
        text.contains(": leak check: no definite, indirect or possible leaks; not counted: "),
        "{text}"
    );

    // WHEN reachable blocks count too, THEN the one kept is a leak the gate fails on.
    let counted = run_leak_check(
        &scratch,
        &[
            "--leak-kinds",
            "definite,reachable",
            "--error-exitcode",
            "42",
        ],
        &[prog.arg()],
    );
    assert_eq!(counted.outcome().code(), 42);
    let text = counted.outcome().stderr_text();
    assert!(
        text.contains("Still reachable of 12 byte(s) in 1 object(s)"),
        "{text}"
    );
    assert!(!text.contains("leak check: no "), "{text}");
}

/// GIVEN a thread that blocks every signal and waits, with main leaking 40 bytes and
/// exiting while it waits.
const DEAF_THREAD: &str = r#"
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
NOINLINE void *deaf(void *unused) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) pause();
    return unused;
}
NOINLINE void lose(void) { malloc(40); }
int main(void) {
    pthread_t thread;
    pthread_create(&thread, NULL, deaf, NULL);
    usleep(100 * 1000);
    lose();
    return 0;
}
"#;

#[test]
fn a_thread_that_blocks_every_signal_is_named_as_not_stopped() {
    let scratch = Scratch::new("leaks_text_deaf");
    let prog = scratch.compile_with("deaf_thread", DEAF_THREAD, &["-pthread"]);

    let run = run_leak_check(&scratch, &[], &[prog.arg()]);

    assert_success(run.outcome(), "deaf_thread");
    let p = run.process(prog.name());
    let check = p.leak_check.as_ref().expect("leak_check");
    assert_eq!((check.threads_stopped, check.threads_missed), (0, 1));
    let lost: Vec<u64> = p
        .leaks
        .iter()
        .filter(|l| l.has_function("lose"))
        .map(|l| l.bytes)
        .collect();
    assert_eq!(lost, [40]);
    let text = run.outcome().stderr_text();
    assert!(
        text.contains(&format!(
            "memwarden: pid {}: leak check: 1 thread could not be stopped; its stack was scanned, not its registers",
            p.pid
        )),
        "{text}"
    );
    assert!(text.contains("SUMMARY: memwarden: 40 byte(s) leaked in 1 allocation(s)."));
}
