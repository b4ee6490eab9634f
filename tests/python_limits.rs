//! Python in a small address space (`ulimit -v`): the profile file's mapping counts in full
//! against the limit, so the preload maps it within a quarter of the room the process has
//! left, and CPython starts under memwarden wherever it starts bare.

mod common;
use common::python::*;
use common::*;

/// Above what CPython 3.11 needs bare, and far below what it needed under memwarden while
/// the profile was mapped as large as would fit (it then failed at start-up under 100 MB).
const LIMIT_KB: u32 = 60_000;

/// GIVEN a script that holds a 2 MiB bytearray made on a known line.
const SCRIPT: &str = r#"def make():
    return bytearray(2 * 1024 * 1024)  # MAKE

keep = make()
print("made", len(keep))
"#;

/// ... WHEN it runs in an address space of 60,000 KiB (`prlimit --as`, which sets the limit
/// and execs at once), bare and under memwarden
/// THEN it runs under memwarden as it does bare, the preload says its profile is smaller,
/// and the array's bytes (and the bytearray's terminating NUL) are at the peak on its line.
///
/// Not a shell's `ulimit -v` before `exec`: the shell lowers the limit inside a process
/// that already holds memwarden's mappings, where any growth of its heap before the exec
/// fails (README, limits). That happened once in CI, when dash needed more heap than usual.
#[test]
fn python_starts_in_an_address_space_it_starts_in_bare() {
    let Some(python) = venv_python("sys") else {
        return;
    };
    let scratch = Scratch::new("python_limits");
    let script = Script::new(&scratch, "limited.py", SCRIPT);
    let limit = format!("--as={}", u64::from(LIMIT_KB) * 1024);
    let python = python.to_str().expect("utf-8 path");
    let argv = ["prlimit", limit.as_str(), python, script.arg()];

    let bare = run_bare(&scratch, &argv, None);
    assert_eq!(bare.code(), 0, "bare: {}", bare.stderr_text());
    let run = profile(&scratch, &argv);

    assert_success(&run.outcome, "the script under memwarden and prlimit --as");
    assert_eq!(run.outcome.stdout_text(), "made 2097152\n");
    assert!(
        run.outcome.stderr_text().contains(
            "memwarden: the process's limits (ulimit -v or -f) leave no room for a full profile"
        ),
        "{}",
        run.outcome.stderr_text()
    );
    let report = PyReport::load(&run.dir.join("report.json"));
    // prlimit's image names the script too: the Python process is the one it became.
    let process = report
        .processes
        .iter()
        .find(|p| p.argv.first().map(String::as_str) == Some(python))
        .unwrap_or_else(|| panic!("no Python process: {:?}", report.argvs()));
    let about = process.describe(&script);
    assert_eq!(process.exit_code(), Some(0), "{about}");
    assert_eq!(
        process.at_peak_at(&script, script.line_of("# MAKE")),
        2 * 1024 * 1024 + 1,
        "{about}"
    );
}
