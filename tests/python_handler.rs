//! The Python end of `memwarden run`: NumPy's data-memory handler is memwarden's in the
//! importing thread, and NumPy's default one (named as bare) sends every other thread's
//! arrays through memwarden too, also in a Python a shell starts, with nothing changed in
//! the script or its environment; the user's own `sitecustomize` still runs (errors
//! included, shown as Python shows them); `sys.path` is what it would be without
//! memwarden; the sitecustomize never breaks a Python it cannot serve; and memwarden's
//! Python files are compiled once, their bytecode kept for the next run.

mod common;

use std::path::{Path, PathBuf};

use common::python::*;
use common::*;

/// Prints the handler NumPy gives arrays made in the main thread, a `threading.Thread` and
/// a thread pool, NumPy's floating-point error state (as it stands, inside `np.errstate`
/// and after it) and whether the importing context holds it, then `sys.path` and where
/// `sitecustomize` came from.
const SCRIPT: &str = r#"import json, sys, threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np

name = np._core.multiarray.get_handler_name
print("main", name(np.ones(3)))
seen = []


def in_thread():
    seen.append(name(np.ones(123_457)))  # THREAD


def in_pool():
    return name(np.ones(54_321))  # POOL


thread = threading.Thread(target=in_thread)
thread.start()
thread.join()
print("thread", seen[0])
with ThreadPoolExecutor(2) as pool:
    print("pool", pool.submit(in_pool).result())
import contextvars
from numpy._core import _multiarray_umath as core
print("errors", json.dumps(np.geterr(), sort_keys=True))
with np.errstate(all="raise"):
    print("errors-raised", json.dumps(np.geterr(), sort_keys=True))
print("errors-after", json.dumps(np.geterr(), sort_keys=True))
print("state-held", core._extobj_contextvar in contextvars.copy_context())
print("path", json.dumps(sys.path))
print("sitecustomize", getattr(sys.modules.get("sitecustomize"), "__file__", None))
"#;

/// The lines of `stdout` that start with `key `, without the key.
fn value<'a>(stdout: &'a str, key: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(' ')))
        .collect()
}

/// The script run bare, with `PYTHONPATH` set to `user_path`, or unset.
fn run_bare(python: &Path, script: &Script, user_path: Option<&str>, scratch: &Scratch) -> Outcome {
    let mut bare = std::process::Command::new(python);
    bare.arg(script.arg()).current_dir(scratch.path());
    match user_path {
        Some(path) => bare.env("PYTHONPATH", path),
        None => bare.env_remove("PYTHONPATH"),
    };
    run_watched(bare, None, WATCHDOG, scratch)
}

/// The target's stderr: what memwarden's summary (`memwarden: <command> (N process…`)
/// follows.
fn target_stderr(stderr: &str) -> &str {
    let summary = stderr
        .find("memwarden: ")
        .filter(|&at| stderr[at..].contains(" process"))
        .unwrap_or(stderr.len());
    &stderr[..summary]
}

/// The NumPy data stacks of `script`'s `marker` line that made one array of `bytes`.
fn arrays_at(run: &PyRun, script: &Script, marker: &str, bytes: u64) -> usize {
    let process = run.report.main_process(script);
    process
        .numpy_stacks_at(script, script.line_of(marker))
        .filter(|s| (s.allocations, s.allocated_bytes) == (1, bytes))
        .count()
}

