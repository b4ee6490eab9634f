//! `memwarden report DIR` rejects what is not a sound profile (missing folder, truncated
//! or foreign `raw/*.mwp` file) with a one-line error, and never crashes reading it.

mod common;
use common::*;
use memwarden_abi::{Header, Layout, HEADER_SIZE, PROFILE_EXTENSION, RAW_DIR};
use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::mem::offset_of;
use std::path::{Path, PathBuf};

const SMALL: &str = r#"
NOINLINE void small_alloc(void) { for (int i = 0; i < 100; i++) keep(malloc(1000 + i)); }
int main(void) { small_alloc(); return 0; }
"#;

/// A profiled run of a small program and its one profile file.
fn profiled_file(scratch: &Scratch) -> (PathBuf, PathBuf) {
    let prog = scratch.compile("small", SMALL);
    let run = profile(scratch, &[prog.arg()]);
    assert_success(&run.outcome, "memwarden run");
    let files: Vec<PathBuf> = fs::read_dir(run.dir.join(RAW_DIR))
        .expect("DIR/raw exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == PROFILE_EXTENSION))
        .collect();
    assert_eq!(files.len(), 1, "one process, one profile file: {files:?}");
    (run.dir, files[0].clone())
}

fn report(scratch: &Scratch, dir: &Path) -> Outcome {
    memwarden_cmd(scratch, &["report", dir.to_str().expect("utf-8")])
}

/// A `u64` of the header (the file is sparse and may be large: read only the header).
fn read_u64(file: &Path, offset: usize) -> u64 {
    let mut header = vec![0u8; HEADER_SIZE as usize];
    fs::File::open(file)
        .and_then(|mut f| f.read_exact(&mut header))
        .expect("read header");
    u64::from_le_bytes(header[offset..offset + 8].try_into().expect("8 bytes"))
}

fn overwrite(file: &Path, offset: u64, bytes: &[u8]) {
    let mut f = OpenOptions::new()
        .write(true)
        .open(file)
        .expect("open profile file");
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.write_all(bytes).expect("write");
}

#[test]
fn report_on_a_missing_or_empty_folder_is_an_error() {
    let scratch = Scratch::new("report_missing");
    let empty = scratch.path().join("empty");
    fs::create_dir(&empty).expect("mkdir");

    assert_one_line_error(
        &report(&scratch, Path::new("/nonexistent/memwarden-out")),
        "a missing folder",
    );
    assert_one_line_error(&report(&scratch, &empty), "a folder without raw/");
    assert_one_line_error(&memwarden_cmd(&scratch, &["report"]), "no folder given");
}

#[test]
fn report_on_a_truncated_profile_is_an_error() {
    let scratch = Scratch::new("report_truncated");
    let (dir, file) = profiled_file(&scratch);
    assert_success(
        &report(&scratch, &dir),
        "memwarden report on the intact profile",
    );
    let layout = offset_of!(Header, layout);
    let stacks_offset = read_u64(&file, layout + offset_of!(Layout, stacks_offset));
    let frames_offset = read_u64(&file, layout + offset_of!(Layout, frames_offset));
    let stack_count = read_u64(&file, offset_of!(Header, stack_count));
    let frame_words = read_u64(&file, offset_of!(Header, frame_words_used));
    assert!(
        stack_count > 1 && frame_words > 0,
        "the run recorded stacks"
    );
    let record = std::mem::size_of::<memwarden_abi::StackRecord>() as u64;
    // Cut points from the end of the used data down to nothing: each shorter file is a
    // prefix of the one before, so one file serves every case.
    let cuts = [
        (
            "in the last frame word in use",
            frames_offset + frame_words * 8 - 1,
        ),
        (
            "in the last stack record in use",
            stacks_offset + stack_count * record - 1,
        ),
        ("at the end of the header, less one byte", HEADER_SIZE - 1),
        ("in the header", 100),
        ("in the magic", 7),
        ("to nothing", 0),
    ];

    for (what, len) in cuts {
        OpenOptions::new()
            .write(true)
            .open(&file)
            .and_then(|f| f.set_len(len))
            .expect("truncate");
        assert_one_line_error(
            &report(&scratch, &dir),
            &format!("a profile cut {what} ({len} bytes)"),
        );
    }
}

#[test]
fn report_on_a_profile_with_bad_magic_or_version_is_an_error() {
    let scratch = Scratch::new("report_bad_magic");
    let (dir, file) = profiled_file(&scratch);
    assert_success(
        &report(&scratch, &dir),
        "memwarden report on the intact profile",
    );

    overwrite(
        &file,
        offset_of!(Header, version) as u64,
        &999u32.to_le_bytes(),
    );
    assert_one_line_error(
        &report(&scratch, &dir),
        "a profile of an unknown format version",
    );

    overwrite(&file, 0, b"NOTAPROF");
    assert_one_line_error(&report(&scratch, &dir), "a profile with a bad magic");
}

#[test]
fn report_on_a_profile_with_impossible_counts_is_an_error() {
    let scratch = Scratch::new("report_bad_counts");
    let (dir, file) = profiled_file(&scratch);
    assert_success(
        &report(&scratch, &dir),
        "memwarden report on the intact profile",
    );

    // More stacks in use than the layout has room for.
    overwrite(
        &file,
        offset_of!(Header, stack_count) as u64,
        &u64::MAX.to_le_bytes(),
    );

    assert_one_line_error(
        &report(&scratch, &dir),
        "a profile whose stack count exceeds its capacity",
    );
}

#[test]
fn report_past_the_file_size_limit_is_an_error_not_a_kill() {
    let scratch = Scratch::new("report_file_limit");
    let (dir, _) = profiled_file(&scratch);
    // One block (512 bytes or 1 KiB, as the shell counts) per file: report.json is larger.
    let script = format!(
        "ulimit -f 1 && exec {} report {}",
        memwarden().display(),
        dir.display()
    );
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args(["-c", &script]);
    let outcome = run_watched(cmd, None, WATCHDOG, &scratch);

    assert_one_line_error(&outcome, "memwarden report under ulimit -f 1");
    assert!(
        outcome.stderr_text().contains("File too large"),
        "{}",
        outcome.stderr_text()
    );
}
