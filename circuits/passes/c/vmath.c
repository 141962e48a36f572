/* Vector math over arrays, the one unit built with -ffast-math so gcc calls glibc's libmvec
 * (SIMD expf/logf/log1pf, correct for every input, inf and 0 included). Only these loops are
 * built this way: the logic in passes.c keeps IEEE semantics, and the library is linked without
 * -ffast-math so the process's denormal mode is left alone.
 *
 * With AVX-512, exp and log are computed inline: exp16 and log16 below are the main paths of
 * libmvec's AVX-512 expf and logf (_ZGVeN16v_expf, _ZGVeN16v_logf, glibc 2.36), operation for
 * operation in explicit intrinsics (which -ffast-math does not rewrite), so they give the same bits
 * (checked against libmvec for all 2^32 inputs) with no call and no spilled registers per 16 lanes.
 * Vectors with a lane libmvec treats as special still go to libmvec, except that exp gives lanes
 * below -104 (where expf is exactly 0: -inf, the FALSE leaf, among them) 0 directly: libmvec would
 * compute those lanes one by one with scalar expf, ~25 times slower. */
#include <math.h>
#include <stdint.h>
#if defined(__AVX512F__)
#include <immintrin.h>
__m512 _ZGVeN16v_expf(__m512);
__m512 _ZGVeN16v_logf(__m512);

/* exp of 16 lanes whose |x| <= 87.33654 (libmvec's range for its main path), as libmvec computes it:
 * x = N ln 2 + r with N = round(x / ln 2) by the 1.5 * 2^23 shifter, ln 2 in two parts; exp(r) by a
 * degree-5 polynomial; times 2^N built in the exponent bits. Every step is an explicit intrinsic. */
static inline __m512 exp16(__m512 x) {
    const __m512 shifter = _mm512_castsi512_ps(_mm512_set1_epi32(0x4b400000));
    const __m512 t = _mm512_fmadd_ps(x, _mm512_castsi512_ps(_mm512_set1_epi32(0x3fb8aa3b)), shifter);
    const __m512 n = _mm512_sub_ps(t, shifter);
    const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(t),
                                                                                _mm512_set1_epi32(0x7f)), 23));
    __m512 r = _mm512_fnmadd_ps(n, _mm512_castsi512_ps(_mm512_set1_epi32(0x3f317200)), x);
    r = _mm512_fnmadd_ps(n, _mm512_castsi512_ps(_mm512_set1_epi32(0x35bfbe8e)), r);
    __m512 p = _mm512_fmadd_ps(r, _mm512_castsi512_ps(_mm512_set1_epi32(0x3c07d9fe)),
                               _mm512_castsi512_ps(_mm512_set1_epi32(0x3d2b8392)));
    p = _mm512_fmadd_ps(r, p, _mm512_castsi512_ps(_mm512_set1_epi32(0x3e2aacac)));
    p = _mm512_fmadd_ps(r, p, _mm512_castsi512_ps(_mm512_set1_epi32(0x3effff34)));
    p = _mm512_fmadd_ps(r, p, _mm512_castsi512_ps(_mm512_set1_epi32(0x3f7ffffe)));
    p = _mm512_fmadd_ps(r, p, _mm512_castsi512_ps(_mm512_set1_epi32(0x3f800000)));
    return _mm512_mul_ps(scale, p);
}

/* exp of any 16 lanes: exp16 where libmvec takes its main path, 0 below -104, libmvec for the rest. */
static inline __m512 exp_any(__m512 x) {
    const __m512i bits = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
    const __mmask16 main = _mm512_cmple_epi32_mask(bits, _mm512_set1_epi32(0x42aeac4f));
    if (main == 0xFFFF) return exp16(x);
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_GE_OQ); /* NaN: not live */
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    if ((live | nan) == 0) return _mm512_setzero_ps();
    return _mm512_maskz_mov_ps(live | nan, _ZGVeN16v_expf(_mm512_maskz_mov_ps(live | nan, x)));
}

/* log of 16 positive normal floats, as libmvec's 16-lane logf computes it: x = 2^k m with m in
 * [2/3, 4/3), r = m - 1, log = k ln 2 + (r + r (r p(r))) with p of degree 6. */
static inline __m512 log16(__m512 x) {
    const __m512i off = _mm512_set1_epi32(0x3f2aaaab), ix = _mm512_sub_epi32(_mm512_castps_si512(x), off);
    const __m512 k = _mm512_cvtepi32_ps(_mm512_srai_epi32(ix, 23));
    const __m512 m = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_and_si512(ix, _mm512_set1_epi32(0x7fffff)), off));
    const __m512 r = _mm512_sub_ps(m, _mm512_castsi512_ps(_mm512_set1_epi32(0x3f800000)));
    __m512 p = _mm512_fmadd_ps(r, _mm512_castsi512_ps(_mm512_set1_epi32(0xbe1b6a22)),
                               _mm512_castsi512_ps(_mm512_set1_epi32(0x3e2db86b)));
    p = _mm512_fmadd_ps(r, p, _mm512_castsi512_ps(_mm512_set1_epi32(0xbe289358)));
    p = _mm512_fmadd_ps(r, p, _mm512_castsi512_ps(_mm512_set1_epi32(0x3e4afb81)));
    p = _mm512_fmadd_ps(r, p, _mm512_castsi512_ps(_mm512_set1_epi32(0xbe80061d)));
    p = _mm512_fmadd_ps(r, p, _mm512_castsi512_ps(_mm512_set1_epi32(0x3eaaaee7)));
    p = _mm512_fmadd_ps(r, p, _mm512_castsi512_ps(_mm512_set1_epi32(0xbf000000)));
    const __m512 q = _mm512_fmadd_ps(r, _mm512_mul_ps(p, r), r);
    return _mm512_fmadd_ps(k, _mm512_castsi512_ps(_mm512_set1_epi32(0x3f317218)), q);
}

/* log of any 16 lanes: log16 where all are positive normal floats (libmvec's main path), else libmvec. */
static inline __m512 log_any(__m512 x) {
    const __m512i b = _mm512_add_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(0x800000));
    if (_mm512_cmpge_epi32_mask(b, _mm512_set1_epi32(0x1000000)) == 0xFFFF) return log16(x);
    return _ZGVeN16v_logf(x);
}
#endif

void pm_exp(float *x, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp_any(_mm512_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = expf(x[i]);
}

void pm_log(float *x, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, log_any(_mm512_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = logf(x[i]);
}

void pm_log1p(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = log1pf(x[i]);
}

/* x[e][t] = exp(x[e][t] - top[t]) for the rows e < rows of width w (a multiple of 16). */
void pm_exp_shift(float *x, const float *top, int64_t rows, int64_t w) {
#if defined(__AVX512F__)
    for (int64_t e = 0; e < rows; e++)
        for (int64_t t = 0; t < w; t += 16) {
            float *p = x + e * w + t;
            _mm512_storeu_ps(p, exp_any(_mm512_sub_ps(_mm512_loadu_ps(p), _mm512_loadu_ps(top + t))));
        }
#else
    for (int64_t e = 0; e < rows; e++)
        for (int64_t t = 0; t < w; t++) x[e * w + t] = expf(x[e * w + t] - top[t]);
#endif
}

/* v = log(s) + top, n floats. */
void pm_log_add(float *v, const float *s, const float *top, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(v + i, _mm512_add_ps(log_any(_mm512_loadu_ps(s + i)), _mm512_loadu_ps(top + i)));
#endif
    for (; i < n; i++) v[i] = logf(s[i]) + top[i];
}