#[test]
fn arrays_go_through_memwarden_in_every_thread_and_the_users_sitecustomize_runs() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_handler");
    let script = Script::new(&scratch, "handler.py", SCRIPT);
    let user = scratch.path().join("user");
    std::fs::create_dir_all(&user).expect("user folder");
    let user_site = user.join("sitecustomize.py");
    std::fs::write(&user_site, "print('user sitecustomize ran')\n").expect("user file");
    let user_path = user.to_str().expect("utf-8 path");

    let run = run_script(
        &scratch,
        &python,
        &script,
        &[],
        &[("PYTHONPATH", user_path)],
    );
    assert_success(&run.outcome, "the script under memwarden");
    let stdout = run.outcome.stdout_text();
    assert_eq!(
        stdout.lines().next(),
        Some("user sitecustomize ran"),
        "{stdout}"
    );
    // The importing thread has memwarden's handler; a new thread starts with NumPy's
    // default one, named as bare (NumPy's own tests check that name), whose functions are
    // memwarden's: its arrays are NumPy data in the report all the same.
    assert_eq!(value(&stdout, "main"), ["memwarden"], "{stdout}");
    for key in ["thread", "pool"] {
        assert_eq!(
            value(&stdout, key),
            ["default_allocator"],
            "{key}:\n{stdout}"
        );
    }
    let about = run.report.main_process(&script).describe(&script);
    assert_eq!(arrays_at(&run, &script, "# THREAD", 987_656), 1, "{about}");
    assert_eq!(arrays_at(&run, &script, "# POOL", 434_568), 1, "{about}");
    assert_eq!(
        value(&stdout, "sitecustomize"),
        [user_site.to_str().unwrap()],
        "{stdout}"
    );
    assert_eq!(
        target_stderr(&run.outcome.stderr_text()),
        "",
        "nothing from memwarden's Python side"
    );

    // Bare, with the same PYTHONPATH: the same sys.path and sitecustomize, NumPy's handler.
    let bare = run_bare(&python, &script, Some(user_path), &scratch);
    assert_success(&bare, "the script bare");
    let bare_stdout = bare.stdout_text();
    assert_eq!(value(&bare_stdout, "main"), ["default_allocator"]);
    assert_eq!(value(&stdout, "path"), value(&bare_stdout, "path"));
    // The error state the program sees is NumPy's own, in and out of `np.errstate`; under
    // memwarden the importing context holds it (so that each ufunc call reads it from
    // CPython's cache, as a thread without a context does bare).
    for key in ["errors", "errors-raised", "errors-after"] {
        assert_eq!(value(&stdout, key), value(&bare_stdout, key), "{key}");
        assert_eq!(value(&stdout, key).len(), 1, "{key}:\n{stdout}");
    }
    assert_eq!(value(&stdout, "state-held"), ["True"], "{stdout}");
    assert_eq!(
        value(&bare_stdout, "state-held"),
        ["False"],
        "{bare_stdout}"
    );
    assert_eq!(
        value(&stdout, "sitecustomize"),
        value(&bare_stdout, "sitecustomize")
    );
}

#[test]
fn without_a_user_sitecustomize_python_finds_its_own_and_an_error_in_one_shows_as_python_shows_it()
{
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_user_site");
    let script = Script::new(&scratch, "handler.py", SCRIPT);

    // No PYTHONPATH at all: memwarden's module is not left behind as `sitecustomize`; the
    // one Python finds bare (none, or the system's, as Debian's Python has) is the one.
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the script under memwarden");
    let stdout = run.outcome.stdout_text();
    assert_eq!(value(&stdout, "main"), ["memwarden"], "{stdout}");
    let bare = run_bare(&python, &script, None, &scratch);
    assert_success(&bare, "the script bare");
    let bare_stdout = bare.stdout_text();
    assert_eq!(
        value(&stdout, "sitecustomize"),
        value(&bare_stdout, "sitecustomize"),
        "{stdout}"
    );
    assert!(!value(&stdout, "path")[0].contains("/.python"), "{stdout}");

    // A user's sitecustomize that raises: Python's own message, and the program runs on.
    let user = scratch.path().join("user");
    std::fs::create_dir_all(&user).expect("user folder");
    std::fs::write(user.join("sitecustomize.py"), "raise NameError('boom')\n").expect("file");
    let user_path = user.to_str().expect("utf-8 path");
    let run = run_script(
        &scratch,
        &python,
        &script,
        &[],
        &[("PYTHONPATH", user_path)],
    );
    assert_success(&run.outcome, "the script under memwarden");
    let bare = run_bare(&python, &script, Some(user_path), &scratch);
    assert_eq!(
        bare.stderr_text(),
        "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nNameError: boom\n"
    );
    assert_eq!(
        target_stderr(&run.outcome.stderr_text()),
        bare.stderr_text()
    );
    assert_eq!(
        value(&run.outcome.stdout_text(), "main"),
        ["memwarden"],
        "the handler is installed all the same"
    );
}

#[test]
fn memwardens_sitecustomize_never_breaks_a_python_it_cannot_serve() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_site_alone");
    let script = Script::new(&scratch, "handler.py", SCRIPT);
    // A run leaves its sitecustomize in DIR/.python: use it without the preload.
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the script under memwarden");
    let site = run.dir.join(".python");
    let site = site.to_str().expect("utf-8 path");
    let bare = |library: Option<&str>| {
        let mut command = std::process::Command::new(&python);
        command
            .arg(script.arg())
            .env("PYTHONPATH", site)
            .env_remove("LD_PRELOAD")
            .current_dir(scratch.path());
        if let Some(library) = library {
            command.env("MEMWARDEN_LIBRARY", library);
        }
        run_watched(command, None, WATCHDOG, &scratch)
    };

    // A child that dropped LD_PRELOAD but kept PYTHONPATH: not profiled, nothing to say.
    let alone = bare(None);
    assert_success(&alone, "the script with memwarden's sitecustomize alone");
    assert_eq!(value(&alone.stdout_text(), "main"), ["default_allocator"]);
    assert_eq!(alone.stderr_text(), "");

    // The program runs on with NumPy's own handler, and memwarden says one line.
    let runs_on_saying = |outcome: &Outcome, what: &str, line_start: &str| {
        assert_success(outcome, what);
        assert_eq!(value(&outcome.stdout_text(), "main"), ["default_allocator"]);
        let stderr = outcome.stderr_text();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with(line_start), "{stderr}");
    };

    // A loaded library without the handler's exports.
    runs_on_saying(
        &bare(Some("libc.so.6")),
        "the script with a library lacking the exports",
        "memwarden: NumPy's data-memory handler not installed (",
    );

    // The installer gone from the folder (it is loaded only when NumPy is imported).
    std::fs::remove_file(run.dir.join(".python").join("memwarden_numpy.py")).expect("remove");
    runs_on_saying(
        &bare(Some("libc.so.6")),
        "the script without memwarden's NumPy installer",
        "memwarden: cannot watch the import of numpy._core._multiarray_umath",
    );
}

