//! Tests of the report of a Python process on a synthetic output folder: Python frames in
//! report.json and the collapsed stacks, each stack's category, the NumPy figures, the
//! NumPy flame graph and the summary.

use std::fs;

use memwarden_abi::python::{category, python_frame, NUMPY_DATA};
use memwarden_abi::MODULE_MAIN;
use serde_json::json;

use super::*;
use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticCode, SyntheticModule};
use crate::report::read::parse_with_frames_inlined;

const PYTHON: u64 = 0x1000_0000;
const PROFILER: u64 = 0x4000_0000;
const NUMPY: u64 = 0x5000_0000;

fn live(bytes: i64, blocks: i64) -> memwarden_abi::StackRecord {
    let mut record = stack_record();
    (record.live_bytes, record.live_blocks) = (bytes, blocks);
    (
        record.max_live_bytes,
        record.allocated_bytes,
        record.allocations,
    ) = (bytes, bytes as u64, blocks as u64);
    record
}

/// `python3 script.py`: `make()` (line 5) made an 8,000,000-byte array, `<module>` (line 9)
/// a list the interpreter allocated, and libc something of its own; all live at the end.
fn write_python_run(dir: &std::path::Path) {
    let mut array = live(8_000_000, 1);
    array.category = category::NUMPY;
    let code = |qualname: &str, first_line, line_table| SyntheticCode {
        filename: "/work/script.py".into(),
        name: qualname.into(),
        qualname: qualname.into(),
        first_line,
        line_table,
    };
    // Code unit 0 at the first line, units 1–2 one line further.
    let make_table = vec![0x80 | (10 << 3), 0, 0, 0x80 | (11 << 3) | 1, 0, 0];
    let profile = ProfileBuilder::new(4242)
        .argv(&["python3", "script.py"])
        .python_version(0x030b_07f0)
        .heap(8_001_064, 0)
        .module(SyntheticModule::at(
            "/usr/bin/python3.11",
            PYTHON,
            MODULE_MAIN,
        ))
        .module(SyntheticModule::at("/opt/libmemwarden.so", PROFILER, 0))
        .module(SyntheticModule::at("/np/_multiarray_umath.so", NUMPY, 0))
        .python_code(code("make", 4, make_table))
        .python_code(code("<module>", 1, vec![]))
        .stack(
            &[
                NUMPY_DATA,
                PROFILER + 0x10,
                NUMPY + 0x20,
                python_frame(0, 2, false),
                PYTHON + 0x30,
                python_frame(1, 9, true),
                PYTHON + 0x40,
            ],
            array,
        )
        .stack(
            &[PYTHON + 0x50, python_frame(1, 9, true), PYTHON + 0x40],
            live(1000, 1),
        )
        .stack(&[0x7000], live(64, 1));
    let raw = dir.join("raw");
    fs::create_dir_all(&raw).unwrap();
    fs::write(raw.join("4242-1.mwp"), profile.build()).unwrap();
}

#[test]
fn python_frames_categories_and_numpy_figures_reach_every_output() {
    let dir = tempfile::tempdir().unwrap();
    write_python_run(dir.path());
    let done = generate(dir.path(), &Options::default()).unwrap();

    let json: serde_json::Value =
        parse_with_frames_inlined(&fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    let p = &json["processes"][0];
    assert_eq!(p["python_version"], "3.11.7");
    assert_eq!(
        p["numpy"],
        json!({"peak_bytes": 8_000_000, "peak_blocks": 1,
               "not_freed_bytes": 8_000_000, "not_freed_blocks": 1})
    );
    let stacks = p["stacks"].as_array().unwrap();
    let categories: Vec<_> = stacks.iter().map(|s| s["category"].clone()).collect();
    assert_eq!(
        categories,
        [json!("numpy"), json!("python"), json!("native")]
    );
    let make = json!({"function": "make", "file": "/work/script.py", "line": 5,
        "module": null, "address": null, "inlined": false, "kind": "python"});
    let module = json!({"function": "<module>", "file": "/work/script.py", "line": 9,
        "module": null, "address": null, "inlined": false, "kind": "python"});
    assert_eq!(
        stacks[0]["frames"],
        json!([
            {"function": null, "file": null, "line": null, "module": "/np/_multiarray_umath.so",
             "address": "0x50000020", "inlined": false, "kind": "native"},
            make,
            module,
        ])
    );
    assert_eq!(stacks[1]["frames"][1], module);

    let numpy = fs::read_to_string(dir.path().join("numpy-peak.folded")).unwrap();
    assert_eq!(
        numpy,
        "pid 4242: python3 script.py;script.py:9 (<module>);script.py:5 (make);0x50000020 [_multiarray_umath.so] 8000000\n"
    );
    let peak = fs::read_to_string(dir.path().join("peak.folded")).unwrap();
    assert!(
        peak.contains(
            "pid 4242: python3 script.py;script.py:9 (<module>);0x10000050 [python3.11] 1000\n"
        ),
        "{peak}"
    );
    let svg = fs::read_to_string(dir.path().join("numpy-peak.svg")).unwrap();
    assert!(svg.contains("script.py:5 (make)"), "{svg}");

    assert!(
        done.summary.contains("  numpy        7.6 MiB (8,000,000 bytes) of array data at the peak in 1 array; 7.6 MiB (8,000,000 bytes) not freed\n"),
        "{}",
        done.summary
    );
    assert!(done
        .summary
        .contains("script.py:5 (make) <- script.py:9 (<module>)"));
    assert!(done
        .summary
        .contains("allocated.svg, numpy-peak.svg (and .folded)"));
}

#[test]
fn without_numpy_data_the_numpy_graph_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw");
    fs::create_dir_all(&raw).unwrap();
    let profile = ProfileBuilder::new(1)
        .argv(&["prog"])
        .heap(64, 0)
        .stack(&[0x7000], live(64, 1));
    fs::write(raw.join("1.mwp"), profile.build()).unwrap();
    let done = generate(dir.path(), &Options::default()).unwrap();
    let svg = fs::read_to_string(dir.path().join("numpy-peak.svg")).unwrap();
    assert!(svg.contains("No NumPy array data was live at any peak"));
    assert!(!done.summary.contains("numpy"));
    let p = &done.report.processes[0];
    assert_eq!(p.numpy, crate::python::NumpyFigures::default());
    assert_eq!(p.python_version, None);
}
