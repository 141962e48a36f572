/* Per-thread scratch for the fused passes (passes.c) and the cardinality DP
 * (probmoe/native/cardinality.c): one 64-byte aligned buffer per thread, grown on demand and kept
 * for the next call, so a pass allocates nothing in the steady state. Each library links its own
 * copy of this unit. */
#include <stddef.h>
#include <stdlib.h>

static __thread float *scratch_buf = NULL;
static __thread size_t scratch_cap = 0;

/* This thread's scratch of at least `floats` floats, or NULL when it cannot be allocated. */
float *pm_scratch(size_t floats) {
    if (floats > scratch_cap) {
        free(scratch_buf);
        scratch_buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        scratch_cap = scratch_buf ? floats : 0;
    }
    return scratch_buf;
}
