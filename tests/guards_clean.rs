//! Programs without heap bugs report no error in any guard mode, and give the same output
//! as without memwarden: a small C++ program using every allocation function (and every
//! byte `pvalloc` and `malloc_usable_size` say it may), the sqlite3
//! shell on a generated script, and NumPy.

mod common;
use common::guards::run_guarded;
use common::sql::sql_script;
use common::*;
use std::process::Command;

/// Every guard mode, as `memwarden run` options, with the name report.json gives it.
const MODES: [(&[&str], &str); 4] = [
    (&["--guard", "header", "--check-every", "100"], "header"),
    (&["--guard", "page"], "page"),
    (&["--guard", "sampled", "--sample-rate", "1"], "sampled"),
    (
        &["--guard", "header", "--align", "64", "--fill-alloc", "0xab"],
        "header",
    ),
];

/// GIVEN a correct program that uses the whole malloc family and C++ new/delete (sized and
/// over-aligned forms too), fills what it allocates, keeps some of it to the end, and
/// prints a checksum.
const CORRECT: &str = r#"
#include <malloc.h>
#include <new>
#include <vector>
#include <string>
#include <cstdio>
#include <cstdint>
struct Node { Node *next; char payload[40]; };
struct alignas(64) Wide { char bytes[100]; };
NOINLINE unsigned long work() {
    unsigned long sum = 0;
    Node *list = nullptr;
    std::vector<std::string> words;
    for (int i = 0; i < 2000; i++) {
        size_t n = 1 + (size_t)(i * 37) % 700;
        char *m = static_cast<char *>(malloc(n));
        memset(m, i & 0xff, n);
        char *c = static_cast<char *>(calloc(n, 2));
        c = static_cast<char *>(realloc(c, n * 3));
        memset(c, 1, n * 3);
        void *a = aligned_alloc(64, 128);
        void *pm = nullptr;
        if (posix_memalign(&pm, 256, n) != 0) return 0;
        memset(pm, 2, n);
        Node *node = new Node();
        node->next = list;
        list = node;
        char *array = new char[n];
        memset(array, 3, n);
        Wide *wide = new Wide();
        Wide *wides = new Wide[1 + i % 4];
        if ((uintptr_t)wide % 64 != 0 || (uintptr_t)wides % 64 != 0) return 1;
        delete wide;
        delete[] wides;
        words.push_back(std::to_string(i * 7919));
        sum += (unsigned char)m[n - 1] + (unsigned char)c[n * 3 - 1] + (unsigned char)array[n - 1];
        free(m); free(c); free(a); free(pm);
        delete[] array;
        if (i % 3 == 0) { Node *drop = list; list = list->next; delete drop; }
        if (i % 50 == 0) {
            // pvalloc's block is whole pages, and a block's usable size is the program's.
            size_t asked = 1000 + n;
            char *pages = static_cast<char *>(pvalloc(asked));
            memset(pages, 4, (asked + 4095) / 4096 * 4096);
            char *usable = static_cast<char *>(malloc(n));
            memset(usable, 5, malloc_usable_size(usable));
            sum += (unsigned char)pages[4095] + (unsigned char)usable[n - 1];
            free(pages);
            free(usable);
        }
    }
    for (const std::string &w : words) sum += w.size();
    while (list) { Node *next = list->next; delete list; list = next; }
    keep(malloc(100));
    return sum;
}
int main() {
    char line[64];
    snprintf(line, sizeof line, "checksum %lu\n", work());
    say(line);
    return 0;
}
"#;

#[test]
fn a_correct_program_reports_no_error_in_any_mode() {
    let scratch = Scratch::new("guard_clean_cpp");
    let prog = scratch.compile_cpp("correct", CORRECT);
    let bare = run_bare(&scratch, &[prog.arg()], None);
    assert_success(&bare, "the program without memwarden");

    for (options, mode) in MODES {
        let run = run_guarded(&scratch, options, &[prog.arg()]);
        assert_eq!(
            (run.status(), run.stdout()),
            (0, bare.stdout_text()),
            "{options:?}; stderr:\n{}",
            run.stderr()
        );
        run.assert_no_error(mode);
        assert!(
            !run.stderr().contains("ERROR: memwarden"),
            "{}",
            run.stderr()
        );
    }
}

