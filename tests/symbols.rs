//! Stacks are unwound through code without frame pointers (DWARF CFI) and symbolized to
//! the exact function, file, line and module of each call; `--max-depth` bounds them.

mod common;
use common::*;

/// GIVEN main → middle → leaf → malloc, and main → recurse ×10 → malloc, each call on a
/// line with a marker comment.
const CALLS: &str = r#"
NOINLINE void *leaf(void) {
    void *p = malloc(424242); /* LEAF_MALLOC */
    keep(p);
    return p;
}
NOINLINE void *middle(void) {
    void *p = leaf(); /* MIDDLE_CALLS_LEAF */
    keep(p);
    return p;
}
NOINLINE void *recurse(int n) {
    if (n == 0) {
        void *p = malloc(515151); /* RECURSE_MALLOC */
        keep(p);
        return p;
    }
    void *p = recurse(n - 1); /* RECURSE_CALLS_ITSELF */
    keep(p);
    return p;
}
int main(void) {
    void *a = middle(); /* MAIN_CALLS_MIDDLE */
    void *b = recurse(9); /* MAIN_CALLS_RECURSE */
    say("done\n");
    free(a);
    free(b);
    return 0;
}
"#;

/// The stack that allocated exactly `bytes`.
fn stack_of(p: &Process, bytes: u64) -> &Stack {
    let found: Vec<&Stack> = p
        .stacks
        .iter()
        .filter(|s| s.allocated_bytes == bytes)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one stack allocated {bytes} bytes\n{}",
        p.describe()
    );
    found[0]
}

#[test]
fn frames_name_the_function_file_line_and_module_of_each_call() {
    let scratch = Scratch::new("symbols");
    let prog = scratch.compile("symbols", CALLS);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    let leaf = stack_of(p, 424242);
    let expected = vec![
        ("leaf".to_owned(), prog.line_of("LEAF_MALLOC")),
        ("middle".to_owned(), prog.line_of("MIDDLE_CALLS_LEAF")),
        ("main".to_owned(), prog.line_of("MAIN_CALLS_MIDDLE")),
    ];
    assert_eq!(leaf.program_lines(), expected, "{:#?}", leaf.frames);
    for frame in leaf.frames.iter().filter(|f| f.in_test_program()) {
        let file = frame.file.as_deref().unwrap_or("");
        assert_eq!(
            report::basename(file),
            format!("{}.c", prog.name()),
            "{frame:?}"
        );
        assert_eq!(
            frame.module.as_deref(),
            Some(prog.arg()),
            "the module is the program's path: {frame:?}"
        );
    }
    let deep = stack_of(p, 515151);
    let mut expected = vec![("recurse".to_owned(), prog.line_of("RECURSE_MALLOC"))];
    expected.extend((0..9).map(|_| ("recurse".to_owned(), prog.line_of("RECURSE_CALLS_ITSELF"))));
    expected.push(("main".to_owned(), prog.line_of("MAIN_CALLS_RECURSE")));
    assert_eq!(deep.program_lines(), expected, "{:#?}", deep.frames);
}

#[test]
fn the_innermost_frame_is_the_caller_of_malloc_not_the_profiler() {
    let scratch = Scratch::new("symbols_top");
    let prog = scratch.compile("symbols_top", CALLS);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let leaf = stack_of(run.report.only_process(), 424242);
    assert_eq!(
        leaf.frames[0].function.as_deref(),
        Some("leaf"),
        "{:#?}",
        leaf.frames
    );
    assert_eq!(leaf.frames[0].line, Some(prog.line_of("LEAF_MALLOC")));
}

#[test]
fn max_depth_bounds_the_frames_kept() {
    let scratch = Scratch::new("symbols_depth");
    let prog = scratch.compile("symbols_depth", CALLS);

    let run = profile_with(
        &scratch,
        &[prog.arg()],
        &RunOptions {
            options: &["--max-depth", "4"],
            ..Default::default()
        },
    );

    assert_success(&run.outcome, "memwarden run --max-depth 4");
    let p = run.report.only_process();
    let deep = stack_of(p, 515151);
    assert!(
        !deep.frames.is_empty() && deep.frames.len() <= 4,
        "{:#?}",
        deep.frames
    );
    let frames = deep.program_lines();
    assert!(!frames.is_empty(), "{:#?}", deep.frames);
    assert!(
        frames.iter().all(|(f, _)| f == "recurse"),
        "the innermost frames are kept: {frames:?}"
    );
    assert_eq!(
        p.at_peak("recurse"),
        515151,
        "figures are exact whatever the depth\n{}",
        p.describe()
    );
}

/// GIVEN C++ allocations with `new` in a static member function of a class in a namespace
/// and in a function template.
const CPP: &str = r#"
#include <new>
namespace shapes {
struct Widget {
    char data[1000];
};
class Factory {
  public:
    NOINLINE static Widget *build(unsigned long n) { return new Widget[n]; }
};
} // namespace shapes
template <typename T> NOINLINE T *make_many(unsigned long n) { return new T[n]; }
int main() {
    keep(shapes::Factory::build(3));
    keep(make_many<double>(1000));
    say("built\n");
    return 0;
}
"#;

/// What binutils' c++filt makes of `symbol`.
fn cxxfilt(symbol: &str) -> String {
    let out = std::process::Command::new("c++filt")
        .arg(symbol)
        .output()
        .expect("run c++filt (binutils)");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

#[test]
fn cpp_new_is_counted_and_functions_are_demangled() {
    let scratch = Scratch::new("symbols_cpp");
    let prog = scratch.compile_cpp("cpp", CPP);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    let build = cxxfilt("_ZN6shapes7Factory5buildEm");
    let make_many = cxxfilt("_Z9make_manyIdEPT_m");
    assert_eq!(
        build, "shapes::Factory::build(unsigned long)",
        "c++filt's own answer"
    );
    assert_eq!(
        p.live(&build),
        3000,
        "operator new[] goes through malloc\n{}",
        p.describe()
    );
    assert_eq!(p.allocations(&build), 1, "{}", p.describe());
    assert_eq!(p.live(&make_many), 8000, "{make_many}\n{}", p.describe());
}