#[test]
fn a_python_started_by_a_shell_gets_the_handler_too() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_from_shell");
    let script = Script::new(&scratch, "handler.py", SCRIPT);
    let line = format!("{} {} | grep '^main '", python.display(), script.arg());
    let run = profile(&scratch, &["/bin/sh", "-c", &line]);
    assert_success(&run.outcome, "sh -c 'python … | grep'");
    assert_eq!(run.outcome.stdout_text(), "main memwarden\n");
}

/// Imports NumPy, then runs a second Python that does too, verbose about its imports.
const TWO_PYTHONS: &str = r#"import os, subprocess, sys
import numpy
child = subprocess.run([sys.executable, "-c", "import numpy"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONVERBOSE="1"))
print("child", child.returncode)
for line in child.stderr.splitlines():
    if ".python" in line and " matches " in line:
        print("loaded", os.path.basename(line.split()[1]))
"#;

#[test]
fn memwardens_python_files_are_compiled_once_and_kept_for_the_next_run() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_bytecode");
    let script = Script::new(&scratch, "two.py", TWO_PYTHONS);
    let cache = scratch.path().join("cache");
    let cache_var = cache.to_str().expect("utf-8 path");
    let tag = std::process::Command::new(&python)
        .args(["-c", "import sys; print(sys.implementation.cache_tag)"])
        .output()
        .expect("python runs");
    let tag = String::from_utf8_lossy(&tag.stdout).trim().to_owned();
    // In the order a Python loads them.
    let pycs = [
        format!("sitecustomize.{tag}.pyc"),
        format!("memwarden_numpy.{tag}.pyc"),
    ];
    let env = [
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("MEMWARDEN_SYMBOL_CACHE", cache_var),
    ];
    // The first Python of a run compiles the files, even told not to write bytecode; the
    // second loads what it left, and the run keeps that for the next.
    let first = run_script(&scratch, &python, &script, &[], &env);
    assert_success(&first.outcome, "the first run");
    let stdout = first.outcome.stdout_text();
    assert_eq!(value(&stdout, "child"), ["0"], "{stdout}");
    assert_eq!(value(&stdout, "loaded"), pycs, "{stdout}");
    let listed = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|listing| listing.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let kept = listed(&cache.join("python"));
    assert_eq!(
        kept.len(),
        1,
        "one folder for this version of the files: {kept:?}"
    );
    assert_eq!(listed(&kept[0]).len(), pycs.len(), "{:?}", listed(&kept[0]));
    for pyc in &pycs {
        assert!(kept[0].join(pyc).is_file(), "{pyc} kept");
    }

    // Writing them imports nothing the program would not have imported.
    let modules = Script::new(
        &scratch,
        "modules.py",
        "import sys\nprint('modules', ' '.join(sorted(sys.modules)))\n",
    );
    let fresh = [env[0], ("MEMWARDEN_SYMBOL_CACHE", "off")];
    let profiled = run_script(&scratch, &python, &modules, &[], &fresh);
    assert_success(&profiled.outcome, "the module list under memwarden");
    assert!(profiled
        .dir
        .join(".python/__pycache__")
        .join(&pycs[0])
        .exists());
    let bare = run_bare(&python, &modules, None, &scratch);
    assert_success(&bare, "the module list bare");
    assert_eq!(
        value(&profiled.outcome.stdout_text(), "modules"),
        value(&bare.stdout_text(), "modules")
    );

    // The next run's first Python loads them too.
    let verbose = [env[0], env[1], ("PYTHONVERBOSE", "1")];
    let second = run_script(&scratch, &python, &script, &[], &verbose);
    assert_success(&second.outcome, "the second run");
    let stderr = second.outcome.stderr_text();
    for pyc in &pycs {
        assert!(
            stderr.contains(&format!("{pyc} matches")),
            "{pyc} not loaded:\n{stderr}"
        );
    }
    assert_eq!(value(&second.outcome.stdout_text(), "loaded"), pycs);
}
