/* Counter-based uniforms: out[i] = u(seed, offset + i), the splitmix64 finaliser of
 * seed + (offset + i + 1) * golden, its top 24 bits over 2^24, in [0, 1). Each value depends on
 * (seed, index) alone, so any slice can be made anywhere, in any order, by any thread. The torch
 * reference is circuits.kernels.uniforms.reference (bit-identical). */
#include <stdint.h>

#include "kernels.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

static inline uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline float uniform(uint64_t s, uint64_t o, int64_t i) {
    return (float)(mix(s + (o + (uint64_t)i) * 0x9E3779B97F4A7C15ULL) >> 40) * 0x1p-24f;
}

#ifdef __AVX2__
/* The same arithmetic on 4 lanes of uint64: z m mod 2^64 from three 32 x 32 -> 64 products (AVX2
 * has no 64-bit multiply), then mix. */
static inline __m256i mul64(__m256i z, uint64_t m) {
    const __m256i lo = _mm256_set1_epi64x((int64_t)(m & 0xFFFFFFFFu)), hi = _mm256_set1_epi64x((int64_t)(m >> 32));
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(z, hi), _mm256_mul_epu32(_mm256_srli_epi64(z, 32), lo));
    return _mm256_add_epi64(_mm256_mul_epu32(z, lo), _mm256_slli_epi64(cross, 32));
}

static inline __m256i mix4(__m256i z) {
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), 0xBF58476D1CE4E5B9ULL);
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), 0x94D049BB133111EBULL);
    return _mm256_srli_epi64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 31)), 40); /* the top 24 bits */
}
#endif

/* out[i] = u(s, o, i) for i < count: 8 at a time with AVX2 (two vectors of 4 counters, each stepped
 * by 8 golden), the rest one by one. */
static void fill(uint64_t s, uint64_t o, int64_t count, float *out) {
    int64_t i = 0;
#ifdef __AVX2__
    const uint64_t g = 0x9E3779B97F4A7C15ULL;
    __m256i za = _mm256_setr_epi64x((int64_t)(s + o * g), (int64_t)(s + (o + 1) * g), (int64_t)(s + (o + 2) * g),
                                    (int64_t)(s + (o + 3) * g));
    __m256i zb = _mm256_add_epi64(za, _mm256_set1_epi64x((int64_t)(4 * g)));
    const __m256i step = _mm256_set1_epi64x((int64_t)(8 * g));
    for (; i + 8 <= count; i += 8) {
        /* the low 32 bits of each lane (all of the 24-bit value), in order */
        const __m256 low = _mm256_shuffle_ps(_mm256_castsi256_ps(mix4(za)), _mm256_castsi256_ps(mix4(zb)), 0x88);
        const __m256i v = _mm256_permute4x64_epi64(_mm256_castps_si256(low), 0xD8);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(0x1p-24f)));
        za = _mm256_add_epi64(za, step);
        zb = _mm256_add_epi64(zb, step);
    }
#endif
    for (; i < count; i++) out[i] = uniform(s, o, i);
}

int64_t pm_uniforms(int64_t seed, int64_t offset, int64_t count, float *out, int64_t threads) {
    const uint64_t s = (uint64_t)seed, o = (uint64_t)offset + 1;
    const int64_t chunk = 1 << 14, chunks = (count + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(static) if (count > (1 << 16))
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t at = c * chunk;
        fill(s, o + (uint64_t)at, count - at < chunk ? count - at : chunk, out + at);
    }
    return 0;
}

/* pm_uniforms on the calling thread: for a library that makes its uniforms tile by tile inside its
 * own parallel loop (cardinality.c links this unit). */
void pm_uniforms_serial(int64_t seed, int64_t offset, int64_t count, float *out) {
    fill((uint64_t)seed, (uint64_t)offset + 1, count, out);
}
