//! Store → analysis → report, across processes: a run's profiles are read, analysed and
//! built into the report one process at a time on each core. The processes of a run are
//! independent until the report joins them, and a run of several large ones (a process
//! pool, each worker importing the same libraries) otherwise left a core idle for most of
//! the report.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{Scope, ScopedJoinHandle};

/// Work started on a thread of a scope, or done already on the calling thread because no
/// thread could be started (a tight `ulimit -v` leaves no room for another stack, or the
/// process is at its thread limit): the report is the same, only slower.
pub enum Task<'scope, T> {
    /// Running on its own thread.
    Thread(ScopedJoinHandle<'scope, Option<T>>),
    /// Run on the calling thread, with this result.
    Done(T),
}

impl<T> Task<'_, T> {
    /// The work's result; a panic in its thread goes on in the caller.
    pub fn join(self) -> T {
        match self {
            Task::Thread(thread) => match thread.join() {
                Ok(Some(result)) => result,
                // The thread always finds the work: only a thread that failed to start
                // leaves it to the caller, and then there is no thread to join.
                Ok(None) => unreachable!("a started thread always runs its work"),
                Err(panic) => std::panic::resume_unwind(panic),
            },
            Task::Done(result) => result,
        }
    }
}

/// Runs `work` on a new thread of `scope`, or on this one if no thread can be started.
pub fn spawn_or_run<'scope, T: Send + 'scope>(
    scope: &'scope Scope<'scope, '_>,
    work: impl FnOnce() -> T + Send + 'scope,
) -> Task<'scope, T> {
    let slot = Arc::new(Mutex::new(Some(work)));
    let theirs = Arc::clone(&slot);
    let started = std::thread::Builder::new().spawn_scoped(scope, move || {
        let work = theirs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        work.map(|work| work())
    });
    match started {
        Ok(thread) => Task::Thread(thread),
        Err(_) => {
            let work = slot
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .take();
            match work {
                Some(work) => Task::Done(work()),
                None => unreachable!("a thread that failed to start ran nothing"),
            }
        }
    }
}

/// The cores this process may use, asked once: the standard library reads the cgroup's
/// CPU quota files at every call, and a report maps work over the processes four times.
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `work` applied to each of `items`, the results in the items' order. The items are
/// shared among as many threads as the machine has cores (never more than there are
/// items); each thread takes the next item not yet taken, so one large item does not hold
/// back the others. With one core or one item, all runs on the calling thread.
pub(crate) fn map_in_order<T: Sync, R: Send>(items: &[T], work: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = cores().min(items.len());
    if threads <= 1 {
        return items.iter().map(work).collect();
    }
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, R)>> = Mutex::new(Vec::with_capacity(items.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            // A thread that cannot be started takes its share on this one.
            spawn_or_run(scope, || loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(index) else {
                    break;
                };
                let result = work(item);
                done.lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push((index, result));
            });
        }
    });
    let mut done = done
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    done.sort_unstable_by_key(|&(index, _)| index);
    done.into_iter().map(|(_, result)| result).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_keep_the_order_of_the_items() {
        let items: Vec<u64> = (0..1000).collect();
        // Uneven work, so that threads finish out of order.
        let squares = map_in_order(&items, |&n| {
            if n % 7 == 0 {
                std::thread::yield_now();
            }
            n * n
        });
        assert_eq!(squares, items.iter().map(|n| n * n).collect::<Vec<_>>());
        assert!(map_in_order(&[] as &[u64], |&n| n).is_empty());
        assert_eq!(map_in_order(&[5u64], |&n| n + 1), [6]);
    }
}
