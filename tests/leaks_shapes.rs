//! `memwarden run --leak-check`: the shapes of lost memory, classified as Valgrind memcheck
//! does — a list whose head is dropped (one definite, the rest indirect), a cycle, a block
//! held only through an interior pointer (possible; reachable in LeakSanitizer's view),
//! `malloc(0)`, and a child that leaks after `fork`. Every figure of the program's own
//! blocks is checked against memcheck on the same program.

mod common;
use common::leaks::{
    our_kinds_of, run_leak_check, valgrind_kinds_of, valgrind_records, valgrind_totals, LeakRun,
};
use common::*;

const D: usize = 0;
const I: usize = 1;
const P: usize = 2;
const R: usize = 3;

/// Compiles `body`, runs it under `--leak-check` + `options`, and checks the program's
/// blocks (those allocated under one of `functions`) per kind: memwarden's figures must be
/// `expected` (index D, I, P, R), and memcheck's the same (in memcheck's view).
fn check_shape(
    name: &str,
    body: &str,
    options: &[&str],
    functions: &[&str],
    expected: [(u64, u64); 4],
) -> LeakRun {
    let scratch = Scratch::new(&format!("leaks_shape_{name}"));
    let prog = scratch.compile(name, body);
    let run = run_leak_check(&scratch, options, &[prog.arg()]);
    assert_success(run.outcome(), name);
    let ours = our_kinds_of(run.process(prog.name()), functions);
    assert_eq!(
        ours, expected,
        "{name}: (bytes, blocks) per kind D, I, P, R"
    );
    let lsan = options.contains(&"lsan");
    if let Some(records) = valgrind_records(&scratch, &[prog.arg()]).filter(|_| !lsan) {
        assert_eq!(
            ours,
            valgrind_kinds_of(&records, functions),
            "{name}: as memcheck"
        );
        let summary = run.summary(prog.name()).kinds();
        let theirs = valgrind_totals(&records);
        assert_eq!(
            [summary[D], summary[I]],
            [theirs[D], theirs[I]],
            "{name}: definite and indirect over the whole process, as memcheck"
        );
    }
    run
}

fn kinds(entries: &[(usize, u64, u64)]) -> [(u64, u64); 4] {
    let mut all = [(0, 0); 4];
    for &(kind, bytes, blocks) in entries {
        all[kind] = (bytes, blocks);
    }
    all
}

const LIST: &str = r#"
struct node { struct node *next; char payload[40]; };
void *volatile head;
NOINLINE struct node *make_node(struct node *next) {
    struct node *n = malloc(sizeof *n);
    n->next = next;
    return n;
}
NOINLINE void make_list(int n) {
    struct node *first = NULL;
    for (int i = 0; i < n; i++) first = make_node(first);
    head = first;
}
"#;

#[test]
fn a_list_whose_head_is_dropped_is_one_definite_block_and_the_rest_indirect() {
    let body = format!("{LIST}\nint main(void) {{ make_list(10); head = NULL; return 0; }}\n");
    let run = check_shape(
        "list",
        &body,
        &[],
        &["make_node"],
        kinds(&[(D, 48, 1), (I, 9 * 48, 9)]),
    );
    let text = run.outcome().stderr_text();
    assert!(
        text.contains("Direct leak of 48 byte(s) in 1 object(s) allocated from:")
            && text.contains("Indirect leak of 432 byte(s) in 9 object(s) allocated from:")
            && text.contains("SUMMARY: memwarden: 480 byte(s) leaked in 10 allocation(s)."),
        "sanitizer-style text on stderr:\n{text}"
    );
    let direct = text.find("Direct leak").unwrap();
    let indirect = text.find("Indirect leak").unwrap();
    assert!(direct < indirect, "direct leaks come first:\n{text}");
}

#[test]
fn a_held_list_is_reachable() {
    let body = format!("{LIST}\nint main(void) {{ make_list(10); return 0; }}\n");
    check_shape(
        "held_list",
        &body,
        &[],
        &["make_node"],
        kinds(&[(R, 480, 10)]),
    );
}

#[test]
fn a_lost_cycle_is_one_definite_and_one_indirect_block() {
    check_shape(
        "cycle",
        r#"
struct pair { struct pair *other; char payload[24]; };
NOINLINE struct pair *make_pair(void) { return calloc(1, sizeof(struct pair)); }
NOINLINE void make_cycle(void) {
    struct pair *a = make_pair(), *b = make_pair();
    a->other = b;
    b->other = a;
}
int main(void) { make_cycle(); return 0; }
"#,
        &[],
        &["make_pair"],
        kinds(&[(D, 32, 1), (I, 32, 1)]),
    );
}

const INTERIOR: &str = r#"
char *volatile inside;
NOINLINE char *make_buffer(void) { return malloc(256); }
NOINLINE void *make_child(void) { return malloc(64); }
int main(void) {
    char *buffer = make_buffer();
    *(void **)buffer = make_child();
    inside = buffer + 100;
    return 0;
}
"#;

#[test]
fn a_block_held_through_an_interior_pointer_is_possible() {
    check_shape(
        "interior",
        INTERIOR,
        &[],
        &["make_buffer", "make_child"],
        kinds(&[(P, 256 + 64, 2)]),
    );
}

#[test]
fn in_the_lsan_view_an_interior_pointer_keeps_a_block_reachable() {
    let run = check_shape(
        "interior_lsan",
        INTERIOR,
        &["--leak-view", "lsan"],
        &["make_buffer", "make_child"],
        kinds(&[(R, 256 + 64, 2)]),
    );
    let check = run.report.processes[0].leak_check.as_ref().unwrap();
    assert_eq!(check.view, "lsan");
}

#[test]
fn a_leaked_malloc_of_zero_bytes_is_one_definite_block() {
    let run = check_shape(
        "malloc0",
        r#"
NOINLINE void *make_nothing(void) { return malloc(0); }
int main(void) { make_nothing(); return 0; }
"#,
        &[],
        &["make_nothing"],
        kinds(&[(D, 0, 1)]),
    );
    assert!(run
        .outcome()
        .stderr_text()
        .contains("Direct leak of 0 byte(s) in 1 object(s) allocated from:"));
}

#[test]
fn a_child_that_leaks_after_fork_is_checked_on_its_own() {
    let scratch = Scratch::new("leaks_shape_fork");
    let prog = scratch.compile(
        "fork",
        r#"
#include <sys/wait.h>
void *volatile kept;
NOINLINE void *parent_block(void) { return malloc(1000); }
NOINLINE void *child_block(void) { return malloc(3000); }
int main(void) {
    kept = parent_block();
    pid_t pid = fork();
    if (pid == 0) {
        child_block();
        kept = NULL;
        exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
"#,
    );
    let run = run_leak_check(&scratch, &["--error-exitcode", "42"], &[prog.arg()]);
    assert_eq!(run.outcome().code(), 42, "the child's leak fails the gate");
    let parent = run
        .report
        .processes
        .iter()
        .find(|p| p.ppid != 0 && !run.report.processes.iter().any(|q| q.pid == p.ppid))
        .expect("the parent");
    let child = run
        .report
        .processes
        .iter()
        .find(|p| p.ppid == parent.pid)
        .expect("the child");
    let functions = ["parent_block", "child_block"];
    assert_eq!(
        our_kinds_of(parent, &functions),
        kinds(&[(R, 1000, 1)]),
        "the parent holds its block"
    );
    assert_eq!(
        our_kinds_of(child, &functions),
        kinds(&[(D, 1000 + 3000, 2)]),
        "the child dropped both its inherited block and its own"
    );
}
