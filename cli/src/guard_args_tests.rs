//! Tests of the guard options of `memwarden run`: every accepted spelling, the variables
//! the preload gets, and every refusal in one line.

use std::ffi::OsString;

use super::*;
use crate::args::{parse, Command, RunArgs};

fn run_args(args: &[&str]) -> RunArgs {
    let mut argv = vec!["run"];
    argv.extend_from_slice(args);
    argv.push("ls");
    match parse(argv.iter().map(OsString::from).collect()) {
        Ok(Command::Run(run)) => run,
        other => panic!("{args:?} gave {other:?}"),
    }
}

fn refusal(args: &[&str]) -> String {
    let mut argv = vec!["run"];
    argv.extend_from_slice(args);
    argv.push("ls");
    match parse(argv.iter().map(OsString::from).collect()) {
        Err(e) => e.to_string(),
        Ok(command) => panic!("{args:?} accepted as {command:?}"),
    }
}

fn variables(args: &[&str]) -> Vec<(&'static str, Option<String>)> {
    run_args(args).guard.variables().to_vec()
}

#[test]
fn without_guard_options_every_variable_is_removed() {
    let run = run_args(&[]);
    assert_eq!(run.guard, GuardArgs::default());
    assert!(run
        .guard
        .variables()
        .iter()
        .all(|(_, value)| value.is_none()));
    assert_eq!(
        run.guard.variables().map(|(name, _)| name),
        [
            "MEMWARDEN_GUARD",
            "MEMWARDEN_ALIGN",
            "MEMWARDEN_FILL_ALLOC",
            "MEMWARDEN_FILL_FREE",
            "MEMWARDEN_GUARD_BELOW",
            "MEMWARDEN_SAMPLE_RATE",
            "MEMWARDEN_CHECK_EVERY",
            "MEMWARDEN_QUARANTINE",
        ]
    );
}

#[test]
fn header_mode_options_become_decimal_variables() {
    let given = [
        "--guard",
        "header",
        "--align=64",
        "--fill-alloc",
        "0xAB",
        "--fill-free=221",
        "--check-every",
        "1",
        "--quarantine",
        "16MiB",
        "--error-exitcode",
        "99",
    ];
    let run = run_args(&given);
    assert_eq!(run.guard.error_exitcode, Some(99));
    assert_eq!(run.command, ["ls"]);
    let set = |v: &str| Some(v.to_owned());
    assert_eq!(
        variables(&given),
        [
            ("MEMWARDEN_GUARD", set("header")),
            ("MEMWARDEN_ALIGN", set("64")),
            ("MEMWARDEN_FILL_ALLOC", set("171")),
            ("MEMWARDEN_FILL_FREE", set("221")),
            ("MEMWARDEN_GUARD_BELOW", None),
            ("MEMWARDEN_SAMPLE_RATE", None),
            ("MEMWARDEN_CHECK_EVERY", set("1")),
            ("MEMWARDEN_QUARANTINE", set("16777216")),
        ]
    );
}

#[test]
fn page_and_sampled_mode_options() {
    let page = run_args(&["--guard", "page", "--guard-below", "--quarantine", "0"]);
    assert_eq!(page.guard.mode, Some(GuardMode::Page));
    assert!(page.guard.guard_below);
    assert_eq!(page.guard.quarantine, Some(0));
    assert_eq!(
        page.guard.variables()[4],
        ("MEMWARDEN_GUARD_BELOW", Some("1".to_owned()))
    );
    let sampled = run_args(&[
        "--guard=sampled",
        "--sample-rate",
        "1",
        "--quarantine=1MiB",
        "--fill-alloc=1",
    ]);
    assert_eq!(sampled.guard.quarantine, Some(1 << 20));
    assert_eq!(
        (sampled.guard.mode, sampled.guard.sample_rate),
        (Some(GuardMode::Sampled), Some(1))
    );
    assert_eq!(
        sampled.guard.variables()[5],
        ("MEMWARDEN_SAMPLE_RATE", Some("1".to_owned()))
    );
}

#[test]
fn align_goes_with_or_without_a_guard() {
    assert_eq!(run_args(&["--align", "8"]).guard.align, Some(8));
    assert_eq!(
        run_args(&["--align", "1073741824"]).guard.align,
        Some(1 << 30)
    );
    assert_eq!(
        run_args(&["--guard", "page", "--align", "4096"])
            .guard
            .align,
        Some(4096)
    );
}

