//! `memwarden run --guard header` on deallocations that do not match their allocation:
//! C++ `new[]` freed with `delete` or `free`, `malloc` freed with `delete`, and sized
//! deallocations (`operator delete(void*, size_t)`, C23 `free_sized`) naming the wrong size.

mod common;
use common::guards::{run_guarded, At, Expected, GuardRun};
use common::*;

const CONTINUED: &str = "continued after the bug\n";

/// Runs `prog` under `--guard header`; it must have run on to its end and exited 0.
fn run_header(scratch: &Scratch, prog: &Program) -> GuardRun {
    let run = run_guarded(scratch, &["--guard", "header"], &[prog.arg()]);
    assert_eq!(
        (run.status(), run.stdout()),
        (0, CONTINUED.to_owned()),
        "the program runs on after the bug; stderr:\n{}",
        run.stderr()
    );
    run
}

/// A C++ program whose main makes a block with `make`, hands it to `drop` and prints the
/// marker (C++ frames are named with their parameter types: `drop_block(char*)`). The pointer passes through functions the compiler cannot see into, so it
/// cannot warn about the mismatch at compile time.
fn mismatch_program(make: &str, drop: &str) -> String {
    format!(
        r#"
#include <new>
NOINLINE char *make_block() {{ {make} }}
NOINLINE void drop_block(char *p) {{ {drop} }}
int main() {{
    char *p = make_block();
    drop_block(p);
    say("continued after the bug\n");
    return 0;
}}
"#
    )
}

fn assert_mismatch(name: &str, make: &str, drop: &str) {
    let scratch = Scratch::new(&format!("guard_{name}"));
    let prog = scratch.compile_cpp(name, &mismatch_program(make, drop));
    let run = run_header(&scratch, &prog);
    run.assert_one_error(
        "header",
        &Expected {
            kind: "alloc-dealloc-mismatch",
            block_size: 100,
            offset: 0,
            stack: At::Function("drop_block(char*)"),
            alloc_stack: At::Function("make_block()"),
            free_stack: At::Unknown,
        },
    );
}

#[test]
fn new_array_freed_with_delete_is_a_mismatch() {
    assert_mismatch("new_array_delete", "return new char[100];", "delete p;");
}

#[test]
fn new_array_freed_with_free_is_a_mismatch() {
    assert_mismatch("new_array_free", "return new char[100];", "free(p);");
}

#[test]
fn malloc_freed_with_delete_is_a_mismatch() {
    assert_mismatch(
        "malloc_delete",
        "return static_cast<char *>(malloc(100));",
        "delete p;",
    );
}

#[test]
fn sized_delete_with_the_wrong_size_is_a_size_mismatch() {
    let scratch = Scratch::new("guard_sized_delete");
    let prog = scratch.compile_cpp(
        "sized_delete",
        r#"
#include <new>
NOINLINE void *make_block() { return ::operator new(100); }
NOINLINE void drop_block(void *p, size_t n) { ::operator delete(p, n); }
int main() {
    void *p = make_block();
    drop_block(p, 96);
    say("continued after the bug\n");
    return 0;
}
"#,
    );
    let run = run_header(&scratch, &prog);
    run.assert_one_error(
        "header",
        &Expected {
            kind: "size-mismatch",
            block_size: 100,
            offset: 96,
            stack: At::Function("drop_block(void*, unsigned long)"),
            alloc_stack: At::Function("make_block()"),
            free_stack: At::Unknown,
        },
    );
}

#[test]
fn free_sized_with_the_wrong_size_is_a_size_mismatch() {
    let scratch = Scratch::new("guard_free_sized");
    // glibc 2.36 has no free_sized: the program finds memwarden's through a weak reference.
    let prog = scratch.compile(
        "free_sized",
        r#"
void free_sized(void *p, size_t size) __attribute__((weak));
NOINLINE void *make_block(void) { return malloc(100); }
NOINLINE void drop_block(void *p, size_t n) { free_sized(p, n); }
int main(void) {
    if (!free_sized) {
        say("no free_sized\n");
        return 3;
    }
    void *p = make_block();
    drop_block(p, 50);
    say("continued after the bug\n");
    return 0;
}
"#,
    );
    let run = run_header(&scratch, &prog);
    run.assert_one_error(
        "header",
        &Expected {
            kind: "size-mismatch",
            block_size: 100,
            offset: 50,
            stack: At::Function("drop_block"),
            alloc_stack: At::Function("make_block"),
            free_stack: At::Unknown,
        },
    );
}

#[test]
fn matching_sized_deallocations_are_no_error() {
    let scratch = Scratch::new("guard_sized_ok");
    let prog = scratch.compile_cpp(
        "sized_ok",
        r#"
#include <new>
extern "C" void free_sized(void *p, size_t size) __attribute__((weak));
struct Node { char payload[40]; };
NOINLINE void churn() {
    for (int i = 0; i < 100; i++) {
        Node *n = new Node();
        keep(n);
        delete n;
        char *a = new char[i + 1];
        keep(a);
        delete[] a;
        void *raw = ::operator new(64 + i);
        ::operator delete(raw, 64 + i);
        void *m = malloc(i + 1);
        if (free_sized) free_sized(m, i + 1); else free(m);
    }
}
int main() {
    churn();
    say("continued after the bug\n");
    return 0;
}
"#,
    );
    let run = run_header(&scratch, &prog);
    run.assert_no_error("header");
}
