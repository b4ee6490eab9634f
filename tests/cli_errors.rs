//! Bad input to `memwarden run` gets a one-line error and a non-zero exit, never a panic,
//! and the target is not started when it cannot be profiled.

mod common;
use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;

/// A program that says it ran (the tests check that refused targets were not started).
const RAN: &str = r#"
int main(void) { say("target ran\n"); return 0; }
"#;

#[test]
fn unknown_options_and_subcommands_are_errors() {
    let scratch = Scratch::new("unknown_option");
    let prog = scratch.compile("ran", RAN);
    let cases: &[&[&str]] = &[
        &["run", "--no-such-option", "--", prog.arg()],
        &["run", "-x", "--", prog.arg()],
        &["run", "--max-depth", "abc", "--", prog.arg()],
        &["run", "--top", "many", "--", prog.arg()],
        &["run", "--max-depth", "0", "--", prog.arg()],
        &["run", "--max-depth", "257", "--", prog.arg()],
        &["run", "--max-depth"],
        &["frobnicate"],
        &["--no-such-option"],
    ];
    for args in cases {
        let outcome = memwarden_cmd(&scratch, args);
        assert_one_line_error(&outcome, &format!("memwarden {args:?}"));
    }
}

#[test]
fn a_missing_command_is_an_error() {
    let scratch = Scratch::new("missing_command");
    let out = scratch
        .path()
        .join("out")
        .to_str()
        .expect("utf-8")
        .to_owned();
    let cases: &[&[&str]] = &[
        &["run"],
        &["run", "--"],
        &["run", "-o", &out],
        &["run", "-o", &out, "--"],
        &[],
    ];
    for args in cases {
        let outcome = memwarden_cmd(&scratch, args);
        assert_one_line_error(&outcome, &format!("memwarden {args:?}"));
    }
}

#[test]
fn a_command_that_cannot_be_started_is_an_error() {
    let scratch = Scratch::new("bad_command");
    let text = scratch.write("notes.txt", "not a program\n");
    let folder = scratch.path().join("folder");
    fs::create_dir(&folder).expect("mkdir");
    let cases: &[&str] = &[
        "/nonexistent/program",
        "no-such-command-on-path-memwarden",
        text.to_str().expect("utf-8"),
        folder.to_str().expect("utf-8"),
    ];
    for command in cases {
        let out = scratch.out_dir();
        let outcome = memwarden_cmd(
            &scratch,
            &["run", "-o", out.to_str().expect("utf-8"), "--", command],
        );
        assert_one_line_error(&outcome, &format!("memwarden run -- {command}"));
    }
}

#[test]
fn a_statically_linked_target_is_refused_before_it_runs() {
    let scratch = Scratch::new("static_target");
    let prog = scratch.compile_with("static", RAN, &["-static"]);
    let out = scratch.out_dir();

    let outcome = memwarden_cmd(
        &scratch,
        &["run", "-o", out.to_str().expect("utf-8"), "--", prog.arg()],
    );

    assert_one_line_error(&outcome, "a static target");
}

#[test]
fn a_setuid_target_is_refused_before_it_runs() {
    let scratch = Scratch::new("setuid_target");
    let prog = scratch.compile("setuid", RAN);
    fs::set_permissions(&prog.path, fs::Permissions::from_mode(0o4755)).expect("chmod u+s");
    let out = scratch.out_dir();

    let outcome = memwarden_cmd(
        &scratch,
        &["run", "-o", out.to_str().expect("utf-8"), "--", prog.arg()],
    );

    // The loader ignores LD_PRELOAD for setuid programs, so it could not be profiled; as
    // root the kernel would not even mark it secure, so memwarden must read the mode bits.
    assert_one_line_error(&outcome, "a setuid target");
}

#[test]
fn an_unwritable_output_folder_is_refused_before_the_target_runs() {
    let scratch = Scratch::new("unwritable_output");
    let prog = scratch.compile("ran", RAN);
    let file = scratch.write("a-file", "a regular file\n");
    let under_file = file.join("out");
    let cases = [
        "/proc/memwarden-forbidden".to_owned(),
        file.display().to_string(),
        under_file.display().to_string(),
    ];
    for out in &cases {
        let outcome = memwarden_cmd(&scratch, &["run", "-o", out, "--", prog.arg()]);
        assert_one_line_error(&outcome, &format!("memwarden run -o {out}"));
    }
}

#[test]
fn a_good_run_of_the_same_program_works() {
    // The contrast case: the errors above come from their input, not from a broken build.
    let scratch = Scratch::new("good_run");
    let prog = scratch.compile("ran", RAN);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    assert_eq!(run.outcome.stdout_text(), "target ran\n");
}
