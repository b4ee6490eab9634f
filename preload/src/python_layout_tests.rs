//! The offsets in `python_layout` against CPython's own headers: for each CPython 3.9–3.13
//! installed with its headers (pyenv's `include/pythonX.Y`, or `/usr/include/pythonX.Y`), a C
//! program built with `Py_BUILD_CORE` prints `offsetof` of every field memwarden reads.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

const PROGRAM: &str = r#"
#define Py_BUILD_CORE 1
#include <Python.h>
#include <internal/pycore_frame.h>
#include <internal/pycore_code.h>
#include <stdio.h>
#include <stddef.h>
#define SHOW(name, value) printf("%s %zu\n", name, (size_t)(value))
int main(void) {
#if PY_VERSION_HEX >= 0x030D0000
    SHOW("current_frame", offsetof(PyThreadState, current_frame));
    SHOW("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    SHOW("frame_instruction", offsetof(_PyInterpreterFrame, instr_ptr));
#else
    SHOW("cframe", offsetof(PyThreadState, cframe));
    SHOW("current_frame", offsetof(_PyCFrame, current_frame));
    SHOW("frame_code", offsetof(_PyInterpreterFrame, f_code));
    SHOW("frame_instruction", offsetof(_PyInterpreterFrame, prev_instr));
#endif
#if PY_VERSION_HEX < 0x030C0000
    SHOW("is_entry", offsetof(_PyInterpreterFrame, is_entry));
#else
    SHOW("owned_by_cstack", FRAME_OWNED_BY_CSTACK);
#endif
    SHOW("owned_by_generator", FRAME_OWNED_BY_GENERATOR);
    SHOW("frame_previous", offsetof(_PyInterpreterFrame, previous));
    SHOW("frame_owner", offsetof(_PyInterpreterFrame, owner));
    SHOW("code_first_line", offsetof(PyCodeObject, co_firstlineno));
    SHOW("code_filename", offsetof(PyCodeObject, co_filename));
    SHOW("code_name", offsetof(PyCodeObject, co_name));
    SHOW("code_qualname", offsetof(PyCodeObject, co_qualname));
    SHOW("code_line_table", offsetof(PyCodeObject, co_linetable));
    SHOW("code_first_traceable", offsetof(PyCodeObject, _co_firsttraceable));
    SHOW("code_units", offsetof(PyCodeObject, co_code_adaptive));
    SHOW("ascii_size", sizeof(PyASCIIObject));
    SHOW("compact_size", sizeof(PyCompactUnicodeObject));
    SHOW("compact_utf8", offsetof(PyCompactUnicodeObject, utf8));
    SHOW("compact_utf8_length", offsetof(PyCompactUnicodeObject, utf8_length));
    SHOW("object_type", offsetof(PyObject, ob_type));
    SHOW("var_size", offsetof(PyVarObject, ob_size));
    SHOW("bytes_data", offsetof(PyBytesObject, ob_sval));
    SHOW("unicode_length", offsetof(PyASCIIObject, length));
    SHOW("unicode_state", offsetof(PyASCIIObject, state));
    PyASCIIObject probe = {0};
    probe.state.kind = 7; SHOW("kind_bits", *(unsigned int *)&probe.state);
    probe.state.kind = 0; probe.state.compact = 1; SHOW("compact_bit", *(unsigned int *)&probe.state);
    probe.state.compact = 0; probe.state.ascii = 1; SHOW("ascii_bit", *(unsigned int *)&probe.state);
    return 0;
}
"#;

/// The fields read from 3.9 and 3.10, whose frames are `PyFrameObject`s.
const FRAME_OBJECT_PROGRAM: &str = r#"
#include <Python.h>
#include <frameobject.h>
#include <stdio.h>
#include <stddef.h>
#define SHOW(name, value) printf("%s %zu\n", name, (size_t)(value))
int main(void) {
    SHOW("thread_frame", offsetof(PyThreadState, frame));
    SHOW("frame_code", offsetof(PyFrameObject, f_code));
    SHOW("frame_previous", offsetof(PyFrameObject, f_back));
    SHOW("frame_instruction", offsetof(PyFrameObject, f_lasti));
    SHOW("code_first_line", offsetof(PyCodeObject, co_firstlineno));
    SHOW("code_filename", offsetof(PyCodeObject, co_filename));
    SHOW("code_name", offsetof(PyCodeObject, co_name));
    SHOW("ascii_size", sizeof(PyASCIIObject));
    SHOW("compact_size", sizeof(PyCompactUnicodeObject));
    SHOW("compact_utf8", offsetof(PyCompactUnicodeObject, utf8));
    SHOW("compact_utf8_length", offsetof(PyCompactUnicodeObject, utf8_length));
    return 0;
}
"#;

/// Include directories of the CPython 3.9–3.13 installs on this machine (3.11+ need
/// their internal headers).
fn installed_headers() -> Vec<(u32, PathBuf)> {
    let mut found = Vec::new();
    for minor in 9..=13u32 {
        let name = format!("python3.{minor}");
        let mut candidates = vec![PathBuf::from("/usr/include").join(&name)];
        if let Ok(entries) = std::fs::read_dir("/root/.pyenv/versions") {
            for entry in entries.flatten() {
                candidates.push(entry.path().join("include").join(&name));
            }
        }
        for dir in candidates {
            let probe = if minor >= 11 {
                "internal/pycore_frame.h"
            } else {
                "frameobject.h"
            };
            if dir.join(probe).exists() {
                found.push((0x0300 | minor, dir));
            }
        }
    }
    found
}

fn offsets_from_headers(include: &Path, scratch: &Path, program: &str) -> Vec<(String, usize)> {
    let source = scratch.join("layout.c");
    let binary = scratch.join("layout");
    std::fs::write(&source, program).unwrap();
    let built = Command::new("gcc")
        .arg(format!("-I{}", include.display()))
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .status()
        .expect("gcc runs");
    assert!(
        built.success(),
        "the probe builds against {}",
        include.display()
    );
    let output = Command::new(&binary).output().unwrap();
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, value) = line.split_once(' ').unwrap();
            (name.to_owned(), value.parse().unwrap())
        })
        .collect()
}

