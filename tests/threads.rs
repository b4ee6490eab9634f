//! Threads: the peak reached while two threads hold memory, and exact counters when
//! several threads allocate and free at once (some blocks freed by another thread).

mod common;
use common::*;

/// GIVEN two threads that each allocate in their own function and hold the block until
/// the main thread has seen both hold theirs (barriers), then free it.
const TWO_THREADS: &str = r#"
#include <pthread.h>
pthread_barrier_t held, done;
NOINLINE void *thread_one_alloc(void) { return malloc(6 * MiB + 11); }
NOINLINE void *thread_two_alloc(void) { return malloc(9 * MiB + 13); }
NOINLINE void *worker_one(void *arg) {
    void *p = thread_one_alloc();
    pthread_barrier_wait(&held);
    pthread_barrier_wait(&done);
    free(p);
    return arg;
}
NOINLINE void *worker_two(void *arg) {
    void *p = thread_two_alloc();
    pthread_barrier_wait(&held);
    pthread_barrier_wait(&done);
    free(p);
    return arg;
}
int main(void) {
    pthread_t t1, t2;
    pthread_barrier_init(&held, NULL, 3);
    pthread_barrier_init(&done, NULL, 3);
    pthread_create(&t1, NULL, worker_one, NULL);
    pthread_create(&t2, NULL, worker_two, NULL);
    pthread_barrier_wait(&held);
    say("both threads hold their blocks\n");
    pthread_barrier_wait(&done);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    return 0;
}
"#;

#[test]
fn peak_while_two_threads_hold_memory_is_split_by_thread_function() {
    let scratch = Scratch::new("threads_peak");
    let prog = scratch.compile("threads_peak", TWO_THREADS);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    assert_eq!(
        p.at_peak("thread_one_alloc"),
        6 * MIB + 11,
        "{}",
        p.describe()
    );
    assert_eq!(
        p.at_peak("thread_two_alloc"),
        9 * MIB + 13,
        "{}",
        p.describe()
    );
    p.assert_peak_near(15 * MIB + 24);
    assert_eq!(p.live("thread_one_alloc"), 0);
    assert_eq!(p.live("thread_two_alloc"), 0);
}

/// GIVEN four threads, each allocating 20000 blocks of known sizes in churn_alloc(), keeping
/// a ring of 64, and handing every eighth block to the next thread to free.
const CHURN: &str = r#"
#include <pthread.h>
#include <stdatomic.h>
#define THREADS 4
#define ROUNDS 20000
#define RING 64
/* One slot per thread: a block handed over for the next thread to free. */
_Atomic(void *) handoff[THREADS];
NOINLINE void *churn_alloc(size_t size) { return malloc(size); }
NOINLINE void *worker(void *arg) {
    long me = (long)arg;
    void *ring[RING] = {0};
    for (long i = 0; i < ROUNDS; i++) {
        size_t size = (size_t)(i % 512) + 1 + (size_t)me;
        void *p = churn_alloc(size);
        if (i % 8 == 0) {
            void *old = atomic_exchange(&handoff[(me + 1) % THREADS], p);
            free(old);
        } else {
            free(ring[i % RING]);
            ring[i % RING] = p;
        }
        void *mine = atomic_exchange(&handoff[me], NULL);
        free(mine);
    }
    for (int i = 0; i < RING; i++) free(ring[i]);
    return NULL;
}
int main(void) {
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++) free(atomic_exchange(&handoff[i], NULL));
    say("churn done\n");
    return 0;
}
"#;

#[test]
fn concurrent_allocations_and_cross_thread_frees_are_all_counted() {
    let scratch = Scratch::new("threads_churn");
    let prog = scratch.compile("threads_churn", CHURN);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    let (threads, rounds) = (4u64, 20000u64);
    let bytes: u64 = (0..threads)
        .map(|me| (0..rounds).map(|i| i % 512 + 1 + me).sum::<u64>())
        .sum();
    assert_eq!(
        p.allocations("churn_alloc"),
        threads * rounds,
        "{}",
        p.describe()
    );
    assert_eq!(p.allocated("churn_alloc"), bytes, "{}", p.describe());
    assert_eq!(
        p.live("churn_alloc"),
        0,
        "every block was freed\n{}",
        p.describe()
    );
    assert_eq!(p.live_blocks("churn_alloc"), 0);
    // At any moment each thread holds at most its ring, its in-flight block, and the
    // hand-over slots hold one each: the peak cannot exceed that.
    let most = (threads * 64 + threads + threads) * (512 + 3);
    let at_peak = p.at_peak("churn_alloc");
    assert!(
        at_peak > 0 && at_peak <= most,
        "at_peak {at_peak} not in (0, {most}]\n{}",
        p.describe()
    );
}
