//! Every interposed entry point keeps glibc's semantics under the profiler (the C program
//! checks them itself), and is counted, including `malloc` reached through `dlsym` and
//! Python's `ctypes`.

mod common;
use common::*;

/// Checks glibc's semantics of each entry point; prints "FAIL: ..." and exits 1 on the
/// first broken one. Blocks whose figures the test asserts are made in named functions.
const SEMANTICS: &str = r#"
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
static int failures;
static void check(int ok, const char *what) {
    if (!ok) {
        ssize_t r = write(2, "FAIL: ", 6);
        r = write(2, what, strlen(what));
        r = write(2, "\n", 1);
        (void)r;
        failures++;
    }
}
/* Opaque to the compiler, so that it neither warns about nor folds the overflows. */
static volatile size_t huge = SIZE_MAX / 2;
static int aligned(void *p, size_t a) { return p != NULL && (uintptr_t)p % a == 0; }
void *zero_kept;
NOINLINE void zero_alloc(void) {
    void *p = malloc(0), *q = malloc(0);
    check(p != NULL && q != NULL, "malloc(0) returns a pointer");
    check(p != q, "malloc(0) returns unique pointers");
    free(q);
    zero_kept = p;
}
NOINLINE void realloc_null(void) {
    void *p = realloc(NULL, 3333);
    check(p != NULL, "realloc(NULL, n) allocates");
    keep(p);
}
NOINLINE void realloc_zero(void) {
    void *p = malloc(4444);
    check(p != NULL, "malloc(4444)");
    check(realloc(p, 0) == NULL, "realloc(p, 0) frees p and returns NULL");
}
NOINLINE void calloc_overflow(void) {
    errno = 0;
    check(calloc(huge, 4) == NULL, "calloc overflow returns NULL");
    check(errno == ENOMEM, "calloc overflow sets ENOMEM");
}
NOINLINE void calloc_zeroes(void) {
    unsigned char *p = malloc(2000);
    for (int i = 0; i < 2000; i++) p[i] = 0xab;
    free(p);
    unsigned char *q = calloc(1, 2000), *big = calloc(1000, 1000);
    int zero = q != NULL && big != NULL;
    for (int i = 0; zero && i < 2000; i++) zero = q[i] == 0;
    for (int i = 0; zero && i < 1000 * 1000; i++) zero = big[i] == 0;
    check(zero, "calloc returns zeroed memory");
    free(q);
    free(big);
}
NOINLINE void reallocarray_checks(void) {
    void *p = malloc(16);
    errno = 0;
    void *q = reallocarray(p, huge, 4);
    check(q == NULL, "reallocarray overflow returns NULL");
    check(errno == ENOMEM, "reallocarray overflow sets ENOMEM");
    free(q ? q : p); /* a failed reallocarray leaves p allocated */
    keep(reallocarray(NULL, 100, 7));
}
NOINLINE void posix_memalign_checks(void) {
    size_t bad[] = {0, 1, 2, 3, 4, 31, 33, 4095, 4097, (size_t)-1};
    size_t good[] = {8, 16, 32, 4096, 4 * MiB, 16 * MiB};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *p = NULL;
        check(posix_memalign(&p, bad[i], 64) == EINVAL, "posix_memalign: EINVAL for a bad alignment");
    }
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        void *p = NULL;
        check(posix_memalign(&p, good[i], 64) == 0, "posix_memalign succeeds for a good alignment");
        check(aligned(p, good[i]), "posix_memalign honours the alignment");
        free(p);
    }
}
NOINLINE void free_checks(void) {
    free(NULL);
    void *small = malloc(10), *large = malloc(4 * MiB);
    errno = 1234;
    free(small);
    check(errno == 1234, "free preserves errno (small block)");
    free(large);
    check(errno == 1234, "free preserves errno (large block)");
    errno = 0;
}
NOINLINE void usable_size_checks(void) {
    void *p = malloc(1000);
    check(malloc_usable_size(p) >= 1000, "malloc_usable_size >= requested");
    check(malloc_usable_size(NULL) == 0, "malloc_usable_size(NULL) == 0");
    free(p);
}
NOINLINE void alignment_checks(void) {
    void *a = aligned_alloc(4096, 8192), *m = memalign(512, 1000), *v = valloc(100), *pv = pvalloc(4096);
    check(aligned(a, 4096), "aligned_alloc honours the alignment");
    check(aligned(m, 512), "memalign honours the alignment");
    check(aligned(v, 4096), "valloc returns a page");
    check(aligned(pv, 4096), "pvalloc returns a page");
    free(a);
    free(m);
    free(v);
    free(pv);
}
typedef void *(*malloc_fn)(size_t);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void (*free_fn)(void *);
NOINLINE void *via_dlsym_default(void) {
    malloc_fn m = (malloc_fn)dlsym(RTLD_DEFAULT, "malloc");
    check(m != NULL, "dlsym(RTLD_DEFAULT, malloc)");
    return m ? m(777777) : NULL;
}
NOINLINE void *via_dlopen_libc(void *libc) {
    malloc_fn m = (malloc_fn)dlsym(libc, "malloc");
    check(m != NULL, "dlsym(libc, malloc)");
    return m ? m(888888) : NULL;
}
NOINLINE void *via_dlopen_calloc(void *libc) {
    calloc_fn c = (calloc_fn)dlsym(libc, "calloc");
    check(c != NULL, "dlsym(libc, calloc)");
    return c ? c(1, 555555) : NULL;
}
NOINLINE void dlsym_checks(void) {
    void *libc = dlopen("libc.so.6", RTLD_NOW);
    check(libc != NULL, "dlopen(libc.so.6)");
    keep(via_dlsym_default());
    free_fn f = libc ? (free_fn)dlsym(libc, "free") : NULL;
    check(f != NULL, "dlsym(libc, free)");
    void *p = libc ? via_dlopen_libc(libc) : NULL;
    if (f) f(p);
    keep(libc ? via_dlopen_calloc(libc) : NULL);
}
int main(void) {
    zero_alloc();
    realloc_null();
    realloc_zero();
    calloc_overflow();
    calloc_zeroes();
    reallocarray_checks();
    posix_memalign_checks();
    free_checks();
    usable_size_checks();
    alignment_checks();
    dlsym_checks();
    if (failures) return 1;
    say("all entry points behave\n");
    return 0;
}
"#;

