//! `memwarden run`: checks the target, starts it with the preload in its environment,
//! works on its stacks as they appear (`look_ahead`), reaps it and every orphaned
//! descendant as a subreaper, records their statuses in `run.json`, then hands the output
//! folder to the report stage while the profiles are compacted; with `--error-exitcode`, a
//! heap error the report found decides the exit status.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use memwarden::parallel::spawn_or_run;
use memwarden::profile::OutputDir;
use memwarden::report::warm::Ahead;
use memwarden::report::Generated;
use memwarden::run_record::{RunRecord, RUN_RECORD_FILE};
use memwarden::symbolize::Symbolizer;
use memwarden::Exit;

use crate::args::RunArgs;
use crate::fail_args::{self, FAIL_VARIABLE, SEED_VARIABLE};
use crate::look_ahead::LookAhead;
use crate::{
    library_pools, output_dir, preload_lib, python_bytecode, python_env, run_signals, target_check,
};

/// Variable naming the output folder, read by the preload.
const OUTPUT_DIR_VARIABLE: &str = "MEMWARDEN_OUTPUT_DIR";
/// Variable bounding the stack depth, read by the preload.
const MAX_DEPTH_VARIABLE: &str = "MEMWARDEN_MAX_DEPTH";
/// Exit status when the root process's end could not be observed.
const UNKNOWN_STATUS: i32 = 1;

/// Runs the command. `Err` is a refusal before the target started (one line); once it
/// has started the result is the target's own exit status, whatever happens to the report.
/// Meant to be called once, by `main` just before it exits: the report's memory is left to
/// the exit ([`crate::leave_to_exit`]).
pub fn run(args: &RunArgs, colour: bool) -> Result<i32, String> {
    let program = target_check::resolve(&args.command[0])?;
    target_check::check(&program)?;
    let library = preload_lib::locate()?;
    let ld_preload = preload_lib::ld_preload(&library, std::env::var_os("LD_PRELOAD").as_deref())?;
    let gate = args.leak.gate()?;
    let (out_dir, discard) = output_dir::prepare(&args.output)?;
    // Waited for when `run` returns: long done by then.
    let _deleting = discard.delete_in_background();
    let symbol_cache = memwarden::symbolize::disk_cache::default_dir();
    let kept_bytecode = symbol_cache.as_deref().map(python_bytecode::cache_dir);
    let python = python_env::prepare(
        &out_dir,
        &library,
        std::env::var_os("PYTHONPATH").as_deref(),
    )?;
    if python.is_some() {
        python_bytecode::offer(&out_dir, kept_bytecode.as_deref());
    } else {
        say("memwarden: warning: the output folder's path holds ':', which PYTHONPATH cannot carry; NumPy array data is seen through malloc only");
    }

    let command: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let started_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut record = RunRecord::new(
        command,
        Some(program.to_string_lossy().into_owned()),
        started_unix_ms,
    );
    let record_path = out_dir.join(RUN_RECORD_FILE);
    record.write(&record_path).map_err(|e| e.to_string())?;

    become_subreaper()?;
    let mut target = Command::new(&program);
    target
        .arg0(&args.command[0])
        .args(&args.command[1..])
        .env("LD_PRELOAD", ld_preload)
        .env(OUTPUT_DIR_VARIABLE, &out_dir);
    for (variable, value) in python.iter().flatten() {
        target.env(variable, value);
    }
    if args.python_objects {
        let existing = std::env::var_os("PYTHONMALLOC");
        if let Some((variable, value)) = python_env::objects_through_malloc(existing.as_deref()) {
            target.env(variable, value);
        }
    }
    for (variable, value) in library_pools::variables(|name| std::env::var_os(name).is_some()) {
        target.env(variable, value);
    }
    if let Some(depth) = args.max_depth {
        target.env(MAX_DEPTH_VARIABLE, depth.to_string());
    }
    // Without --fail, nothing fails: no rule from memwarden's own environment leaks in.
    if args.fail.is_empty() {
        target.env_remove(FAIL_VARIABLE).env_remove(SEED_VARIABLE);
    } else {
        target
            .env(FAIL_VARIABLE, fail_args::variable(&args.fail))
            .env(SEED_VARIABLE, args.seed.to_string());
    }
    // Likewise, no guard option the command line did not give.
    for (variable, value) in args.guard.variables() {
        match value {
            Some(value) => target.env(variable, value),
            None => target.env_remove(variable),
        };
    }
    for (variable, value) in args.leak.variables() {
        match value {
            Some(value) => target.env(variable, value),
            None => target.env_remove(variable),
        };
    }
    // The child starts with default dispositions: memwarden ignores or relays the
    // signals meant to stop it only once the child has been spawned (`run_signals`).
    let child = target
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    output_dir::fail_writes_past_file_limit();
    let root = child.id();
    record.root_pid = Some(root);
    // Written again at once, so that a run whose memwarden is killed still names its root.
    if let Err(e) = record.write(&record_path) {
        say(&format!("memwarden: error: {e}"));
    }
    let look_ahead = LookAhead::start(&out_dir, symbol_cache.clone());

    let relaying = run_signals::while_running(root);
    reap_all(root, &mut record.exits);
    relaying.stop();
    // Stopped before the profiles are compacted: it reads them.
    let (mut symbolizer, ahead) = match look_ahead {
        Some(look_ahead) => look_ahead.finish(),
        None => (
            Symbolizer::with_disk_cache(symbol_cache.clone()),
            Ahead::default(),
        ),
    };

    record.complete = true;
    if let Err(e) = record.write(&record_path) {
        say(&format!("memwarden: error: {e}"));
    }
    let status = record
        .exits
        .get(&root)
        .map_or(UNKNOWN_STATUS, |exit| exit.shell_status());
    let gate_check = args.leak.check;
    // Once loaded, the report no longer reads the profiles: they are compacted meanwhile
    // (into new files: the ones loaded, whose frame areas are mapped, stay as they are).
    // Every process is reaped, so none writes its profile any more.
    let mut loaded = memwarden::profile::load_finished_dir(&out_dir);
    let rendered = std::thread::scope(|scope| {
        spawn_or_run(scope, || compact_profiles(&out_dir));
        if let (Some(_), Some(kept)) = (&python, &kept_bytecode) {
            spawn_or_run(scope, || python_bytecode::keep(&out_dir, kept));
        }
        let options = memwarden::report::Options {
            top: args.top,
            colour,
            leak_gate: gate,
            symbol_cache,
            all_stacks: args.all_stacks,
        };
        render_report(&out_dir, &mut loaded, &mut symbolizer, ahead, &options)
    });
    let found = match &rendered {
        Some((found, _)) => *found,
        None => Found {
            heap_errors: any_heap_error(&out_dir),
            leaks_fail: false,
        },
    };
    crate::leave_to_exit((loaded, symbolizer, rendered));
    Ok(match args.guard.error_exitcode {
        Some(code) if found.heap_errors || (gate_check && found.leaks_fail) => i32::from(code),
        _ => status,
    })
}

