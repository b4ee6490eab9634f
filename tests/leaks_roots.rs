//! `memwarden run --leak-check`, one root kind per program: a block held only by that root
//! (a global, another thread's stack while it runs, another thread's register, static TLS,
//! dynamic TLS of a dlopen'ed library, `pthread_setspecific`, a private file mapping) is
//! not leaked; the same
//! program dropping its only pointer leaks it, definitely. Every figure is checked against
//! Valgrind memcheck on the same program.

mod common;
use common::leaks::{
    our_kinds_of, run_leak_check, valgrind_kinds_of, valgrind_records, valgrind_totals,
};
use common::*;

/// The block every program below holds or drops: 4000 bytes from `make_block`.
const MAKE: &str = r#"
#include <pthread.h>
#include <dlfcn.h>
NOINLINE void *make_block(void) { return malloc(4000); }
/* Overwrites the caller-saved registers, so that a dropped pointer survives in none. */
NOINLINE void scrub(void) {
    __asm__ volatile("xor %%eax, %%eax\n\txor %%ecx, %%ecx\n\txor %%edx, %%edx\n\t"
                     "xor %%esi, %%esi\n\txor %%edi, %%edi\n\txor %%r8d, %%r8d\n\t"
                     "xor %%r9d, %%r9d\n\txor %%r10d, %%r10d\n\txor %%r11d, %%r11d"
                     ::: "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11");
}
static int dropping(int argc, char **argv) { return argc > 1 && strcmp(argv[1], "drop") == 0; }
"#;

/// Runs `prog hold` and `prog drop` under memwarden and valgrind; checks that the hold run
/// leaks nothing of `make_block` and the drop run leaks its 4000 bytes definitely, and that
/// every kind's figures equal memcheck's.
fn check_root(name: &str, body: &str, extra: &[&str]) {
    let scratch = Scratch::new(&format!("leaks_root_{name}"));
    let prog = scratch.compile_with(name, &format!("{MAKE}\n{body}"), extra);
    for mode in ["hold", "drop"] {
        let run = run_leak_check(&scratch, &[], &[prog.arg(), mode]);
        assert_success(run.outcome(), &format!("{name} {mode}"));
        let ours = run.summary(prog.name());
        let p = run.process(prog.name());
        let lost_blocks: Vec<_> = p
            .leaks
            .iter()
            .filter(|l| l.has_function("make_block") && l.kind != "reachable")
            .collect();
        match mode {
            "hold" => assert!(
                lost_blocks.is_empty(),
                "{name}: the held block is not leaked: {lost_blocks:?}"
            ),
            _ => {
                assert_eq!(lost_blocks.len(), 1, "{name}: {lost_blocks:?}");
                let leak = lost_blocks[0];
                assert_eq!(
                    (leak.kind.as_str(), leak.bytes, leak.blocks),
                    ("definite", 4000, 1),
                    "{name}: the dropped block is a definite leak"
                );
            }
        }
        if let Some(records) = valgrind_records(&scratch, &[prog.arg(), mode]) {
            // The program's own blocks: every kind as memcheck says. The C runtime's blocks
            // differ in size under each tool (each adds its own modules), so only their lost
            // figures are compared: none in either.
            assert_eq!(
                our_kinds_of(p, &["make_block"]),
                valgrind_kinds_of(&records, &["make_block"]),
                "{name} {mode}: (bytes, blocks) per kind definite, indirect, possible, reachable"
            );
            let theirs = valgrind_totals(&records);
            assert_eq!(
                [ours.kinds()[0], ours.kinds()[1]],
                [theirs[0], theirs[1]],
                "{name} {mode}: definite and indirect over the whole process"
            );
        }
    }
}

#[test]
fn a_global_holds_a_block() {
    check_root(
        "global",
        r#"
void *global_root;
int main(int argc, char **argv) {
    global_root = make_block();
    if (dropping(argc, argv)) global_root = NULL;
    scrub();
    return 0;
}
"#,
        &[],
    );
}

#[test]
fn another_threads_stack_holds_a_block_while_it_runs() {
    check_root(
        "thread_stack",
        r#"
static volatile int ready;
static int drop;
NOINLINE void *hold_on_stack(void *unused) {
    void *volatile local = make_block();
    if (drop) local = NULL;
    scrub();
    ready = 1;
    for (;;) pause();
    return (void *)local;
}
int main(int argc, char **argv) {
    drop = dropping(argc, argv);
    pthread_t thread;
    pthread_create(&thread, NULL, hold_on_stack, NULL);
    while (!ready) sched_yield();
    exit(0);
}
"#,
        &[],
    );
}

#[test]
fn another_threads_register_holds_a_block() {
    check_root(
        "thread_register",
        r#"
static volatile int ready;
static int drop;
NOINLINE void *hold_in_register(void *unused) {
    register void *held __asm__("r12") = make_block();
    if (drop) held = NULL;
    __asm__ volatile("" : "+r"(held));
    scrub();
    ready = 1;
    for (;;) __asm__ volatile("pause" : "+r"(held));
    return NULL;
}
int main(int argc, char **argv) {
    drop = dropping(argc, argv);
    pthread_t thread;
    pthread_create(&thread, NULL, hold_in_register, NULL);
    while (!ready) sched_yield();
    exit(0);
}
"#,
        &[],
    );
}

#[test]
fn static_tls_holds_a_block() {
    check_root(
        "static_tls",
        r#"
__thread void *tls_root;
int main(int argc, char **argv) {
    tls_root = make_block();
    if (dropping(argc, argv)) tls_root = NULL;
    scrub();
    return 0;
}
"#,
        &[],
    );
}

#[test]
fn thread_specific_data_holds_a_block() {
    check_root(
        "setspecific",
        r#"
static pthread_key_t key;
int main(int argc, char **argv) {
    pthread_key_create(&key, NULL);
    pthread_setspecific(key, make_block());
    if (dropping(argc, argv)) pthread_setspecific(key, NULL);
    scrub();
    return 0;
}
"#,
        &[],
    );
}

/// As the JVM's class-data archive does: a file mapped private and writable holds the only
/// pointer. The mapping is four pages over a one-page file, so three of its pages raise
/// SIGBUS when read: the check must skip them, not die on them.
#[test]
fn a_private_file_mapping_past_its_files_end_holds_a_block() {
    check_root(
        "file_mapping",
        r#"
#include <sys/mman.h>
int main(int argc, char **argv) {
    char path[] = "/tmp/memwarden-file-root-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || unlink(path) != 0 || ftruncate(fd, 4096) != 0) return 3;
    void *volatile *mapping = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) return 4;
    close(fd);
    mapping[100] = make_block();
    if (dropping(argc, argv)) mapping[100] = NULL;
    scrub();
    return 0;
}
"#,
        &[],
    );
}

#[test]
fn dynamic_tls_of_a_dlopened_library_holds_a_block() {
    let scratch = Scratch::new("leaks_root_dynamic_tls_lib");
    let library = scratch.compile_with(
        "dyntls.so",
        r#"
__thread void *dynamic_root;
void set_root(void *p) { dynamic_root = p; }
"#,
        &["-shared", "-fPIC"],
    );
    let body = format!(
        r#"
int main(int argc, char **argv) {{
    void *library = dlopen("{}", RTLD_NOW);
    if (!library) return 3;
    void (*set_root)(void *) = (void (*)(void *))dlsym(library, "set_root");
    set_root(make_block());
    if (dropping(argc, argv)) set_root(NULL);
    scrub();
    return 0;
}}
"#,
        library.path.display()
    );
    check_root("dynamic_tls", &body, &[]);
}
