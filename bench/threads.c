/* Benchmark workload "threads": the churn of bench/churn.c on two threads at once, each
 * with its own table; every eighth block a thread takes out of its table is handed to
 * the other thread, which frees it. Two threads of 1.5 million calls each make the
 * 3 million of churn. Usage: threads [CALLS PER THREAD] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include "churn.h"

#define MAILBOX 64

struct worker {
    struct churn churn;
    _Atomic(void *) inbox[MAILBOX]; /* blocks the other thread handed over, to free */
    struct worker *other;
    uint64_t target;
    uint64_t handed;
};

static struct worker workers[2];

static void *run(void *arg) {
    struct worker *w = arg;
    size_t next_box = 0;
    while (w->churn.calls < w->target) {
        void *old = churn_step(&w->churn);
        if (old != NULL && w->churn.calls % 8 == 0) {
            /* Hand it over; free whatever the other thread has not collected yet. */
            old = atomic_exchange(&w->other->inbox[next_box++ % MAILBOX], old);
            w->handed++;
        }
        if (old != NULL) {
            free(old);
            w->churn.calls++;
        }
        void *mine = atomic_exchange(&w->inbox[w->churn.calls % MAILBOX], NULL);
        if (mine != NULL) {
            free(mine);
            w->churn.calls++;
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t target = argc > 1 ? strtoull(argv[1], NULL, 10) : 1500000;
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        workers[i].churn.rng = 88172645463325252ull + (uint64_t)i * 0x9e3779b97f4a7c15ull;
        workers[i].other = &workers[1 - i];
        workers[i].target = target;
        pthread_create(&t[i], NULL, run, &workers[i]);
    }
    uint64_t calls = 0, handed = 0;
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        calls += workers[i].churn.calls;
        handed += workers[i].handed;
    }
    for (int i = 0; i < 2; i++) {
        for (size_t k = 0; k < CHURN_SLOTS; k++) free(workers[i].churn.slot[k]);
        for (size_t k = 0; k < MAILBOX; k++) free(atomic_load(&workers[i].inbox[k]));
    }
    printf("threads: %llu calls, %llu blocks freed by the other thread\n",
           (unsigned long long)calls, (unsigned long long)handed);
    return 0;
}
