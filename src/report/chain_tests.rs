//! Tests of the chains the summary shows: allocator frames skipped, Python stacks from
//! their innermost line, the program's own frame after library code, and stacks that
//! show the same chain taken together.

use proptest::prelude::*;

use super::*;
use crate::report::json::StackReport;
use crate::report::test_report::{function_frame, intern, process_report, python_frame};

const PANDAS: &str = "/venv/lib/python3.11/site-packages/pandas/core/take.py";
const STDLIB: &str = "/usr/lib/python3.11/json/decoder.py";
const OWN: &str = "/home/ana/etl/load.py";

fn natives(names: &[&str]) -> Vec<FrameReport> {
    names.iter().map(|n| function_frame(n)).collect()
}

#[test]
fn chains_skip_allocator_plumbing_but_never_show_nothing() {
    assert_eq!(
        chain(&natives(&[
            "__rust_alloc",
            "alloc::raw_vec::finish_grow",
            "app::load",
            "app::main",
            "main",
            "start"
        ])),
        "app::load <- app::main <- main"
    );
    assert_eq!(chain(&natives(&["malloc"])), "malloc");
    assert_eq!(chain(&[]), "(no frames)");
}

#[test]
fn library_code_is_followed_by_the_programs_own_innermost_frame() {
    // GIVEN NumPy's allocator under four frames of pandas, then the program's own lines.
    let mut frames = natives(&["PyDataMem_UserNEW", "PyArray_NewFromDescr_int"]);
    frames.extend((1..=4).map(|line| python_frame(PANDAS, line, "take")));
    frames.push(python_frame(OWN, 40, "load"));
    frames.push(python_frame(OWN, 90, "<module>"));
    // THEN the chain is three pandas lines, then the program's line with a gap marked.
    assert_eq!(
        chain(&frames),
        "take.py:1 (take) <- take.py:2 (take) <- take.py:3 (take) <- … <- load.py:40 (load)"
    );
    // With the program's line right after the three, no gap.
    frames.remove(5);
    assert_eq!(
        chain(&frames),
        "take.py:1 (take) <- take.py:2 (take) <- take.py:3 (take) <- load.py:40 (load)"
    );
    // A chain that shows the program's code already gets nothing more.
    let mine = vec![
        python_frame(OWN, 7, "parse"),
        python_frame(PANDAS, 1, "read"),
    ];
    assert_eq!(chain(&mine), "load.py:7 (parse) <- take.py:1 (read)");
    // Nor does a native stack, or a Python stack with no code of the program's.
    assert_eq!(chain(&natives(&["a", "b", "c", "d"])), "a <- b <- c");
    let library = vec![
        python_frame(STDLIB, 1, "decode"),
        python_frame(STDLIB, 2, "x"),
    ];
    assert_eq!(chain(&library), "decoder.py:1 (decode) <- decoder.py:2 (x)");
}

#[test]
fn a_place_is_the_chains_first_frame_alone() {
    let frames = [
        function_frame("malloc"),
        python_frame(PANDAS, 1, "take"),
        python_frame(OWN, 40, "load"),
    ];
    let frames: Vec<&FrameReport> = frames.iter().collect();
    assert_eq!(place_of(&frames), "take.py:1 (take)");
    assert_eq!(place_of(&[]), "(no frames)");
}

#[test]
fn library_files_are_the_interpreters_folders_and_frozen_modules() {
    for library in [
        STDLIB,
        PANDAS,
        "/usr/lib/python3/dist-packages/apt/cache.py",
        "/opt/py/lib64/python3.13t/os.py",
        "<frozen importlib._bootstrap>",
    ] {
        assert!(is_library_file(library), "{library}");
    }
    for own in [
        OWN,
        "<string>",
        "<stdin>",
        "/home/ana/lib/python-tools/run.py",
        "/srv/lib/python3.x/app.py",
        "job.py",
    ] {
        assert!(!is_library_file(own), "{own}");
    }
}

#[test]
fn stacks_with_the_same_library_chain_and_other_own_lines_stay_apart() {
    let mut p = process_report(3, &["python3", "load.py"]);
    let stack = |p: &mut ProcessReport, id: u32, own_line: u32, bytes: u64| {
        let frames = [
            python_frame(PANDAS, 1, "take"),
            python_frame(PANDAS, 2, "take"),
            python_frame(PANDAS, 3, "take"),
            python_frame(OWN, own_line, "load"),
        ];
        StackReport {
            frames: frames.into_iter().map(|f| intern(p, f)).collect(),
            ..crate::report::test_report::stack_report(p, id, &[], bytes, 0, bytes)
        }
    };
    p.stacks = vec![
        stack(&mut p, 1, 40, 100),
        stack(&mut p, 2, 41, 300),
        stack(&mut p, 3, 40, 50),
    ];
    let top = top_at_peak(&p, 5);
    let lines: Vec<(u64, &str)> = top.iter().map(|(b, t)| (*b, t.as_str())).collect();
    assert_eq!(
        lines,
        [
            (
                300,
                "take.py:1 (take) <- take.py:2 (take) <- take.py:3 (take) <- load.py:41 (load)"
            ),
            (
                150,
                "take.py:1 (take) <- take.py:2 (take) <- take.py:3 (take) <- load.py:40 (load)"
            ),
        ]
    );
}

/// A frame of a small pool, so that stacks share frames and labels: native ones (some
/// the allocator's, two at different addresses that read the same), library and own
/// Python lines.
fn pool_frame(choice: u8) -> FrameReport {
    match choice % 8 {
        0 => function_frame("malloc"),
        1 => function_frame("work"),
        2 => {
            let mut same_label = function_frame("work");
            same_label.address = Some("0x2000".into());
            same_label
        }
        3 => function_frame("main"),
        4 => python_frame(PANDAS, 1, "take"),
        5 => python_frame(STDLIB, 9, "decode"),
        6 => python_frame(OWN, 40, "load"),
        _ => python_frame(OWN, 41, "load"),
    }
}

proptest! {
    /// The list of stacks at the peak shows each chain once, with the sum of the bytes of
    /// every stack `chain_of` shows that way: the keys it merges by are exactly the texts.
    #[test]
    fn the_top_list_sums_stacks_by_the_text_of_their_chain(
        stacks in prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 0..8), 1u64..1000),
            1..30,
        )
    ) {
        let mut p = process_report(1, &["x"]);
        let mut expected: HashMap<String, u64> = HashMap::new();
        for (id, (choices, bytes)) in stacks.into_iter().enumerate() {
            let frames: Vec<FrameReport> = choices.into_iter().map(pool_frame).collect();
            *expected.entry(chain(&frames)).or_default() += bytes;
            let stack = StackReport {
                frames: frames.into_iter().map(|f| intern(&mut p, f)).collect(),
                ..crate::report::test_report::stack_report(&mut p, id as u32, &[], bytes, 0, bytes)
            };
            p.stacks.push(stack);
        }
        let top = top_at_peak(&p, usize::MAX);
        prop_assert_eq!(top.len(), expected.len());
        for (bytes, text) in &top {
            prop_assert_eq!(expected.get(text), Some(bytes), "{}", text);
        }
        prop_assert!(top.windows(2).all(|pair| pair[0].0 >= pair[1].0));
    }
}
