/* Counter-based uniforms: out[i] = u(seed, offset + i), the splitmix64 finaliser of
 * seed + (offset + i + 1) * golden, its top 24 bits over 2^24, in [0, 1). Each value depends on
 * (seed, index) alone, so any slice can be made anywhere, in any order, by any thread. The torch
 * reference is circuits.kernels.uniforms.reference (bit-identical). */
#include <stdint.h>

#include "kernels.h"

static inline uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline float uniform(uint64_t s, uint64_t o, int64_t i) {
    return (float)(mix(s + (o + (uint64_t)i) * 0x9E3779B97F4A7C15ULL) >> 40) * 0x1p-24f;
}

int64_t pm_uniforms(int64_t seed, int64_t offset, int64_t count, float *out, int64_t threads) {
    const uint64_t s = (uint64_t)seed, o = (uint64_t)offset + 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (count > (1 << 16))
    for (int64_t i = 0; i < count; i++) out[i] = uniform(s, o, i);
    return 0;
}

/* pm_uniforms on the calling thread: for a library that makes its uniforms tile by tile inside its
 * own parallel loop (cardinality.c links this unit). */
void pm_uniforms_serial(int64_t seed, int64_t offset, int64_t count, float *out) {
    const uint64_t s = (uint64_t)seed, o = (uint64_t)offset + 1;
    for (int64_t i = 0; i < count; i++) out[i] = uniform(s, o, i);
}
