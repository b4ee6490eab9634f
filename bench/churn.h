/* The churn shared by bench/churn.c and bench/threads.c: a deterministic stream of
 * malloc/calloc/realloc/posix_memalign/free calls, sizes 16 B to 4 KiB, over a table of
 * slots of which tens of thousands hold a live block at any time. Blocks are filled when
 * made and read before they go, as a program uses what it allocates, so the allocator
 * is not all the work there is. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHURN_SLOTS 65536

struct churn {
    void *slot[CHURN_SLOTS];
    size_t size[CHURN_SLOTS];
    uint64_t rng;
    uint64_t calls;    /* allocator calls made */
    uint64_t checksum; /* of the bytes read, so the reads are not optimised away */
};

static inline uint64_t churn_next(struct churn *c) {
    /* xorshift64*: fast, deterministic, good enough for a workload. */
    c->rng ^= c->rng >> 12;
    c->rng ^= c->rng << 25;
    c->rng ^= c->rng >> 27;
    return c->rng * 2685821657736338717ull;
}

/* Sizes from 16 B to 4 KiB, log-uniform: as many blocks of 16-31 B as of 2-4 KiB. */
static inline size_t churn_size(uint64_t r) {
    size_t base = (size_t)16 << ((r >> 60) % 8); /* 16 .. 2048 */
    return base + (size_t)((r >> 32) % base);   /* base .. 2 * base - 1 */
}

static inline void churn_read(struct churn *c, size_t i) {
    const unsigned char *b = c->slot[i];
    for (size_t k = 0; b != NULL && k < c->size[i]; k += 4) c->checksum += b[k];
}

/* One step: reads the block of a random slot, then replaces it (malloc, calloc,
 * posix_memalign), resizes it (realloc) or empties it. Returns the block taken out of
 * the table, which the caller frees (or, in the threaded workload, hands to another
 * thread to free). */
static inline void *churn_step(struct churn *c) {
    uint64_t r = churn_next(c);
    size_t i = (size_t)(r % CHURN_SLOTS);
    size_t size = churn_size(churn_next(c));
    void *old = c->slot[i], *p = NULL;
    churn_read(c, i);
    c->calls++;
    switch ((r >> 20) % 16) {
    case 0: case 1: case 2: case 3: case 4: case 5:
        p = malloc(size);
        break;
    case 6: case 7:
        p = calloc(1, size);
        break;
    case 8: case 9:
        p = realloc(old, size);
        if (p == NULL) return NULL; /* old stays in its slot */
        old = NULL;
        break;
    case 10:
        if (posix_memalign(&p, 64, size) != 0) p = NULL;
        break;
    default:
        size = 0;
        break;
    }
    if (p != NULL) memset(p, (int)(r & 0xff), size);
    c->slot[i] = p;
    c->size[i] = p != NULL ? size : 0;
    return old;
}