#[test]
fn the_sqlite3_shell_reports_no_error_in_any_mode() {
    let sqlite = "/usr/bin/sqlite3";
    if Command::new(sqlite).arg("-version").output().is_err() {
        return skip_or_fail("sqlite3");
    }
    let scratch = Scratch::new("guard_clean_sqlite");
    let script = scratch.write("script.sql", sql_script(3_000));
    let bare = run_bare(&scratch, &[sqlite, ":memory:"], Some(&script));
    assert_success(&bare, "sqlite3 without memwarden");

    for (options, mode) in MODES.into_iter().take(3) {
        let run = profile_with(
            &scratch,
            &[sqlite, ":memory:"],
            &RunOptions {
                options,
                stdin: Some(&script),
                ..Default::default()
            },
        );
        assert_success(&run.outcome, &format!("sqlite3 under {options:?}"));
        assert!(
            run.outcome.stdout == bare.stdout,
            "{options:?}: the output differs from the bare run"
        );
        let guards = common::guards::GuardReport::load(&run.dir);
        for p in &guards.processes {
            assert_eq!(
                (p.guard_mode.as_str(), p.error_count),
                (mode, 0),
                "{options:?}: {:#?}\nstderr:\n{}",
                p.errors,
                run.outcome.stderr_text()
            );
        }
    }
}

#[test]
fn numpy_reports_no_error_in_header_mode() {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if !python.is_file() {
        return skip_or_fail(".venv/bin/python (NumPy's virtualenv)");
    }
    let scratch = Scratch::new("guard_clean_numpy");
    let run = run_guarded(
        &scratch,
        &["--guard", "header"],
        &[
            python.to_str().expect("utf-8 path"),
            "-c",
            "import numpy; print(numpy.ones(10).sum())",
        ],
    );
    assert_eq!(
        (run.status(), run.stdout()),
        (0, "10.0\n".to_owned()),
        "stderr:\n{}",
        run.stderr()
    );
    run.assert_no_error("header");
}

#[test]
fn the_churn_benchmark_gives_the_same_output_in_every_mode() {
    // GIVEN the benchmark's churn (malloc, calloc, realloc, posix_memalign, free; 16 B to
    // 4 KiB; tens of thousands of blocks live), whose output is a checksum of what it read.
    let scratch = Scratch::new("guard_clean_churn");
    let churn_c = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/churn.c");
    let prog = scratch.compile("churn", &format!("#include \"{}\"\n", churn_c.display()));
    let calls = "200000";
    let bare = run_bare(&scratch, &[prog.arg(), calls], None);
    assert_success(&bare, "churn without memwarden");

    // Sampled mode at rates where guarded and plain blocks mix (realloc moves between them).
    let modes: [(&[&str], &str); 4] = [
        (&["--guard", "header"], "header"),
        (&["--guard", "page"], "page"),
        (&["--guard", "sampled"], "sampled"),
        (&["--guard", "sampled", "--sample-rate", "7"], "sampled"),
    ];
    for (options, mode) in modes {
        let run = run_guarded(&scratch, options, &[prog.arg(), calls]);
        assert_eq!(
            (run.status(), run.stdout()),
            (0, bare.stdout_text()),
            "{options:?}; stderr:\n{}",
            run.stderr()
        );
        run.assert_no_error(mode);
    }
}

#[test]
fn blocks_a_library_grew_before_memwarden_started_are_freed_without_an_error() {
    // GIVEN a library whose constructor (which runs before the preload's) makes a table and
    // grows it with realloc, and a program that grows it again and frees it: as GLib's hash
    // tables are at gdb's exit, which were reported as invalid frees.
    let scratch = Scratch::new("guard_clean_constructor");
    scratch.compile_with(
        "early_table.so",
        r#"
void **early_table;
void *blockers[16];
__attribute__((constructor)) static void make_early_table(void) {
    early_table = malloc(4 * sizeof(void *));
    for (int n = 8, i = 0; n <= 512; n *= 2, i++) {
        blockers[i] = malloc(24); /* right after the table: to grow, it must move */
        early_table = realloc(early_table, n * sizeof(void *));
    }
    free(blockers[0]);
}
"#,
        &["-shared", "-fPIC"],
    );
    let library = scratch.path().join("mwt_early_table.so");
    let prog = scratch.compile_with(
        "early_table_user",
        r#"
extern void **early_table;
int main(void) {
    early_table = realloc(early_table, 4096 * sizeof(void *));
    free(early_table);
    say("freed\n");
    return 0;
}
"#,
        // Linked by path, before the program's object: kept, though nothing before it needs it.
        &["-Wl,--no-as-needed", library.to_str().expect("UTF-8 path")],
    );
    for (options, mode) in MODES.into_iter().take(3) {
        let run = run_guarded(&scratch, options, &[prog.arg()]);
        assert_eq!(
            (run.status(), run.stdout()),
            (0, "freed\n".to_owned()),
            "{options:?}; stderr:\n{}",
            run.stderr()
        );
        run.assert_no_error(mode);
    }
}
