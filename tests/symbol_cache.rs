//! Symbols are kept across runs in the cache folder (`MEMWARDEN_SYMBOL_CACHE`): a second
//! run of the same program reports the same frames from it, a rebuilt program is never
//! answered with the old one's lines, and `off` keeps nothing.

mod common;
use common::*;

/// GIVEN main → work → malloc, each call on a marked line.
const PROGRAM: &str = r#"
NOINLINE void *work(void) {
    void *p = malloc(313131); /* WORK_MALLOC */
    keep(p);
    return p;
}
int main(void) {
    void *p = work(); /* MAIN_CALLS_WORK */
    free(p);
    return 0;
}
"#;

/// `(function, line)` of the program's frames of the stack that allocated 313131 bytes.
fn work_frames(run: &Profiled) -> Vec<(String, u32)> {
    let p = run.report.only_process();
    let stack = p
        .stacks
        .iter()
        .find(|s| s.allocated_bytes == 313131)
        .unwrap_or_else(|| panic!("no stack allocated 313131 bytes\n{}", p.describe()));
    stack.program_lines()
}

fn cached_run(scratch: &Scratch, prog: &Program, cache: &str) -> Profiled {
    let run = profile_with(
        scratch,
        &[prog.arg()],
        &RunOptions {
            env: &[("MEMWARDEN_SYMBOL_CACHE", cache)],
            ..Default::default()
        },
    );
    assert_success(&run.outcome, "memwarden run");
    run
}

fn cache_files(folder: &std::path::Path) -> usize {
    std::fs::read_dir(folder).map_or(0, |listing| {
        listing
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sym"))
            })
            .count()
    })
}

#[test]
fn a_second_run_gets_the_same_frames_and_a_rebuilt_program_its_own() {
    let scratch = Scratch::new("symbol_cache");
    let cache = scratch.path().join("symbol-cache");
    let cache_arg = cache.to_str().unwrap();
    let prog = scratch.compile("symbol_cache", PROGRAM);
    let expected = vec![
        ("work".to_owned(), prog.line_of("WORK_MALLOC")),
        ("main".to_owned(), prog.line_of("MAIN_CALLS_WORK")),
    ];

    let cold = cached_run(&scratch, &prog, cache_arg);
    assert_eq!(work_frames(&cold), expected);
    let files = cache_files(&cache);
    assert!(files >= 1, "the program's file at least");

    let warm = cached_run(&scratch, &prog, cache_arg);
    assert_eq!(work_frames(&warm), expected);
    assert_eq!(
        cold.report.only_process().stacks.len(),
        warm.report.only_process().stacks.len()
    );

    // `memwarden report` of the same folder uses (and keeps) the cache too.
    let again = memwarden_cmd(&scratch, &["report", warm.dir.to_str().unwrap()]);
    assert_success(&again, "memwarden report");

    // The same program rebuilt with its lines moved: the lines of the new build.
    let moved = scratch.compile("symbol_cache", &format!("\n\n\n{PROGRAM}"));
    let rebuilt = cached_run(&scratch, &moved, cache_arg);
    assert_eq!(
        work_frames(&rebuilt),
        vec![
            ("work".to_owned(), moved.line_of("WORK_MALLOC")),
            ("main".to_owned(), moved.line_of("MAIN_CALLS_WORK")),
        ]
    );
    assert_eq!(
        moved.line_of("WORK_MALLOC"),
        prog.line_of("WORK_MALLOC") + 3
    );
    assert_eq!(
        cache_files(&cache),
        files + 1,
        "one more file: the new build's"
    );
}

#[test]
fn off_keeps_nothing() {
    let scratch = Scratch::new("symbol_cache_off");
    let prog = scratch.compile("symbol_cache_off", PROGRAM);
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let run = profile_with(
        &scratch,
        &[prog.arg()],
        &RunOptions {
            env: &[
                ("MEMWARDEN_SYMBOL_CACHE", "off"),
                ("HOME", home.to_str().unwrap()),
                ("XDG_CACHE_HOME", home.join(".cache").to_str().unwrap()),
            ],
            ..Default::default()
        },
    );
    assert_success(&run.outcome, "memwarden run");
    assert_eq!(work_frames(&run).len(), 2);
    assert!(!home.join(".cache").exists(), "nothing written under HOME");
}
