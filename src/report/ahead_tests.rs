//! Tests of the report taking up what the look-ahead made while the run went on: the same
//! report as without it, whatever was or was not resolvable at the time.

use std::fs;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use memwarden_abi::python::{python_frame, NUMPY_DATA, PYMALLOC_ARENAS};

use super::*;
use crate::profile::load_dir;
use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticCode, SyntheticModule};
use crate::report::{generate, generate_loaded, Options};

const APP: u64 = 0x10000;
const PYTHON: u64 = 0x30000;
const PROFILER: u64 = 0x50000;

fn module(path: &str, start: u64) -> SyntheticModule {
    SyntheticModule {
        end: start + 0x10000,
        ..SyntheticModule::at(path, start, 0)
    }
}

fn code(name: &str, first_line: i32) -> SyntheticCode {
    SyntheticCode {
        filename: "/w/script.py".into(),
        name: name.into(),
        qualname: name.into(),
        first_line,
        // Units 0–1 on the first line, 2–3 two lines further.
        line_table: vec![0x80 | (10 << 3) | 1, 0, 0, 0x80 | (12 << 3) | 1, 0, 0],
    }
}

/// A process of native frames in a module without symbols, the interpreter's frames,
/// Python frames, the profiler's own frame, markers, and a word in no module.
fn builder() -> ProfileBuilder {
    let mut figures = stack_record();
    (figures.live_bytes, figures.live_blocks) = (100, 1);
    (figures.allocated_bytes, figures.allocations) = (100, 1);
    ProfileBuilder::new(7)
        .argv(&["python3", "script.py"])
        .heap(500, 500)
        .module(module("/nonexistent/libapp.so", APP))
        .module(module("/nonexistent/libpython3.11.so.1.0", PYTHON))
        .module(module("/opt/mw/libmemwarden.so", PROFILER))
        .python_code(code("work", 10))
        .python_code(code("<module>", 1))
        .stack(
            &[
                APP + 0x10,
                PYTHON + 0x10,
                python_frame(0, 1, false),
                PYTHON + 0x20,
                python_frame(1, 3, false),
            ],
            figures,
        )
        .stack(
            &[
                NUMPY_DATA,
                APP + 0x20,
                python_frame(0, 2, false),
                python_frame(1, 0, false),
            ],
            figures,
        )
        .stack(&[PROFILER + 0x10, APP + 0x30], figures)
        .stack(&[PYMALLOC_ARENAS], figures)
        .stack(&[0x90_0000, APP + 0x40], figures)
}

fn write(dir: &Path, builder: &ProfileBuilder) {
    fs::create_dir_all(dir.join("raw")).unwrap();
    fs::write(dir.join("raw").join("7-1.mwp"), builder.build()).unwrap();
}

/// What the look-ahead makes of `dir` in one look.
fn look_once(dir: &Path) -> (Symbolizer, Ahead) {
    let mut ahead = LookAhead::new(dir, Symbolizer::new());
    assert_eq!(ahead.look(&AtomicBool::new(false)), Some(Found::NewStacks));
    ahead.into_parts()
}

/// The report of `dir` taking up `ahead`: report.json's text and the summary.
fn report_taking_up(dir: &Path, (mut symbolizer, ahead): (Symbolizer, Ahead)) -> (String, String) {
    let mut loaded = load_dir(dir).unwrap();
    let done = generate_loaded(
        dir,
        &mut loaded,
        &Options::default(),
        &mut symbolizer,
        ahead,
    )
    .unwrap();
    (
        fs::read_to_string(dir.join("report.json")).unwrap(),
        done.summary,
    )
}

/// The report of `dir` made from scratch.
fn report_alone(dir: &Path) -> (String, String) {
    let done = generate(dir, &Options::default()).unwrap();
    (
        fs::read_to_string(dir.join("report.json")).unwrap(),
        done.summary,
    )
}

#[test]
fn the_report_taking_up_the_look_ahead_is_the_report_made_alone() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &builder());
    let ahead = look_once(dir.path());
    // Every stack but the one with a word in no module was picked ahead.
    assert_eq!(ahead.1.stacks_picked(), 4);

    let (json, summary) = report_taking_up(dir.path(), ahead);
    assert_eq!((json, summary.clone()), report_alone(dir.path()));
    // The module without symbols is warned about once, though only the look-ahead
    // symbolized its words.
    assert_eq!(
        summary
            .matches("no symbols for /nonexistent/libapp.so")
            .count(),
        1
    );
}

#[test]
fn stacks_resolvable_only_later_are_left_to_the_report() {
    // GIVEN a code record unpublished, and a module not yet recorded, at the look.
    let dir = tempfile::tempdir().unwrap();
    let finished = builder().module(module("/nonexistent/liblate.so", 0x90_0000));
    let mut running = builder();
    running.codes[1].published = 0;
    write(dir.path(), &running);
    let ahead = look_once(dir.path());
    assert_eq!(ahead.1.stacks_picked(), 2, "only the stacks without either");

    // WHEN the process finishes with them, THEN the report is the same as made alone.
    write(dir.path(), &finished);
    assert_eq!(
        report_taking_up(dir.path(), ahead),
        report_alone(dir.path())
    );
}

#[test]
fn a_profile_whose_modules_overlap_is_reported_alone() {
    // GIVEN a library loaded over another's addresses after the look: the finished
    // profile resolves the words there in it.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &builder());
    let ahead = look_once(dir.path());
    let reloaded = builder().module(module("/nonexistent/libother.so", APP + 0x8));
    write(dir.path(), &reloaded);

    // THEN nothing the look-ahead made is taken up: the report is the one made alone.
    let (json, summary) = report_taking_up(dir.path(), ahead);
    assert!(json.contains("libother.so"), "{json}");
    assert_eq!((json, summary), report_alone(dir.path()));
}