/// Every process is gone: shrink each profile file to its used size. A file that cannot be
/// compacted is left as it is (the report step then says what is wrong with it).
fn compact_profiles(out_dir: &Path) {
    let Ok(paths) = memwarden::profile::profile_paths(out_dir) else {
        return;
    };
    for path in paths {
        let _ = memwarden::profile::compact_profile_file(&path);
    }
}

/// Writes a line on stderr; a closed stderr is not worth dying for.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// What the report found that can decide the exit status.
#[derive(Clone, Copy)]
struct Found {
    heap_errors: bool,
    leaks_fail: bool,
}

/// Prints the summary of the report on the profiles `loaded` from `out_dir`, symbolized
/// with `symbolizer` and taking up what the look-ahead made of the stacks (`ahead`);
/// returns whether any process of the run recorded a
/// heap error and whether the leak gate fails the run, with the report, or `None` when
/// there is no report.
fn render_report(
    out_dir: &Path,
    loaded: &mut Result<OutputDir, memwarden::Error>,
    symbolizer: &mut Symbolizer,
    ahead: Ahead,
    options: &memwarden::report::Options,
) -> Option<(Found, Generated)> {
    let generated = loaded
        .as_mut()
        .map_err(|e| e.to_string())
        .and_then(|loaded| {
            memwarden::report::generate_loaded(out_dir, loaded, options, symbolizer, ahead)
                .map_err(|e| e.to_string())
        });
    match generated {
        Ok(done) => {
            let _ = std::io::stderr().write_all(done.summary.as_bytes());
            let found = Found {
                heap_errors: done.report.processes.iter().any(|p| p.error_count > 0),
                leaks_fail: options.leak_gate.verdict(&done.report).fails,
            };
            Some((found, done))
        }
        Err(e) => {
            say(&format!("memwarden: error: no report: {e}"));
            None
        }
    }
}

/// Without a report (a profile is corrupt, say), whether any profile that can still be
/// read recorded a heap error.
fn any_heap_error(out_dir: &Path) -> bool {
    let Ok(paths) = memwarden::profile::profile_paths(out_dir) else {
        return false;
    };
    paths.iter().any(|path| {
        memwarden::profile::read_profile_file(path).is_ok_and(|profile| profile.error_count > 0)
    })
}

/// Orphaned descendants are reparented to this process, so it can reap them.
fn become_subreaper() -> Result<(), String> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag; no memory is passed.
    let result = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        return Err(format!("cannot become a child subreaper: {error}"));
    }
    Ok(())
}

/// Waits for every child (the root and, as subreaper, every orphan reparented to us)
/// until none is left, recording how each ended.
fn reap_all(root: u32, exits: &mut BTreeMap<u32, Exit>) {
    let mut told_about_leftovers = false;
    loop {
        let root_done = exits.contains_key(&root);
        let mut status = 0;
        let flags = if root_done && !told_about_leftovers {
            libc::WNOHANG
        } else {
            0
        };
        // SAFETY: waitpid writes only to `status`, a valid, exclusive i32.
        let pid = unsafe { libc::waitpid(-1, &mut status, flags) };
        if pid > 0 {
            if let Some(exit) = Exit::from_wait_status(status) {
                exits.insert(pid as u32, exit);
            }
            continue;
        }
        if pid == 0 {
            say("memwarden: the command exited; waiting for the processes it left running");
            told_about_leftovers = true;
            continue;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            _ => break, // ECHILD: nobody left.
        }
    }
}
