/* Benchmark workload "churn": one thread, about 3 million allocator calls (malloc,
 * calloc, realloc, posix_memalign, free), 16 B to 4 KiB, tens of thousands of blocks
 * live. Usage: churn [CALLS] */
#include <stdio.h>
#include "churn.h"

static struct churn state = {.rng = 88172645463325252ull};

int main(int argc, char **argv) {
    uint64_t target = argc > 1 ? strtoull(argv[1], NULL, 10) : 3000000;
    size_t live = 0;
    while (state.calls < target) {
        void *old = churn_step(&state);
        if (old != NULL) {
            free(old);
            state.calls++;
        }
    }
    for (size_t i = 0; i < CHURN_SLOTS; i++) {
        live += state.slot[i] != NULL;
        free(state.slot[i]);
    }
    printf("churn: %llu calls, %zu blocks live at the end, checksum %llu\n",
           (unsigned long long)state.calls, live, (unsigned long long)state.checksum);
    return 0;
}
