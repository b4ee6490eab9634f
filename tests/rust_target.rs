//! A Rust program under the profiler: its runtime allocates from inside glibc calls that
//! hold the thread's own lock (`pthread_getattr_np`, as the main thread and every spawned
//! thread start), so the preload must find each thread's stack without asking glibc. The
//! run must finish, and each thread's block be charged to the function that made it.

mod common;
use common::*;

/// GIVEN a main thread holding 3 MiB + 5 bytes from `main_block` while two `std::thread`s
/// hold 6 MiB + 11 and 9 MiB + 13 bytes from their own functions, all three at once
/// (barriers), then everything freed.
const THREE_BLOCKS: &str = r#"
use std::hint::black_box;
use std::sync::{Arc, Barrier};

const MIB: usize = 1024 * 1024;

#[inline(never)]
fn main_block() -> Vec<u8> {
    black_box(vec![7u8; 3 * MIB + 5])
}

#[inline(never)]
fn worker_one_block() -> Vec<u8> {
    black_box(vec![1u8; 6 * MIB + 11])
}

#[inline(never)]
fn worker_two_block() -> Vec<u8> {
    black_box(vec![2u8; 9 * MIB + 13])
}

fn main() {
    let main_held = main_block();
    let held = Arc::new(Barrier::new(3));
    let done = Arc::new(Barrier::new(3));
    let makers: [fn() -> Vec<u8>; 2] = [worker_one_block, worker_two_block];
    let workers: Vec<_> = makers
        .into_iter()
        .map(|make| {
            let (held, done) = (Arc::clone(&held), Arc::clone(&done));
            std::thread::spawn(move || {
                let block = make();
                held.wait();
                done.wait();
                block.len()
            })
        })
        .collect();
    held.wait();
    println!("three blocks held");
    done.wait();
    let total: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    println!("{}", total + main_held.len());
}
"#;

/// The bytes at the peak of the stacks with `function` among their frames.
fn at_peak_through(process: &Process, function: &str) -> u64 {
    process
        .stacks
        .iter()
        .filter(|s| {
            s.frames.iter().any(|f| {
                f.function
                    .as_deref()
                    .is_some_and(|name| name.ends_with(function))
            })
        })
        .map(|s| s.at_peak_bytes)
        .sum()
}

#[test]
fn a_rust_program_with_threads_runs_to_the_end_with_each_block_where_it_was_made() {
    let scratch = Scratch::new("rust_threads");
    let program = scratch.compile_rust("rust_threads", THREE_BLOCKS);

    let run = profile(&scratch, &[program.arg()]);

    assert_success(&run.outcome, "memwarden run on a Rust program");
    assert_eq!(
        run.outcome.stdout_text(),
        format!("three blocks held\n{}\n", 18 * MIB + 29)
    );
    let p = run.report.only_process();
    assert_eq!(
        at_peak_through(p, "::main_block"),
        3 * MIB + 5,
        "{}",
        p.describe()
    );
    assert_eq!(
        at_peak_through(p, "::worker_one_block"),
        6 * MIB + 11,
        "{}",
        p.describe()
    );
    assert_eq!(
        at_peak_through(p, "::worker_two_block"),
        9 * MIB + 13,
        "{}",
        p.describe()
    );
    p.assert_peak_near(18 * MIB + 29);
}