#[test]
fn entry_points_keep_glibc_semantics_and_are_counted() {
    let scratch = Scratch::new("entry_points");
    let prog = scratch.compile("entry_points", SEMANTICS);
    let bare = run_bare(&scratch, &[prog.arg()], None);
    assert_success(&bare, "the semantics program without the profiler");

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "the semantics program under memwarden");
    assert_eq!(run.outcome.stdout_text(), "all entry points behave\n");
    let p = run.report.only_process();
    let d = p.describe();
    assert_eq!(
        p.live_blocks("zero_alloc"),
        1,
        "malloc(0) blocks are blocks\n{d}"
    );
    assert_eq!(p.live("zero_alloc"), 0, "{d}");
    assert_eq!(p.allocations("zero_alloc"), 2, "{d}");
    assert_eq!(p.live("realloc_null"), 3333, "{d}");
    assert_eq!(p.allocations("realloc_null"), 1, "{d}");
    assert_eq!(p.live("realloc_zero"), 0, "realloc(p, 0) freed p\n{d}");
    assert_eq!(p.live_blocks("realloc_zero"), 0, "{d}");
    assert_eq!(p.max_live("realloc_zero"), 4444, "{d}");
    assert_eq!(
        p.allocated("calloc_overflow"),
        0,
        "a failed calloc allocates nothing\n{d}"
    );
    assert_eq!(p.live_blocks("calloc_overflow"), 0, "{d}");
    assert_eq!(
        p.allocated("calloc_zeroes"),
        2000 + 2000 + 1000 * 1000,
        "{d}"
    );
    assert_eq!(p.live("reallocarray_checks"), 700, "{d}");
    assert_eq!(
        p.allocated("reallocarray_checks"),
        16 + 700,
        "the failed reallocarray allocates nothing\n{d}"
    );
    assert_eq!(
        p.allocations("posix_memalign_checks"),
        6,
        "only the good alignments allocate\n{d}"
    );
    assert_eq!(p.allocated("posix_memalign_checks"), 6 * 64, "{d}");
    assert_eq!(p.live("posix_memalign_checks"), 0, "{d}");
    assert_eq!(p.allocated("free_checks"), 10 + 4 * MIB, "{d}");
    assert_eq!(p.live("free_checks"), 0, "{d}");
    // pvalloc asks for a page multiple: its requested and rounded sizes agree.
    assert_eq!(
        p.allocated("alignment_checks"),
        8192 + 1000 + 100 + 4096,
        "{d}"
    );
    assert_eq!(p.live("alignment_checks"), 0, "{d}");
    // THEN calls through pointers from dlsym are seen and attributed to their caller.
    assert_eq!(
        p.allocated("via_dlsym_default"),
        777777,
        "dlsym(RTLD_DEFAULT)\n{d}"
    );
    assert_eq!(p.live("via_dlsym_default"), 777777, "{d}");
    assert_eq!(
        p.allocated("via_dlopen_libc"),
        888888,
        "dlsym(dlopen(libc.so.6))\n{d}"
    );
    assert_eq!(
        p.live("via_dlopen_libc"),
        0,
        "freed through dlsym'd free\n{d}"
    );
    assert_eq!(p.allocated("via_dlopen_calloc"), 555555, "{d}");
    assert_eq!(p.live("via_dlopen_calloc"), 555555, "{d}");
}

