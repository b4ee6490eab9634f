/* Per-thread slots of the preload, in static TLS (initial-exec model).
 * A preloaded library is loaded at start-up, so its static TLS is reserved
 * with the main program's: no lazy allocation on a thread's first access. */
#include <stdint.h>

#define MEMWARDEN_THREAD_SLOTS 8

static __thread __attribute__((tls_model("initial-exec")))
uint64_t memwarden_slots[MEMWARDEN_THREAD_SLOTS];

uint64_t *memwarden_thread_slots(void) { return memwarden_slots; }
