//! Tests of the Python part of the profile reader: code records, their blob spans, and the
//! Python frames that point to them.

use memwarden_abi::python::{line_table, python_frame, NUMPY_DATA};

use super::*;
use crate::profile::read_profile;
use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticCode};

fn make_code() -> SyntheticCode {
    SyntheticCode {
        filename: "/work/script.py".into(),
        name: "make".into(),
        qualname: "Maker.make".into(),
        first_line: 4,
        line_table: vec![0x80 | (10 << 3), 0, 0],
    }
}

fn error_of(builder: &ProfileBuilder) -> String {
    match read_profile(&builder.build()[..]) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn code_records_are_read_with_their_strings_and_line_tables() {
    let profile = ProfileBuilder::new(1)
        .python_version(0x030b_07f0)
        .python_code(make_code())
        .python_code(SyntheticCode {
            filename: "<stdin>".into(),
            name: "<module>".into(),
            qualname: "<module>".into(),
            first_line: 1,
            line_table: vec![],
        })
        .stack(
            &[
                NUMPY_DATA,
                0x1000,
                python_frame(0, 3, false),
                python_frame(1, 9, true),
            ],
            stack_record(),
        )
        .build_profile();
    assert_eq!(profile.python_version, 0x030b_07f0);
    assert_eq!(
        profile.python_code(0),
        Some(&PythonCode {
            filename: "/work/script.py".into(),
            name: "make".into(),
            qualname: "Maker.make".into(),
            first_line: 4,
            line_table_kind: line_table::LOCATIONS_311,
            line_table: vec![0x80 | (10 << 3), 0, 0],
        })
    );
    let module = profile.python_code(1).unwrap();
    assert_eq!(module.line_table_kind, line_table::NONE);
    assert!(module.line_table.is_empty());
    assert_eq!(profile.python_code(2), None);
    assert_eq!(profile.stack(1).unwrap().frames.len(), 4);
}

#[test]
fn an_unpublished_record_reads_as_unknown() {
    let mut builder = ProfileBuilder::new(1).python_code(make_code());
    builder.codes[0].published = 0;
    let profile = builder
        .stack(&[python_frame(0, 0, false)], stack_record())
        .build_profile();
    assert_eq!(profile.python_codes, vec![None]);
    assert_eq!(profile.python_code(0), None);
}

#[test]
fn a_span_past_the_blob_bytes_in_use_is_refused() {
    let mut builder = ProfileBuilder::new(1).python_code(make_code());
    let used = builder.blob.len() as u32;
    builder.codes[0].qualname.start = used - 2;
    builder.codes[0].qualname.len = 3;
    let error = error_of(&builder);
    assert!(
        error.starts_with("Python code record 0: qualname at blob bytes"),
        "{error}"
    );
    assert!(!error.contains('\n'));
    builder.codes[0].qualname.start = u32::MAX;
    builder.codes[0].qualname.len = u32::MAX;
    assert!(error_of(&builder).contains("past the"));
}

#[test]
fn an_unknown_line_table_kind_is_refused() {
    let mut builder = ProfileBuilder::new(1).python_code(make_code());
    builder.codes[0].line_table_kind = 7;
    assert_eq!(
        error_of(&builder),
        "Python code record 0: unknown line_table_kind 7"
    );
}

#[test]
fn a_python_frame_naming_an_unwritten_record_is_refused() {
    let builder = ProfileBuilder::new(1)
        .python_code(make_code())
        .stack(&[0x1000, python_frame(1, 0, false)], stack_record());
    assert_eq!(
        error_of(&builder),
        "stack 1: Python frame names code record 1, but only 1 were written"
    );
}

#[test]
fn a_code_count_over_capacity_is_refused() {
    let mut builder = ProfileBuilder::new(1);
    builder.header.code_count = 17;
    assert_eq!(
        error_of(&builder),
        "corrupt header: code_count 17 exceeds capacity 16"
    );
}

#[test]
fn versions_read_as_major_minor_micro() {
    assert_eq!(python_version_text(0x030b_07f0).as_deref(), Some("3.11.7"));
    assert_eq!(python_version_text(0x030d_00f0).as_deref(), Some("3.13.0"));
    assert_eq!(python_version_text(0), None);
}
