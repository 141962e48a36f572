/* Vector math over arrays, the one unit built with -ffast-math so gcc calls glibc's libmvec
 * (SIMD expf/logf/log1pf, correct for every input, inf and 0 included). Only these loops are
 * built this way: the logic in passes.c keeps IEEE semantics, and the library is linked without
 * -ffast-math so the process's denormal mode is left alone.
 *
 * With AVX-512, exp and log of 16 lanes are computed inline (exp16, log16 below: no call, no
 * spilled registers) by textbook range reductions and polynomials of our own, in explicit
 * intrinsics. Against exp and log in double precision, over all 2^32 floats with this unit's
 * flags: max error 0.91 ulp for exp (|x| <= 87) and 0.93 ulp for log (positive normal x), 0.47%
 * and 3.4% of results not correctly rounded (libmvec's expf and logf: 2.64 and 3.94 ulp, 4.2%
 * and 4.3%). A vector with a lane outside those ranges goes to libmvec, except that exp gives
 * lanes below -104 (where expf is exactly 0: -inf, the FALSE leaf, among them) 0 directly:
 * libmvec would compute those lanes one by one with scalar expf, ~25 times slower.
 *
 * Where the constants come from. LOG2E and LN2 are 1/ln 2 and ln 2 rounded to float. LN2_HI +
 * LN2_LO is ln 2 split for Cody and Waite's reduction: LN2_HI = 2839/4096, ln 2 rounded to 12
 * bits, so n LN2_HI is exact for |n| < 2^12; LN2_LO is ln 2 - LN2_HI rounded to float (the two
 * miss ln 2 by 1.6e-12). EXP_Q and LOG_G are minimax fits of our own, by Lawson's algorithm
 * (least squares, reweighted until the error is level) in float64 numpy at 20,001 Chebyshev
 * points, of the relative error of 1 + r + r^2 Q(r) against exp(r) on |r| <= 0.3466 and of
 * r + r^2 G(r) against log(1 + r) on |r| <= 1/3, with Q0 = 1/2 and G0 = -1/2 kept from the Taylor
 * series; then rounded to float one coefficient at a time from the lowest degree, refitting the
 * higher ones after each: relative error 3.7e-9 and 4.7e-9 after rounding. tools/fit_vmath.py
 * reproduces them. */
#include <math.h>
#include <stdint.h>

#include "kernels.h"
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define LOG2E 1.44269502f
#define LN2 0.693147182f
#define LN2_HI 0.693115234375f /* 2839/4096 */
#define LN2_LO 3.19461833e-05f
/* exp(r) ~ 1 + r + r^2 (Q0 + Q1 r + ... + Q4 r^4) */
static const float EXP_Q[5] = {0.5f, 0.16666535f, 0.04166724f, 0.008367432f, 0.0013863413f};
/* log(1 + r) ~ r + r^2 (G0 + G1 r + ... + G8 r^8) */
static const float LOG_G[9] = {-0.5f,        0.33333215f,  -0.24999806f, 0.20010427f, -0.16680197f,
                               0.14005734f, -0.12187448f, 0.13984594f, -0.12880202f};

/* exp of 16 lanes with |x| <= 87 (so 2^n below and exp(x) are normal floats). x = n ln 2 + r with
 * n = round(x LOG2E), rounded to nearest by adding 1.5 * 2^23 (a float whose ulp is 1) and
 * subtracting it again; r = (x - n LN2_HI) - n LN2_LO, the first step exact (a multiple of 2^-25
 * below 1/2 in magnitude), |r| <= ln 2 / 2 plus rounding. exp(r) by Horner, then times 2^n by
 * vscalefps. */
#endif

#if defined(__AVX512F__)
#define VMATH_LANES 16
__m512 _ZGVeN16v_expf(__m512);
__m512 _ZGVeN16v_logf(__m512);
__m512 _ZGVeN16v_log1pf(__m512);