#[test]
fn error_exitcode_goes_with_or_without_a_guard() {
    assert_eq!(
        run_args(&["--error-exitcode", "0"]).guard.error_exitcode,
        Some(0)
    );
    assert_eq!(
        refusal(&["--error-exitcode", "256"]),
        "option --error-exitcode expects a whole number from 0 to 255, not '256' \
         (see memwarden --help)"
    );
}

#[test]
fn bad_values_are_refused_in_one_line() {
    assert_eq!(
        refusal(&["--guard", "fence"]),
        "option --guard expects header, page or sampled, not 'fence' (see memwarden --help)"
    );
    for bad in ["12", "4", "0", "-8", "2147483648", "x"] {
        assert_eq!(
            refusal(&["--align", bad]),
            format!(
                "option --align expects a power of two from 8 to 1073741824, not '{bad}' \
                 (see memwarden --help)"
            )
        );
    }
    for bad in ["300", "256", "0x100", "0x", "-1", "ab", "", "0xg1"] {
        assert_eq!(
            refusal(&["--guard", "header", "--fill-alloc", bad]),
            format!(
                "option --fill-alloc expects a byte, 0 to 255 or 0x00 to 0xff, not '{bad}' \
                 (see memwarden --help)"
            )
        );
    }
    assert_eq!(
        refusal(&["--guard", "sampled", "--sample-rate", "0"]),
        "option --sample-rate expects a whole number from 1 to 18446744073709551615, not '0' \
         (see memwarden --help)"
    );
    assert_eq!(
        refusal(&["--guard", "header", "--quarantine", "12XB"]),
        "option --quarantine expects a size such as 64MiB, not '12XB': bad unit 'XB' \
         (units: B, K, KB, KiB, M, MB, MiB, G, GB, GiB) (see memwarden --help)"
    );
    assert_eq!(
        refusal(&["--guard", "page", "--quarantine", "1100GB"]),
        "option --quarantine expects a size such as 64MiB, not '1100GB': more than \
         1099511627776 bytes (1 TiB) (see memwarden --help)"
    );
    assert_eq!(
        run_args(&["--guard", "page", "--quarantine", "1024GiB"])
            .guard
            .quarantine,
        Some(1 << 40)
    );
    let missing = parse(vec!["run".into(), "--guard".into()]).unwrap_err();
    assert_eq!(
        missing.to_string(),
        "option --guard needs a value (see memwarden --help)"
    );
    assert_eq!(
        refusal(&["--guard", "page", "--guard-below=1"]),
        "option --guard-below takes no value (see memwarden --help)"
    );
    assert!(!refusal(&["--guard", "a\nb"]).contains('\n'));
}

#[test]
fn fill_bytes_take_decimal_or_hex() {
    let fills = |a: &str, f: &str| {
        let run = run_args(&["--guard", "header", "--fill-alloc", a, "--fill-free", f]);
        (run.guard.fill_alloc, run.guard.fill_free)
    };
    assert_eq!(fills("0", "255"), (Some(0), Some(255)));
    assert_eq!(fills("0xdd", "0XFf"), (Some(0xdd), Some(0xff)));
    assert_eq!(fills("007", "0x0"), (Some(7), Some(0)));
}

#[test]
fn options_without_their_mode_are_refused() {
    let cases: [(&[&str], &str); 7] = [
        (
            &["--guard-below"],
            "--guard-below needs --guard page (it puts the inaccessible page before each block)",
        ),
        (
            &["--guard", "header", "--guard-below"],
            "--guard-below needs --guard page (it puts the inaccessible page before each block)",
        ),
        (
            &["--guard", "header", "--sample-rate", "10"],
            "--sample-rate needs --guard sampled",
        ),
        (
            &["--guard", "page", "--check-every", "10"],
            "--check-every needs --guard header",
        ),
        (
            &["--quarantine", "1MiB"],
            "--quarantine needs --guard header, page or sampled",
        ),
        (
            &["--fill-alloc", "1"],
            "--fill-alloc needs --guard header, page or sampled",
        ),
        (
            &["--guard", "page", "--fill-free", "1"],
            "--fill-free needs --guard header (in page mode a freed block is inaccessible)",
        ),
    ];
    for (args, message) in cases {
        assert_eq!(
            refusal(args),
            format!("{message} (see memwarden --help)"),
            "{args:?}"
        );
    }
}
