/* Per-thread scratch for the fused passes (passes.c) and the cardinality DP
 * (cardinality.c): one 64-byte aligned buffer per thread, grown on demand and kept
 * for the next call, so a pass allocates nothing in the steady state. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

#include "kernels.h"

static __thread float *scratch_buf = NULL;
static __thread size_t scratch_cap = 0;

/* A thread-specific key whose destructor frees a thread's buffer when the thread exits (a Python
 * thread that calls a pass on a single tile runs it itself; without this its buffer leaks). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok = 0;
static void scratch_free(void *p) { free(p); }
static void scratch_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }

/* This thread's scratch of at least `floats` floats, or NULL when it cannot be allocated. */
float *pm_scratch(size_t floats) {
    if (floats > scratch_cap) {
        pthread_once(&scratch_once, scratch_init);
        free(scratch_buf);
        scratch_buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        scratch_cap = scratch_buf ? floats : 0;
        if (scratch_key_ok) pthread_setspecific(scratch_key, scratch_buf);
    }
    return scratch_buf;
}