static inline __m512 exp16(__m512 x) {
    const __m512 shift = _mm512_set1_ps(0x1.8p23f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), shift), shift);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    __m512 p = _mm512_set1_ps(EXP_Q[4]);
    for (int j = 3; j >= 0; j--) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_Q[j]));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* exp of any 16 lanes: exp16 where all |x| <= 87, else 0 below -104 and libmvec for the rest. */
static inline __m512 exp_any(__m512 x) {
    if (_mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(87.0f), _CMP_LE_OQ) == 0xFFFF) return exp16(x);
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_GE_OQ); /* NaN: not live */
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    if ((live | nan) == 0) return _mm512_setzero_ps();
    return _mm512_maskz_mov_ps(live | nan, _ZGVeN16v_expf(_mm512_maskz_mov_ps(live | nan, x)));
}

/* log of 16 positive normal floats. x = 2^k m with m in [2/3, 4/3): subtracting the bits of 2/3
 * (rounded to float) from x's leaves k in the exponent field and m's mantissa below it. r = m - 1
 * (exact), |r| <= 1/3; log(1 + r) by Horner; log x = k LN2 + log(1 + r). */
static inline __m512 log16(__m512 x) {
    const __m512i two_thirds = _mm512_castps_si512(_mm512_set1_ps(2.0f / 3.0f));
    const __m512i ix = _mm512_sub_epi32(_mm512_castps_si512(x), two_thirds);
    const __m512 k = _mm512_cvtepi32_ps(_mm512_srai_epi32(ix, 23));
    const __m512i mbits = _mm512_add_epi32(_mm512_and_si512(ix, _mm512_set1_epi32(0x7fffff)), two_thirds);
    const __m512 m = _mm512_castsi512_ps(mbits);
    const __m512 r = _mm512_sub_ps(m, _mm512_set1_ps(1.0f));
    __m512 g = _mm512_set1_ps(LOG_G[8]);
    for (int j = 7; j >= 0; j--) g = _mm512_fmadd_ps(g, r, _mm512_set1_ps(LOG_G[j]));
    return _mm512_fmadd_ps(k, _mm512_set1_ps(LN2), _mm512_fmadd_ps(_mm512_mul_ps(r, r), g, r));
}

/* log of any 16 lanes: log16 where all are positive normal floats (bits in [0x00800000,
 * 0x7f800000)), else libmvec. */
static inline __m512 log_any(__m512 x) {
    const __m512i b = _mm512_sub_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(0x00800000));
    if (_mm512_cmplt_epu32_mask(b, _mm512_set1_epi32(0x7f000000)) == 0xFFFF) return log16(x);
    return _ZGVeN16v_logf(x);
}

/* log1p of 16 lanes in [0, 1] (the DP's log1p(exp(-|d|)) and softplus's): u = 1 + x rounded,
 * log u by log16, plus the rounding error of u relative to u, (x - (u - 1)) / u, exact to first
 * order (u - 1 and x - (u - 1) are exact here). The empty asm statements hide u and u - 1 from
 * the optimiser, which under -ffast-math rewrote x - (u - 1) as (x + 1) - u = 0, and the division
 * is written in asm, which -ffast-math turned into a reciprocal estimate (rcp14ps or rcpps, so
 * the AVX-512 and AVX2 results differed). Over all floats in [0, 1], against log1p in double:
 * max error 1.30 ulp, 4.7% not correctly rounded (libmvec's log1pf: 1.96 ulp, 1.0%); the AVX2
 * code gives the same bits. Other lanes: libmvec. */
static inline __m512 log1p_any(__m512 x) {
    const __mmask16 unit = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ) &
                           _mm512_cmp_ps_mask(x, _mm512_set1_ps(1.0f), _CMP_LE_OQ);
    if (unit != 0xFFFF) return _ZGVeN16v_log1pf(x);
    __m512 u = _mm512_add_ps(x, _mm512_set1_ps(1.0f));
    __asm__("" : "+v"(u));
    __m512 t = _mm512_sub_ps(u, _mm512_set1_ps(1.0f));
    __asm__("" : "+v"(t));
    __m512 c;
    __asm__("vdivps %2, %1, %0" : "=v"(c) : "v"(_mm512_sub_ps(x, t)), "v"(u)); /* a true division, not rcp */
    return _mm512_add_ps(log16(u), c);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define VMATH_LANES 8