fn expected_frame_objects(layout: &PyLayout) -> Vec<(&'static str, usize)> {
    let CurrentFrame::FrameObjects { frame, .. } = layout.current_frame else {
        unreachable!("3.9 and 3.10 only");
    };
    vec![
        ("thread_frame", frame),
        ("frame_code", layout.frame_code),
        ("frame_previous", layout.frame_previous),
        ("frame_instruction", layout.frame_instruction),
        ("code_first_line", layout.code_first_line),
        ("code_filename", layout.code_filename),
        ("code_name", layout.code_name),
        ("ascii_size", layout.ascii_size),
        ("compact_size", layout.compact_size),
        ("compact_utf8", layout.compact_utf8),
        ("compact_utf8_length", layout.compact_utf8_length),
    ]
}

fn expected(layout: &PyLayout) -> Vec<(&'static str, usize)> {
    let mut fields = vec![
        ("frame_code", layout.frame_code),
        ("frame_instruction", layout.frame_instruction),
        ("frame_previous", layout.frame_previous),
        ("frame_owner", layout.frame_owner),
        ("owned_by_generator", OWNED_BY_GENERATOR.into()),
        ("code_first_line", layout.code_first_line),
        ("code_filename", layout.code_filename),
        ("code_name", layout.code_name),
        ("code_qualname", layout.code_qualname),
        ("code_line_table", layout.code_line_table.unwrap()),
        ("code_first_traceable", layout.code_first_traceable),
        ("code_units", layout.code_units),
        ("ascii_size", layout.ascii_size),
        ("compact_size", layout.compact_size),
        ("compact_utf8", layout.compact_utf8),
        ("compact_utf8_length", layout.compact_utf8_length),
        ("object_type", OBJECT_TYPE),
        ("var_size", VAR_SIZE),
        ("bytes_data", BYTES_DATA),
        ("unicode_length", UNICODE_LENGTH),
        ("unicode_state", UNICODE_STATE),
        ("kind_bits", (STATE_KIND_MASK << STATE_KIND_SHIFT) as usize),
        ("compact_bit", STATE_COMPACT as usize),
        ("ascii_bit", STATE_ASCII as usize),
    ];
    match layout.current_frame {
        CurrentFrame::ThroughCFrame {
            cframe,
            current_frame,
        } => {
            fields.push(("cframe", cframe));
            fields.push(("current_frame", current_frame));
        }
        CurrentFrame::Direct { current_frame } => fields.push(("current_frame", current_frame)),
        CurrentFrame::FrameObjects { .. } => unreachable!("3.9 and 3.10 are checked apart"),
    }
    match layout.entry {
        EntryMark::IsEntryFlag(offset) => fields.push(("is_entry", offset)),
        EntryMark::CStackOwner => fields.push(("owned_by_cstack", OWNED_BY_CSTACK.into())),
        EntryMark::EveryFrame => unreachable!("3.9 and 3.10 are checked apart"),
    }
    fields
}

#[test]
fn every_offset_matches_the_installed_headers() {
    let installs = installed_headers();
    if installs.is_empty() {
        eprintln!("no CPython 3.11–3.13 headers installed: nothing to compare");
        return;
    }
    let scratch = std::env::temp_dir().join(format!("memwarden-layout-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    for (version, include) in installs {
        let layout = for_version((version << 16) | 0xf0).expect("a known version");
        let (program, fields) = if version >= 0x030b {
            (PROGRAM, expected(layout))
        } else {
            (FRAME_OBJECT_PROGRAM, expected_frame_objects(layout))
        };
        let from_headers = offsets_from_headers(&include, &scratch, program);
        for (name, value) in fields {
            let found = from_headers.iter().find(|(n, _)| n == name);
            assert_eq!(
                found.map(|(_, v)| *v),
                Some(value),
                "{name} for {}",
                include.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
