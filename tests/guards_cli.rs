//! The guard options of `memwarden run` end to end: bad values refused in one line before
//! the target starts, no guard without `--guard` (whatever memwarden's own environment
//! holds), and `--error-exitcode`.

mod common;
use common::guards::run_guarded;
use common::*;

#[test]
fn bad_guard_options_are_refused_before_the_target_starts() {
    let scratch = Scratch::new("guard_cli_refused");
    let marker = scratch.path().join("started");
    let marker = marker.to_str().expect("utf-8 path");
    let cases: [(&[&str], &str); 6] = [
        (
            &["--guard", "fence"],
            "memwarden: error: option --guard expects header, page or sampled, not 'fence'",
        ),
        (
            &["--align", "12"],
            "memwarden: error: option --align expects a power of two from 8 to 1073741824, not '12'",
        ),
        (
            &["--guard", "header", "--fill-alloc", "300"],
            "memwarden: error: option --fill-alloc expects a byte, 0 to 255 or 0x00 to 0xff, not '300'",
        ),
        (
            &["--guard-below"],
            "memwarden: error: --guard-below needs --guard page",
        ),
        (
            &["--guard", "header", "--guard-below"],
            "memwarden: error: --guard-below needs --guard page",
        ),
        (
            &["--guard", "page", "--quarantine", "lots"],
            "memwarden: error: option --quarantine expects a size such as 64MiB, not 'lots'",
        ),
    ];
    for (options, message) in cases {
        let mut args = vec!["run", "-o", "out"];
        args.extend_from_slice(options);
        args.extend_from_slice(&["--", "/usr/bin/touch", marker]);
        let outcome = memwarden_cmd(&scratch, &args);
        assert_one_line_error(&outcome, &format!("{options:?}"));
        assert_eq!(outcome.code(), 2, "{options:?}");
        assert!(
            outcome.stderr_text().starts_with(message),
            "{options:?}: {}",
            outcome.stderr_text()
        );
        assert!(
            !std::path::Path::new(marker).exists(),
            "{options:?}: the target ran"
        );
    }
}

/// GIVEN a program that frees one block twice, then exits with argv[1].
const DOUBLE_FREE: &str = r#"
NOINLINE void release(void *p) { free(p); }
int main(int argc, char **argv) {
    void *p = malloc(100);
    release(p);
    if (argc > 2) release(p);
    say("continued\n");
    return atoi(argv[1]);
}
"#;

#[test]
fn error_exitcode_replaces_the_status_only_when_an_error_was_found() {
    let scratch = Scratch::new("guard_cli_exitcode");
    let prog = scratch.compile("double_free_status", DOUBLE_FREE);
    let options = ["--guard", "header", "--error-exitcode", "99"];

    let with_error = run_guarded(&scratch, &options, &[prog.arg(), "3", "twice"]);
    assert_eq!(
        (with_error.status(), with_error.stdout()),
        (99, "continued\n".to_owned()),
        "stderr:\n{}",
        with_error.stderr()
    );
    assert_eq!(with_error.report.program_process().error_count, 1);

    let without = run_guarded(&scratch, &options, &[prog.arg(), "3"]);
    assert_eq!(without.status(), 3, "stderr:\n{}", without.stderr());
    without.assert_no_error("header");

    // Without --error-exitcode, the error does not change the status.
    let plain = run_guarded(
        &scratch,
        &["--guard", "header"],
        &[prog.arg(), "0", "twice"],
    );
    assert_eq!(plain.status(), 0, "stderr:\n{}", plain.stderr());
    assert_eq!(plain.report.program_process().error_count, 1);
}

#[test]
fn without_guard_no_guard_variable_reaches_the_target() {
    let scratch = Scratch::new("guard_cli_env");
    let prog = scratch.compile("double_free_env", DOUBLE_FREE);

    let run = profile_with(
        &scratch,
        &[prog.arg(), "0"],
        &RunOptions {
            env: &[
                ("MEMWARDEN_GUARD", "header"),
                ("MEMWARDEN_FILL_ALLOC", "171"),
                ("MEMWARDEN_QUARANTINE", "1"),
            ],
            ..Default::default()
        },
    );

    let guards = common::guards::GuardReport::load(&run.dir);
    let p = guards.program_process();
    assert_eq!(
        (p.guard_mode.as_str(), p.error_count),
        ("none", 0),
        "stderr:\n{}",
        run.outcome.stderr_text()
    );
}
