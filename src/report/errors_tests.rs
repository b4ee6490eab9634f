//! Tests of the heap errors in report.json: every field of an error, symbolized stacks,
//! null for unknown ones, the guard mode and the count, on a synthetic output folder.

use std::fs;

use memwarden_abi::{error_kind, guard_mode, ErrorRecord};

use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticModule};
use crate::report::read::parse_with_frames_inlined;
use crate::report::{generate, Options};

#[test]
fn errors_are_reported_with_their_stacks_mode_and_count() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw");
    fs::create_dir_all(&raw).unwrap();
    let mut builder = ProfileBuilder::new(400)
        .argv(&["prog"])
        .guard_mode(guard_mode::HEADER)
        .module(SyntheticModule {
            path: "/t/prog".into(),
            base: 0x4000,
            start: 0x5000,
            end: 0x6000,
            ..SyntheticModule::default()
        })
        .stack(&[0x5010, 0x5020], stack_record())
        .stack(&[0x5030], stack_record())
        .stack(&[0x5040], stack_record())
        .error(ErrorRecord {
            kind: error_kind::USE_AFTER_FREE,
            stack: 1,
            address: 0x7f00_0000_0108,
            block_size: 100,
            offset: 8,
            alloc_stack: 2,
            free_stack: 3,
            time_ns: 2_500_000,
        })
        .error(ErrorRecord {
            kind: error_kind::HEAP_BUFFER_UNDERFLOW,
            stack: 0,
            address: 0x10,
            block_size: 13,
            offset: -1,
            alloc_stack: 2,
            free_stack: 0,
            time_ns: 3_000_000,
        });
    builder.header.error_count = 3;
    fs::write(raw.join("400-1.mwp"), builder.build()).unwrap();

    let done = generate(dir.path(), &Options::default()).unwrap();

    let json: serde_json::Value =
        parse_with_frames_inlined(&fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    let p = &json["processes"][0];
    let frame = |address: &str| {
        serde_json::json!({"function": null, "file": null, "line": null,
            "module": "/t/prog", "address": address, "inlined": false, "kind": "native"})
    };
    assert_eq!(p["guard_mode"], "header");
    assert_eq!(p["error_count"], 3);
    assert_eq!(
        p["errors"],
        serde_json::json!([
            {"kind": "heap-use-after-free", "address": "0x7f0000000108", "block_size": 100,
             "offset": 8, "stack": [frame("0x5010"), frame("0x5020")],
             "alloc_stack": [frame("0x5030")], "free_stack": [frame("0x5040")],
             "time_ms": 2.5, "pid": 400},
            {"kind": "heap-buffer-underflow", "address": "0x10", "block_size": 13,
             "offset": -1, "stack": null, "alloc_stack": [frame("0x5030")],
             "free_stack": null, "time_ms": 3.0, "pid": 400},
        ])
    );
    // Stacks interned only for errors have no figures, so they are not in `stacks`.
    assert_eq!(p["stacks"], serde_json::json!([]));
    assert_eq!(done.report.processes[0].error_count, 3);
    assert!(
        done.summary.contains(
            "  guard        header mode, 3 heap errors\n\
             ERROR: memwarden: heap-use-after-free on address 0x7f0000000108 in pid 400\n\
             \x20 at  0x5010 [prog] <- 0x5020 [prog]\n\
             \x20 0x7f0000000108 is located 8 bytes inside the 100-byte block allocated at\n\
             \x20     0x5030 [prog]\n\
             \x20 freed at\n\
             \x20     0x5040 [prog]\n\
             SUMMARY: memwarden: heap-use-after-free at 0x5010 [prog]\n\
             ERROR: memwarden: heap-buffer-underflow on address 0x10 in pid 400\n\
             \x20 at  [unknown stack]\n\
             \x20 0x10 is located 1 byte before the 13-byte block allocated at\n"
        ),
        "{}",
        done.summary
    );
    assert!(
        done.summary.ends_with("memwarden: 3 heap errors found\n"),
        "{}",
        done.summary
    );
}

#[test]
fn without_guards_the_mode_is_none_and_nothing_is_said() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("raw")).unwrap();
    fs::write(
        dir.path().join("raw/1.mwp"),
        ProfileBuilder::new(1).argv(&["true"]).build(),
    )
    .unwrap();
    let done = generate(dir.path(), &Options::default()).unwrap();
    let json: serde_json::Value =
        parse_with_frames_inlined(&fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    let p = &json["processes"][0];
    assert_eq!(
        (&p["guard_mode"], &p["error_count"], &p["errors"]),
        (
            &serde_json::json!("none"),
            &serde_json::json!(0),
            &serde_json::json!([])
        )
    );
    assert!(!done.summary.contains("guard"), "{}", done.summary);
    assert!(!done.summary.contains("heap error"), "{}", done.summary);
}
