//! Python process trees: a `multiprocessing` pool, with the `fork` and with the `spawn`
//! start method, has every worker profiled in a section of its own, with the Python frames
//! of the worker function, and NumPy's data seen through memwarden's handler there too
//! (inherited by a fork, installed again by a spawned interpreter); a forked child's profile
//! is whole even while its parent goes on recording new Python code.

mod common;
use common::python::*;
use common::*;

/// Two tasks on a pool of two, each waiting at a barrier for the other: each worker runs
/// exactly one, so each worker's figures are known.
const SCRIPT: &str = r#"import multiprocessing as mp
import sys
import numpy as np

barrier = None


def start(shared):
    global barrier
    barrier = shared


def work(n):
    a = np.zeros(n)  # WORK
    barrier.wait(timeout=60)
    return float(a.size)


if __name__ == "__main__":
    context = mp.get_context(sys.argv[1])
    pool = context.Pool(2, initializer=start, initargs=(context.Barrier(2),))
    print(sum(pool.map(work, [1_000_000, 2_000_000], chunksize=1)))
    pool.close()
    pool.join()
"#;

fn pool_workers_are_profiled_with_their_python_frames(method: &str) {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new(&format!("python_pool_{method}"));
    let script = Script::new(&scratch, "pool.py", SCRIPT);
    let run = run_script(&scratch, &python, &script, &[method], &[]);
    assert_success(&run.outcome, "the pool under memwarden");
    assert_eq!(run.outcome.stdout_text(), "3000000.0\n");

    let main = run.report.main_process(&script);
    let work = script.line_of("# WORK");
    let describe = || -> String {
        run.report
            .processes
            .iter()
            .map(|p| p.describe(&script))
            .collect()
    };
    let workers: Vec<&PyProcess> = run
        .report
        .processes
        .iter()
        .filter(|p| p.pid != main.pid && p.stacks_at(&script, work).next().is_some())
        .collect();
    let mut data: Vec<u64> = workers
        .iter()
        .map(|p| {
            p.numpy_stacks_at(&script, work)
                .map(|s| s.allocated_bytes)
                .sum()
        })
        .collect();
    data.sort_unstable();
    assert_eq!(
        data,
        [8_000_000, 16_000_000],
        "NumPy data at `work`'s line, by worker\n{}",
        describe()
    );
    for worker in &workers {
        assert_eq!(worker.exit_code(), Some(0), "{}", describe());
        for stack in worker.stacks_at(&script, work) {
            let frame = frame_in(&stack.frames, &script).expect("frame in the script");
            assert_eq!(frame.function.as_deref(), Some("work"), "{}", describe());
        }
        // A forked worker is the parent's image; a spawned one is a new interpreter.
        assert_eq!(worker.forked, method == "fork", "{}", describe());
    }
    assert_eq!(main.allocated_at(&script, work), 0, "{}", describe());
}

#[test]
fn fork_pool_workers_are_profiled_with_their_python_frames() {
    pool_workers_are_profiled_with_their_python_frames("fork");
}

#[test]
fn spawn_pool_workers_are_profiled_with_their_python_frames() {
    pool_workers_are_profiled_with_their_python_frames("spawn");
}

/// Forks, then makes new code objects at once (each one a code record in the profile)
/// while the child is still taking its copy of the profile.
const FORK_RACE: &str = r#"import os
pids = []
for round in range(20):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    for i in range(50):
        exec("def f_%d_%d():\n    return [0] * 100\nf_%d_%d()" % (round, i, round, i))
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
"#;

#[test]
fn a_forked_child_keeps_the_code_records_of_the_fork_while_its_parent_adds_more() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_fork_race");
    let script = Script::new(&scratch, "race.py", FORK_RACE);
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the forking script under memwarden");
    let children = run.report.processes.iter().filter(|p| p.forked).count();
    assert_eq!(children, 20, "{:?}", run.report.argvs());
}
