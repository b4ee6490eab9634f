//! Tests of command-line parsing: every accepted spelling, every refusal in one line.

use super::*;

fn parse_strs(args: &[&str]) -> Result<Command, UsageError> {
    parse(args.iter().map(OsString::from).collect())
}

fn run_args(args: &[&str]) -> RunArgs {
    match parse_strs(args) {
        Ok(Command::Run(run)) => run,
        other => panic!("{args:?} gave {other:?}"),
    }
}

fn error(args: &[&str]) -> String {
    match parse_strs(args) {
        Err(e) => e.to_string(),
        Ok(command) => panic!("{args:?} accepted as {command:?}"),
    }
}

#[test]
fn run_takes_options_then_the_command() {
    let run = run_args(&[
        "run",
        "-o",
        "out",
        "--max-depth",
        "8",
        "--top=3",
        "--",
        "ls",
        "-l",
        "--",
        "x",
    ]);
    assert_eq!(
        run,
        RunArgs {
            output: "out".into(),
            max_depth: Some(8),
            top: 3,
            python_objects: false,
            all_stacks: false,
            fail: Vec::new(),
            seed: 0,
            guard: Default::default(),
            leak: Default::default(),
            command: ["ls", "-l", "--", "x"].map(OsString::from).to_vec(),
        }
    );
}

#[test]
fn run_defaults_and_a_command_without_double_dash() {
    let run = run_args(&["run", "ls", "--top", "9"]);
    assert_eq!(run.output, PathBuf::from(DEFAULT_OUTPUT));
    assert_eq!((run.max_depth, run.top), (None, DEFAULT_TOP));
    assert_eq!(run.command, ["ls", "--top", "9"].map(OsString::from));
    let run = run_args(&["run", "--output=o2", "--max-depth=256", "--", "-weird-name"]);
    assert_eq!(
        (run.output, run.max_depth),
        (PathBuf::from("o2"), Some(256))
    );
    assert_eq!(run.command, [OsString::from("-weird-name")]);
}

#[test]
fn python_objects_is_a_switch() {
    assert!(run_args(&["run", "--python-objects", "--", "python3"]).python_objects);
    assert!(!run_args(&["run", "python3", "--python-objects"]).python_objects);
    assert!(error(&["run", "--python-objects=yes", "python3"]).contains("--python-objects"));
}

#[test]
fn all_stacks_is_a_switch() {
    assert!(run_args(&["run", "--all-stacks", "--", "python3"]).all_stacks);
    assert!(!run_args(&["run", "python3", "--all-stacks"]).all_stacks);
    assert!(error(&["run", "--all-stacks=1", "python3"]).contains("--all-stacks"));
}

#[test]
fn help_and_version() {
    assert_eq!(parse_strs(&["--help"]), Ok(Command::Help));
    assert_eq!(parse_strs(&["run", "-h"]), Ok(Command::Help));
    assert_eq!(parse_strs(&["report", "--help"]), Ok(Command::Help));
    assert_eq!(parse_strs(&["--version"]), Ok(Command::Version));
}

#[test]
fn refusals_are_one_line_and_say_what_is_wrong() {
    let cases: &[(&[&str], &str)] = &[
        (&[], "missing command: expected `run`, `report` or `sweep`"),
        (
            &["frobnicate"],
            "unknown command 'frobnicate': expected `run`, `report` or `sweep`",
        ),
        (
            &["--no-such-option"],
            "unknown command '--no-such-option': expected `run`, `report` or `sweep`",
        ),
        (
            &["run"],
            "missing the command to run: memwarden run [options] -- CMD [ARGS...]",
        ),
        (
            &["run", "--"],
            "missing the command to run: memwarden run [options] -- CMD [ARGS...]",
        ),
        (
            &["run", "-o", "out"],
            "missing the command to run: memwarden run [options] -- CMD [ARGS...]",
        ),
        (&["run", "-o"], "option -o needs a value"),
        (&["run", "--max-depth"], "option --max-depth needs a value"),
        (
            &["run", "-x", "--", "ls"],
            "unknown option '-x' for `memwarden run`",
        ),
        (
            &["run", "--no-such-option", "ls"],
            "unknown option '--no-such-option' for `memwarden run`",
        ),
        (
            &["run", "--max-depth", "abc", "ls"],
            "option --max-depth expects a whole number from 1 to 256, not 'abc'",
        ),
        (
            &["run", "--max-depth", "0", "ls"],
            "option --max-depth expects a whole number from 1 to 256, not '0'",
        ),
        (
            &["run", "--max-depth=257", "ls"],
            "option --max-depth expects a whole number from 1 to 256, not '257'",
        ),
        (
            &["run", "--top", "many", "ls"],
            "option --top expects a whole number from 0 to 1000, not 'many'",
        ),
        (
            &["run", "-o", "", "ls"],
            "option -o needs a non-empty folder",
        ),
        (
            &["report"],
            "missing the output folder: memwarden report DIR",
        ),
        (&["report", "a", "b"], "`memwarden report` takes one folder"),
        (
            &["report", "--all", "a"],
            "unknown option '--all' for `memwarden report`",
        ),
    ];
    for (args, message) in cases {
        let text = error(args);
        assert_eq!(
            text,
            format!("{message} (see memwarden --help)"),
            "{args:?}"
        );
        assert!(!text.contains('\n'));
    }
}

#[test]
fn report_takes_one_folder_and_top_anywhere() {
    let expected = Command::Report(ReportArgs {
        dir: "out".into(),
        top: 2,
        all_stacks: true,
    });
    let parsed = parse_strs(&["report", "out", "--all-stacks", "--top", "2"]);
    assert_eq!(parsed, Ok(expected));
    let dashed = parse_strs(&["report", "--top=1", "--", "-odd"]);
    assert_eq!(
        dashed,
        Ok(Command::Report(ReportArgs {
            dir: "-odd".into(),
            top: 1,
            all_stacks: false,
        }))
    );
}