/// Runs `python3 -c` with a script that calls malloc(`bytes`) through `library` (a ctypes
/// expression) and keeps the block; returns the report's only process.
fn python_malloc(scratch: &Scratch, python: &str, library: &str, bytes: u64) -> Process {
    let script = format!(
        "import ctypes\n\
         lib = {library}\n\
         lib.malloc.restype = ctypes.c_void_p\n\
         lib.malloc.argtypes = [ctypes.c_size_t]\n\
         p = lib.malloc({bytes})\n\
         assert p\n\
         print('ctypes ok')\n"
    );
    let run = profile(scratch, &[python, "-c", &script]);
    assert_success(&run.outcome, "python3 under memwarden");
    assert_eq!(run.outcome.stdout_text(), "ctypes ok\n");
    let mut report = run.report;
    assert_eq!(report.processes.len(), 1, "{}", report.describe());
    report.processes.remove(0)
}

#[test]
fn python_ctypes_malloc_is_counted() {
    let Some(python) = python3() else {
        return skip_or_fail("python3");
    };
    let python = python.to_str().expect("utf-8 path");
    let scratch = Scratch::new("python_ctypes");
    // Each call gets a run of its own: seen from native code, calls made from the same
    // Python line through ctypes have identical stacks.
    for (library, bytes) in [
        ("ctypes.CDLL('libc.so.6')", 1234567),
        ("ctypes.CDLL(None)", 2345678),
    ] {
        let p = python_malloc(&scratch, python, library, bytes);
        assert!(
            p.stacks
                .iter()
                .any(|s| s.allocated_bytes == bytes && s.allocations == 1 && s.live_bytes == bytes),
            "{library}.malloc({bytes}): no stack with exactly that one allocation, still live; \
             {} stacks, total {} bytes",
            p.stacks.len(),
            p.totals.allocated_bytes
        );
    }
}

/// GIVEN a plug-in library that allocates 4,321 bytes per call in `plugin_block` and frees
/// the blocks it is given, opened by name (found through the program's RUNPATH) with
/// `RTLD_DEEPBIND`; the program hands it 100 of its own blocks to free and frees 100 of the
/// plug-in's.
const DEEPBIND_PLUGIN: &str = r#"
NOINLINE void *plugin_block(void) { return malloc(4321); }
void plugin_free(void *p) { free(p); }
"#;
const DEEPBIND_HOST: &str = r#"
#include <dlfcn.h>
NOINLINE void *host_block(void) { return malloc(1234); }
int main(void) {
    void *plugin = dlopen("mwt_deepbind_plugin.so", RTLD_NOW | RTLD_DEEPBIND);
    if (!plugin) { say(dlerror()); return 3; }
    void *(*make)(void) = (void *(*)(void))dlsym(plugin, "plugin_block");
    void (*release)(void *) = (void (*)(void *))dlsym(plugin, "plugin_free");
    if (!make || !release) return 4;
    for (int i = 0; i < 100; i++) {
        release(host_block());
        free(make());
    }
    say("exchanged\n");
    return 0;
}
"#;

#[test]
fn a_library_opened_with_deepbind_shares_blocks_with_the_program() {
    let scratch = Scratch::new("deepbind");
    scratch.compile_with("deepbind_plugin.so", DEEPBIND_PLUGIN, &["-shared", "-fPIC"]);
    let rpath = format!("-Wl,-rpath,{}", scratch.path().display());
    let host = scratch.compile_with("deepbind_host", DEEPBIND_HOST, &[&rpath]);

    let run = profile(&scratch, &[host.arg()]);

    assert_success(&run.outcome, "a program with a RTLD_DEEPBIND plug-in");
    assert_eq!(run.outcome.stdout_text(), "exchanged\n");
    assert!(
        run.outcome
            .stderr_text()
            .contains("opened with RTLD_DEEPBIND"),
        "{}",
        run.outcome.stderr_text()
    );
    let p = run.report.only_process();
    assert_eq!(p.allocated("plugin_block"), 100 * 4321, "{}", p.describe());
    assert_eq!(p.allocated("host_block"), 100 * 1234, "{}", p.describe());
    assert_eq!(
        p.live("plugin_block") + p.live("host_block"),
        0,
        "{}",
        p.describe()
    );
}