__m256 _ZGVdN8v_expf(__m256);
__m256 _ZGVdN8v_logf(__m256);
__m256 _ZGVdN8v_log1pf(__m256);

/* exp16 on 8 lanes (AVX2 + FMA), the same operations in the same order, so bit for bit the same
 * results: only the scaling by 2^n differs, a multiplication by 2^n built in the exponent field
 * ((n + 127) << 23; n in [-126, 126] for |x| <= 87), exact as vscalefps's is. */
static inline __m256 exp8(__m256 x) {
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), shift), shift);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_set1_ps(EXP_Q[4]);
    for (int j = 3; j >= 0; j--) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_Q[j]));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* exp of any 8 lanes: exp8 where all |x| <= 87, else 0 below -104 and libmvec for the rest. */
static inline __m256 exp_any(__m256 x) {
    const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    if (_mm256_movemask_ps(_mm256_cmp_ps(ax, _mm256_set1_ps(87.0f), _CMP_LE_OQ)) == 0xFF) return exp8(x);
    const __m256 keep = _mm256_or_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-104.0f), _CMP_GE_OQ),
                                     _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); /* live or NaN */
    if (_mm256_movemask_ps(keep) == 0) return _mm256_setzero_ps();
    return _mm256_and_ps(keep, _ZGVdN8v_expf(_mm256_and_ps(keep, x)));
}

/* log16 on 8 lanes: the same operations, the same results. */
static inline __m256 log8(__m256 x) {
    const __m256i two_thirds = _mm256_castps_si256(_mm256_set1_ps(2.0f / 3.0f));
    const __m256i ix = _mm256_sub_epi32(_mm256_castps_si256(x), two_thirds);
    const __m256 k = _mm256_cvtepi32_ps(_mm256_srai_epi32(ix, 23));
    const __m256i mbits = _mm256_add_epi32(_mm256_and_si256(ix, _mm256_set1_epi32(0x7fffff)), two_thirds);
    const __m256 m = _mm256_castsi256_ps(mbits);
    const __m256 r = _mm256_sub_ps(m, _mm256_set1_ps(1.0f));
    __m256 g = _mm256_set1_ps(LOG_G[8]);
    for (int j = 7; j >= 0; j--) g = _mm256_fmadd_ps(g, r, _mm256_set1_ps(LOG_G[j]));
    return _mm256_fmadd_ps(k, _mm256_set1_ps(LN2), _mm256_fmadd_ps(_mm256_mul_ps(r, r), g, r));
}

/* log of any 8 lanes: log8 where all are positive normal floats, else libmvec. The unsigned
 * comparison b < 0x7f000000 as a signed one with the sign bits flipped. */
static inline __m256 log_any(__m256 x) {
    const __m256i flip = _mm256_set1_epi32(INT32_MIN);
    const __m256i b = _mm256_xor_si256(_mm256_sub_epi32(_mm256_castps_si256(x), _mm256_set1_epi32(0x00800000)), flip);
    const __m256i ok = _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_set1_epi32(0x7f000000), flip), b);
    if (_mm256_movemask_ps(_mm256_castsi256_ps(ok)) == 0xFF) return log8(x);
    return _ZGVdN8v_logf(x);
}

/* log1p of 8 lanes: log1p_any of the AVX-512 code, the same operations. */
static inline __m256 log1p_any(__m256 x) {
    const __m256 unit = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ),
                                      _mm256_cmp_ps(x, _mm256_set1_ps(1.0f), _CMP_LE_OQ));
    if (_mm256_movemask_ps(unit) != 0xFF) return _ZGVdN8v_log1pf(x);
    __m256 u = _mm256_add_ps(x, _mm256_set1_ps(1.0f));
    __asm__("" : "+x"(u));
    __m256 t = _mm256_sub_ps(u, _mm256_set1_ps(1.0f));
    __asm__("" : "+x"(t));
    __m256 c;
    __asm__("vdivps %2, %1, %0" : "=x"(c) : "x"(_mm256_sub_ps(x, t)), "x"(u));
    return _mm256_add_ps(log8(u), c);
}
#endif

/* The vector of VMATH_LANES floats and its loads and stores, for the loops below. */
#if VMATH_LANES == 16
typedef __m512 vec;
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSUB _mm512_sub_ps
#define VADD _mm512_add_ps
#elif VMATH_LANES == 8
typedef __m256 vec;
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSUB _mm256_sub_ps
#define VADD _mm256_add_ps
#endif

void pm_exp(float *x, int64_t n) {
    int64_t i = 0;
#ifdef VMATH_LANES
    for (; i + VMATH_LANES <= n; i += VMATH_LANES) VSTORE(x + i, exp_any(VLOAD(x + i)));
#else /* portable: libmvec's expf (vectorised by -ffast-math) with dead lanes (below -104, the FALSE
       * leaf's -inf among them) given 0 here, where expf is 0: libmvec would take its slow scalar
       * path for a whole vector with one such lane */
    for (; i < n; i++) {
        const float v = x[i], y = expf(v < -104.0f ? 0.0f : v);
        x[i] = v < -104.0f ? 0.0f : y;
    }
#endif
    for (; i < n; i++) x[i] = expf(x[i]);
}

void pm_log(float *x, int64_t n) {
    int64_t i = 0;
#ifdef VMATH_LANES
    for (; i + VMATH_LANES <= n; i += VMATH_LANES) VSTORE(x + i, log_any(VLOAD(x + i)));
#endif
    for (; i < n; i++) x[i] = logf(x[i]);
}

void pm_log1p(float *x, int64_t n) {
    int64_t i = 0;
#ifdef VMATH_LANES
    for (; i + VMATH_LANES <= n; i += VMATH_LANES) VSTORE(x + i, log1p_any(VLOAD(x + i)));
#endif
    for (; i < n; i++) x[i] = log1pf(x[i]);
}

/* x[e][t] = exp(x[e][t] - top[t]) for the rows e < rows of width w (a multiple of 16). */
void pm_exp_shift(float *x, const float *top, int64_t rows, int64_t w) {
#ifdef VMATH_LANES
    for (int64_t e = 0; e < rows; e++)
        for (int64_t t = 0; t < w; t += VMATH_LANES) {
            float *p = x + e * w + t;
            VSTORE(p, exp_any(VSUB(VLOAD(p), VLOAD(top + t))));
        }
#else
    for (int64_t e = 0; e < rows; e++)
        for (int64_t t = 0; t < w; t++) {
            const float v = x[e * w + t] - top[t], y = expf(v < -104.0f ? 0.0f : v);
            x[e * w + t] = v < -104.0f ? 0.0f : y;
        }
#endif
}

/* v = log(s) + top, n floats. */
void pm_log_add(float *v, const float *s, const float *top, int64_t n) {
    int64_t i = 0;
#ifdef VMATH_LANES
    for (; i + VMATH_LANES <= n; i += VMATH_LANES) VSTORE(v + i, VADD(log_any(VLOAD(s + i)), VLOAD(top + i)));
#endif
    for (; i < n; i++) v[i] = logf(s[i]) + top[i];
}

/* x = exp(x) over n doubles with every x in [-700, 0] (the caller clamps), through libmvec's
 * double exp (this unit's -ffast-math vectorises the loop). */
void pm_exp_double(double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = exp(x[i]);
}

/* x = log(x) over n positive normal doubles, through libmvec's double log. */
void pm_log_double(double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = log(x[i]);
}
