/* Fused fp32 CPU passes over a level layout, one tile of TILE tokens at a time.
 *
 * The same mathematics as circuits/kernels/torch_passes.py, the plain-torch reference these
 * passes are tested against; read that file first. The torch passes stream every group through [slots, T] buffers
 * in memory; here one tile's whole circuit (values, element weights, flows: a few hundred kB)
 * stays in cache while all groups are evaluated, and each element is touched once per pass.
 *
 * Buffers are [rows][TILE] floats. A partial last tile's lanes past nt hold copies of its first
 * token's logits (pad_lanes; uniform 0.5, tangent 0), so every lane holds ordinary numbers; only
 * the first nt lanes are written out. Inputs [T, n] and
 * outputs move between the two layouts in 16 x 16 blocks (load_tile, store_tile). The entry
 * points at the end (pm_marginals, pm_sample, pm_map, pm_jvp) split the tiles between OpenMP
 * threads; each thread has its own scratch.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels.h"

/* The straight-through selection (circuits::chosen_scores) in place of a pass's z or Cov(z) v
 * output: in the forward, p [T, n] the scores and the slots written, idx [T, slots] int64, w, mask;
 * in the backward, the slots' gradient g [T, slots] at idx [T, slots] int32 (mask: the used ones),
 * and sigmoid (the scores are sigmoid(r), else softmax(r)). */
typedef struct {
    const float *p;
    int64_t slots;
    int64_t *idx;
    float *w;
    uint8_t *mask;
    int64_t k;    /* > 0: the pass's shift is each token's k-th largest logit, made here into shift [T] */
    float *shift;
} Chosen;

typedef struct {
    const int32_t *idx;
    const float *g;
    const uint8_t *mask;
    int64_t slots, sigmoid;
    int64_t k; /* as Chosen's */
    float *shift;
} ChosenGrad;

#define TILE 128 /* tokens per tile: 64 and 128 measured fastest, 32 and 256 slower */

/* The inner loops over a tile, with restrict pointers so gcc vectorises them without alias checks.
 * Callers pass distinct rows: an element's prime and sub are different slots. */
static inline void add_rows(float *restrict out, const float *restrict a, const float *restrict b) {
    for (int64_t t = 0; t < TILE; t++) out[t] = a[t] + b[t];
}

static inline void add_rows_max(float *restrict out, float *restrict top, const float *restrict a,
                                const float *restrict b) {
    for (int64_t t = 0; t < TILE; t++) {
        out[t] = a[t] + b[t];
        top[t] = max2(top[t], out[t]);
    }
}

/* acc += w (da + db), s += w: an element's tangent d e = da + db in the weighted sum, and its weight in the
 * sum of weights. */
static inline void tangent_row(float *restrict acc, float *restrict s, const float *restrict w,
                               const float *restrict da, const float *restrict db) {
    for (int64_t t = 0; t < TILE; t++) {
        acc[t] += w[t] * (da[t] + db[t]);
        s[t] += w[t];
    }
}

/* The first element's: acc = 0 + w (da + db), s = w. */
static inline void first_tangent_row(float *restrict acc, float *restrict s, const float *restrict w,
                                     const float *restrict da, const float *restrict db) {
    for (int64_t t = 0; t < TILE; t++) {
        acc[t] = 0.0f + w[t] * (da[t] + db[t]);
        s[t] = w[t];
    }
}

/* p += a, q += a: a flow passed to an element's prime and sub. */
static inline void pass_rows(float *restrict p, float *restrict q, const float *restrict a) {
    for (int64_t t = 0; t < TILE; t++) {
        p[t] += a[t];
        q[t] += a[t];
    }
}

/* VL lanes of a row as one vector of the machine's width (GCC vector extensions: plain IEEE
 * operations lane by lane, so the same results as the scalar loops, whatever VL is). VL is 16 with
 * AVX-512, 8 with AVX2 and 4 elsewhere (SSE, NEON): a vector wider than the machine's is split by
 * gcc into scalar compares and lane inserts through the stack (2.7x slower sampling with AVX2).
 * Scratch rows are 64-byte aligned; vfu reads from anywhere. */
#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX2__)
#define VL 8
#else
#define VL 4
#endif
typedef float vf __attribute__((vector_size(4 * VL), aligned(4 * VL)));
typedef float vfu __attribute__((vector_size(4 * VL), aligned(4)));
typedef int32_t vi __attribute__((vector_size(4 * VL), aligned(4 * VL)));

/* Whether some lane of the VL at a is > 0. */
static inline int any_lane(const float *a) {
#if defined(__AVX512F__)
    return _mm512_cmp_ps_mask(_mm512_load_ps(a), _mm512_setzero_ps(), _CMP_GT_OQ) != 0;
#elif defined(__AVX2__)
    return _mm256_movemask_ps(_mm256_cmp_ps(_mm256_load_ps(a), _mm256_setzero_ps(), _CMP_GT_OQ)) != 0;
#else
    const vi m = *(const vf *)a > 0.0f;
    int any = 0;
    for (int k = 0; k < VL; k++) any |= m[k];
    return any;
#endif
}

/* The inverse-CDF choice of one node (elements r0..r0+F) for lanes b..b+VL: x = u total where active
 * (a > 0), else inf, which nothing passes; over the elements, c += w and the flow [c > x] -
 * [previous c > x] goes to the element's prime and sub. c, x and [c > x] stay in registers. */
static inline void pick(const int64_t *prime, const int64_t *sub, float *act, const float *ex, int64_t r0,
                        int64_t F, int64_t b, const float *a, const float *u, const float *total) {
    const vf zero = {0.0f}, one = zero + 1.0f, inf = zero + INFINITY;
    const vi on = *(const vf *)a > 0.0f;
    const vf x = (vf)((on & (vi)(*(const vf *)u * *(const vf *)total)) | (~on & (vi)inf));
    vf c = zero, prev = zero;
    for (int64_t e = r0; e < r0 + F; e++) {
        c += *(const vf *)(ex + e * TILE + b);
        const vf passed = (vf)((c > x) & (vi)one), flow = passed - prev;
        prev = passed;
        *(vf *)(act + prime[e] * TILE + b) += flow;
        *(vf *)(act + sub[e] * TILE + b) += flow;
    }
}

/* acc += a */
static inline void acc_row(float *restrict acc, const float *restrict a) {
    for (int64_t t = 0; t < TILE; t++) acc[t] += a[t];
}

/* top = max(top, x) */
static inline void max_row(float *restrict top, const float *restrict x) {
    for (int64_t t = 0; t < TILE; t++) top[t] = max2(top[t], x[t]);
}

/* One element of the MAP descent: the first element whose value x equals the node's max v (not
 * yet found) passes the activity a to its prime (p) and sub (q). */
static inline void argmax_row(float *restrict p, float *restrict q, float *restrict found, const float *restrict x,
                              const float *restrict v, const float *restrict a) {
    for (int64_t t = 0; t < TILE; t++) {
        /* & rather than &&: no branch, so gcc vectorises it without AVX (9x faster MAP at -march=x86-64) */
        const float hit = (found[t] == 0.0f) & (x[t] == v[t]) ? 1.0f : 0.0f, f = hit * a[t];
        found[t] += hit;
        p[t] += f;
        q[t] += f;
    }
}

/* One element of the downward pass: flow = w coef, to the prime (p) and the sub (q). */
static inline void flow_row(float *restrict p, float *restrict q, const float *restrict w, const float *restrict coef) {
    for (int64_t t = 0; t < TILE; t++) {
        const float f = w[t] * coef[t];
        p[t] += f;
        q[t] += f;
    }
}

/* One element of the paired downward pass: flow = w coef, d flow = w (dcoef + coef (de - d node)) =
 * w (de coef + dc) with de = da + db and dc = dcoef - d node coef (the node's part, once per node),
 * both to the prime (gp, dgp) and the sub (gq, dgq). */
static inline void flow_rows(float *restrict gp, float *restrict gq, float *restrict dgp, float *restrict dgq,
                             const float *restrict w, const float *restrict da, const float *restrict db,
                             const float *restrict coef, const float *restrict dc) {
    for (int64_t t = 0; t < TILE; t++) {
        const float f = w[t] * coef[t], df = w[t] * ((da[t] + db[t]) * coef[t] + dc[t]);
        gp[t] += f;
        gq[t] += f;
        dgp[t] += df;
        dgq[t] += df;
    }
}
/* One tile's tilt (see tilt_tile): c, c+ = max(c, 0), c- = min(c, 0) [TILE]; g [n][TILE] the implicit
 * variables' addends and dg [n][TILE] their tangents (NULL: none). */
typedef struct {
    const float *c, *cp, *cn, *g, *dg;
} Tilt;

/* tmp = sum of rows[v] over element row e's implicit variables v, plus up[e] c+ + down[e] c-: the
 * element's tilt addend (torch_passes.tilt: gap). */
static inline void tilt_addend(const Prog *P, const Tilt *tl, int64_t e, float *restrict tmp) {
    const float u = P->tilt_up[e], d = P->tilt_down[e];
    for (int64_t t = 0; t < TILE; t++) tmp[t] = u * tl->cp[t];
    for (int64_t t = 0; t < TILE; t++) tmp[t] += d * tl->cn[t];
    for (int64_t k = P->imp_off[e]; k < P->imp_off[e + 1]; k++) {
        const float *row = tl->g + P->imp_var[k] * TILE;
        for (int64_t t = 0; t < TILE; t++) tmp[t] += row[t];
    }
}

/* Whether element row e moves under the tilt. */
static inline int tilted(const Prog *P, const Tilt *tl, int64_t e) {
    return tl && (P->tilt_up[e] != 0.0f || P->tilt_down[e] != 0.0f || P->imp_off[e] != P->imp_off[e + 1]);
}

/* out = a + (sum of dg over element row e's implicit variables): a prime's tangent with the tangent
 * of the element's tilt addend, so that (out + d sub) is the element's d e. */
static inline void tilt_tangent(const Prog *P, const Tilt *tl, int64_t e, const float *restrict a,
                                float *restrict out) {
    memcpy(out, a, TILE * sizeof(float));
    for (int64_t k = P->imp_off[e]; k < P->imp_off[e + 1]; k++) {
        const float *row = tl->dg + P->imp_var[k] * TILE;
        for (int64_t t = 0; t < TILE; t++) out[t] += row[t];
    }
}

/* The start of a top-down pass: rows [rows][TILE] all 0 but the root (slot S - 1), 1. */
static void root_flow(float *flow, int64_t S, int64_t rows) {
    memset(flow, 0, rows * TILE * sizeof(float));
    for (int64_t t = 0; t < TILE; t++) flow[(S - 1) * TILE + t] = 1.0f;
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/* dst[k][j] = src[j][k] for an 8 x 8 block (AVX2): rows of src are ss floats apart, rows of dst ds. */
static inline void transpose8(const float *src, int64_t ss, float *dst, int64_t ds) {
    __m256 r[8], t[8];
    for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(src + j * ss);
    for (int j = 0; j < 8; j += 2) { /* per 128-bit half: rows j, j + 1 interleaved */
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 8; j += 4) { /* r[j + c], half H: rows j..j+3 of column 4 H + c */
        r[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
        r[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
        r[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
        r[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) { /* then the 128-bit halves */
        _mm256_storeu_ps(dst + c * ds, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
        _mm256_storeu_ps(dst + (4 + c) * ds, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
    }
}
#endif

/* dst[k][j] = src[j][k] for a 16 x 16 block: rows of src are ss floats apart, rows of dst ds. */
static inline void transpose16(const float *src, int64_t ss, float *dst, int64_t ds) {
#if defined(__AVX512F__)
    __m512 r[16], t[16];
    for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_ps(src + j * ss);
    for (int j = 0; j < 16; j += 2) { /* per 128-bit lane: rows j, j + 1 interleaved */
        t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 16; j += 4) { /* r[j + c], lane L: rows j..j+3 of column 4 L + c */
        r[j] = _mm512_shuffle_ps(t[j], t[j + 2], 0x44);
        r[j + 1] = _mm512_shuffle_ps(t[j], t[j + 2], 0xEE);
        r[j + 2] = _mm512_shuffle_ps(t[j + 1], t[j + 3], 0x44);
        r[j + 3] = _mm512_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) { /* then whole 128-bit lanes */
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    }
    for (int c = 0; c < 4; c++) {
        _mm512_storeu_ps(dst + c * ds, _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88));
        _mm512_storeu_ps(dst + (8 + c) * ds, _mm512_shuffle_f32x4(t[c], t[8 + c], 0xDD));
        _mm512_storeu_ps(dst + (4 + c) * ds, _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88));
        _mm512_storeu_ps(dst + (12 + c) * ds, _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xDD));
    }
#elif defined(__AVX2__)
    transpose8(src, ss, dst, ds); /* four 8 x 8 blocks, the off-diagonal ones swapped */
    transpose8(src + 8, ss, dst + 8 * ds, ds);
    transpose8(src + 8 * ss, ss, dst + 8, ds);
    transpose8(src + 8 * ss + 8, ss, dst + 8 * ds + 8, ds);
#else
    for (int k = 0; k < 16; k++)
        for (int j = 0; j < 16; j++) dst[k * ds + j] = src[j * ss + k];
#endif
}

/* src [T, n] rows t0..t0+nt -> dst [n][TILE], lanes past nt = pad: 16 x 16 blocks, then the rest. */
static void load_tile(const float *src, int64_t n, int64_t t0, int64_t nt, float pad, float *dst) {
    const int64_t n16 = n & ~(int64_t)15, nt16 = nt & ~(int64_t)15;
    for (int64_t b = 0; b < nt16; b += 16) {
        const float *s = src + (t0 + b) * n;
        for (int64_t i = 0; i < n16; i += 16) transpose16(s + i, n, dst + i * TILE + b, TILE);
        for (int64_t i = n16; i < n; i++)
            for (int64_t t = 0; t < 16; t++) dst[i * TILE + b + t] = s[t * n + i];
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = nt16; t < TILE; t++) dst[i * TILE + t] = t < nt ? src[(t0 + t) * n + i] : pad;
}

/* dst [n][TILE] -= shift[t0 + t] on the tile's nt lanes (the exactly-k shift; shift NULL: none).
 * The same float subtraction as r - shift in torch, so the passes see the same bits. */
static void shift_tile(const float *shift, int64_t n, int64_t t0, int64_t nt, float *dst) {
    if (!shift) return;
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < nt; t++) dst[i * TILE + t] -= shift[t0 + t];
}

/* The lanes past nt of a partial tile's logits rt [n][TILE] take lane 0's (a token of the tile):
 * a pad of logit 0 everywhere is a token whose values can leave the linear upward's range (all n
 * logits at the shift: exactly 16 of 256 has P = C(256, 16) / 2^256 ~ e^-120), which would send
 * the whole tile to the pass on logarithms. Padding lanes are never written out. */
static void pad_lanes(int64_t n, int64_t nt, float *rt) {
    if (nt == TILE) return;
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = nt; t < TILE; t++) rt[i * TILE + t] = rt[i * TILE];
}

/* src [n][TILE] -> dst [T, n] rows t0..t0+nt: 16 x 16 blocks, then the rest. */
static void store_tile(const float *src, int64_t n, int64_t t0, int64_t nt, float *dst) {
    const int64_t n16 = n & ~(int64_t)15, nt16 = nt & ~(int64_t)15;
    for (int64_t b = 0; b < nt16; b += 16) {
        float *d = dst + (t0 + b) * n;
        for (int64_t i = 0; i < n16; i += 16) transpose16(src + i * TILE + b, TILE, d + i, n);
        for (int64_t t = 0; t < 16; t++)
            for (int64_t i = n16; i < n; i++) d[t * n + i] = src[i * TILE + b + t];
    }
    for (int64_t t = nt16; t < nt; t++)
        for (int64_t i = 0; i < n; i++) dst[(t0 + t) * n + i] = src[i * TILE + t];
}

/* Leaf rows of val: FALSE = -inf, TRUE = 0, x_i = log sigma(r_i), not x_i = log sigma(-r_i).
 * rt [n][TILE]; p [n][TILE] gets sigma(r) unless NULL. */
static void leaves(int64_t n, const float *rt, float *val, float *p) {
    float *pos = val + 2 * TILE, *neg = val + (2 + n) * TILE;
    const int64_t m = n * TILE;
    for (int64_t t = 0; t < TILE; t++) {
        val[t] = -INFINITY;
        val[TILE + t] = 0.0f;
    }
    for (int64_t i = 0; i < m; i++) neg[i] = -fabsf(rt[i]);
    pm_exp(neg, m);
    pm_log1p(neg, m); /* soft = log(1 + e^-|r|) */
    for (int64_t i = 0; i < m; i++) {
        const float x = rt[i], soft = neg[i];
        pos[i] = min2(x, 0.0f) - soft;
        neg[i] = -(soft + max2(x, 0.0f));
    }
    if (p) {
        memcpy(p, pos, m * sizeof(float));
        pm_exp(p, m);
    }
}

/* The linear upward's range: a tile keeps it only when every node's stored value lies in
 * [LIN_FLOOR, LIN_TOP] on every lane (see upward). */
#define LIN_FLOOR 0x1p-120f
#define LIN_TOP 0x1p126f

/* x = (a b) c for a row: an element's stored value in the linear upward (c: its constant). The
 * product of the children first: it underflows only where the element is negligible (below 2^-126
 * of a node that is at least 2^-120), and it overflows only to inf, which the range check sees. */
static inline void product_row(float *restrict x, const float *restrict a, const float *restrict b, float c) {
    for (int64_t t = 0; t < TILE; t++) x[t] = (a[t] * b[t]) * c;
}

/* Whether some lane of low [TILE] is set. */
static inline int any_set(const float *low) {
    float any = 0.0f;
    for (int64_t t = 0; t < TILE; t++) any = low[t] != 0.0f ? 1.0f : any;
    return any != 0.0f;
}

/* low = 1 where v is outside [LIN_FLOOR, LIN_TOP] (NaN included). */
static inline void range_row(float *restrict low, const float *restrict v) {
    for (int64_t t = 0; t < TILE; t++) low[t] = v[t] >= LIN_FLOOR && v[t] <= LIN_TOP ? low[t] : 1.0f;
}

/* The "sum" upward pass (torch_passes.upward) over leaves already in val. With dval != NULL also
 * the tangents d node = E_w[de], de = d prime + d sub per element (not kept: the downward pass
 * adds them again). top: [TILE] scratch.
 *
 * On logarithms (linear = 0): node log-values val, element weights ex = exp(e - top) (fan-in > 1
 * only), norm = sum of ex clamped to FLT_MIN.
 *
 * Linear (linear = 1): with no exp or log per element. Each slot holds its value divided by a
 * constant of its own, exp(b_slot - delta), b the log-values of the same pass at a nominal logit
 * for every variable (c_passes.py: where the values of a routing tile lie): an element is then
 * (prime sub) c_e with c_e = exp(b_prime + b_sub - b_node - delta), ex its stored value and val =
 * norm = their sum, the node's. The flows ex / norm are the same ratios as on logarithms. Values
 * near b are near e^delta; the pass returns 0 (the caller takes the logarithms) when a node left
 * [LIN_FLOOR, LIN_TOP] on some lane: logits far from the nominal one, a NaN, +inf, or a node that
 * -inf logits make impossible (looked at every 64 nodes, so such a tile stops early). Above
 * LIN_FLOOR a node is a normal float with its 24 bits, and an element's rounding below 2^-126 is
 * 2^-30 of it. Returns 1 otherwise (and always on logs). */
static int upward(const Prog *P, float *val, float *ex, float *norm, float *dval, float *top, int linear,
                  const Tilt *tl, float *tmp) {
    float *low = top;
    if (linear) memset(low, 0, TILE * sizeof(float));
    for (int64_t d = 0; d < P->num_nodes; d++) {
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        float *v = val + slot * TILE;
        if (F == 1) { /* a product: weight 1 */
            if (linear) {
                product_row(v, val + P->prime[r0] * TILE, val + P->sub[r0] * TILE, (float)P->lin_coef[r0]);
                range_row(low, v);
            } else {
                add_rows(v, val + P->prime[r0] * TILE, val + P->sub[r0] * TILE);
                if (tilted(P, tl, r0)) {
                    tilt_addend(P, tl, r0, tmp);
                    acc_row(v, tmp);
                }
            }
            if (dval) {
                const float *da = dval + P->prime[r0] * TILE;
                if (tilted(P, tl, r0) && tl->dg) {
                    tilt_tangent(P, tl, r0, da, tmp);
                    da = tmp;
                }
                add_rows(dval + slot * TILE, da, dval + P->sub[r0] * TILE);
            }
            continue;
        }
        float *x = ex + r0 * TILE, *s = norm + slot * TILE;
        if (linear) {
            for (int64_t e = 0; e < F; e++)
                product_row(x + e * TILE, val + P->prime[r0 + e] * TILE, val + P->sub[r0 + e] * TILE,
                            (float)P->lin_coef[r0 + e]);
        } else {
            for (int64_t t = 0; t < TILE; t++) top[t] = -FLT_MAX; /* a dead node keeps exp(e - top) = 0 */
            for (int64_t e = 0; e < F; e++) {
                float *xe = x + e * TILE;
                if (!tilted(P, tl, r0 + e)) {
                    add_rows_max(xe, top, val + P->prime[r0 + e] * TILE, val + P->sub[r0 + e] * TILE);
                    continue;
                }
                add_rows(xe, val + P->prime[r0 + e] * TILE, val + P->sub[r0 + e] * TILE); /* as torch: then + gap */
                tilt_addend(P, tl, r0 + e, tmp);
                acc_row(xe, tmp);
                max_row(top, xe);
            }
            pm_exp_shift(x, top, F, TILE); /* x = exp(x - top) */
        }
        if (!dval) {
            memcpy(s, x, TILE * sizeof(float));
            for (int64_t e = 1; e < F; e++) acc_row(s, x + e * TILE); /* in element order, as the descent */
        } else { /* and the tangents: de = d prime + d sub (+ the tilt's), d node = sum w de / norm */
            float *dv = dval + slot * TILE;
            for (int64_t e = 0; e < F; e++) {
                const float *da = dval + P->prime[r0 + e] * TILE;
                if (tilted(P, tl, r0 + e) && tl->dg) {
                    tilt_tangent(P, tl, r0 + e, da, tmp);
                    da = tmp;
                }
                if (e == 0)
                    first_tangent_row(dv, s, x, da, dval + P->sub[r0] * TILE);
                else
                    tangent_row(dv, s, x + e * TILE, da, dval + P->sub[r0 + e] * TILE);
            }
            for (int64_t t = 0; t < TILE; t++) dv[t] /= max2(s[t], FLT_MIN);
        }
        if (linear) {
            memcpy(v, s, TILE * sizeof(float));
            range_row(low, v);
            if ((d & 63) == 63 && any_set(low)) return 0; /* out of range: stop early, the caller redoes it */
        } else {
            pm_log_add(v, s, top, TILE);
            for (int64_t t = 0; t < TILE; t++) s[t] = max2(s[t], FLT_MIN); /* a dead node's zero flow / FLT_MIN = 0 */
        }
    }
    return linear ? !any_set(low) : 1;
}

/* The leaves of the linear upward: FALSE 0, TRUE lin_true, x_i = sigma(r) lin_pos, not x_i =
 * sigma(-r) lin_neg, from one exp per variable: with e = exp(-|r|), sigma(|r|) = 1 / (1 + e) and
 * sigma(-|r|) = e / (1 + e). rt [n][TILE]; p [n][TILE] gets sigma(r) unless NULL. Returns 0 when
 * a logit is neither -inf nor within 80 of 0 (NaN and +inf included): e would be below the
 * smallest normal float, with fewer than 24 bits, and the tile takes the logarithms. */
static int linear_leaves(const Prog *P, const float *rt, float *val, float *p) {
    const int64_t m = P->n * TILE;
    float *pos = val + 2 * TILE, *neg = pos + m, bad = 0.0f;
    const float lin_pos = (float)P->lin_pos, lin_neg = (float)P->lin_neg, lin_true = (float)P->lin_true;
    for (int64_t t = 0; t < TILE; t++) {
        val[t] = 0.0f;
        val[TILE + t] = lin_true;
    }
    for (int64_t i = 0; i < m; i++) {
        neg[i] = -fabsf(rt[i]);
        bad = neg[i] >= -80.0f || rt[i] == -INFINITY ? bad : 1.0f;
    }
    if (bad != 0.0f) return 0;
    pm_exp(neg, m);
    for (int64_t i = 0; i < m; i++) {
        const float e = neg[i], big = 1.0f / (1.0f + e), small = e * big;
        const float sp = rt[i] >= 0.0f ? big : small, sn = rt[i] >= 0.0f ? small : big;
        if (p) p[i] = sp;
        pos[i] = sp * lin_pos;
        neg[i] = sn * lin_neg;
    }
    return 1;
}

/* The leaves' tangents along vt [n][TILE]: d log sigma(r) = (1 - p) vt, d log sigma(-r) = -p vt
 * (both kinds of upward carry tangents of log-values); FALSE and TRUE 0. p [n][TILE]: sigma(r). */
static void leaf_tangents(int64_t n, const float *p, const float *vt, float *dval) {
    memset(dval, 0, 2 * TILE * sizeof(float));
    float *dpos = dval + 2 * TILE, *dneg = dval + (2 + n) * TILE;
    for (int64_t i = 0; i < n * TILE; i++) {
        const float pv = p[i] * vt[i];
        dpos[i] = vt[i] - pv;
        dneg[i] = -pv;
    }
}

/* The logits of tile t0..t0+nt of r [T, n], less the shift, as [n][TILE] into rt (padding lanes:
 * pad_lanes). */
static void tile_logits(const float *r, const float *shift, int64_t n, int64_t t0, int64_t nt, float *rt) {
    load_tile(r, n, t0, nt, 0.0f, rt);
    shift_tile(shift, n, t0, nt, rt);
    pad_lanes(n, nt, rt);
}

/* shift[t0 + t] = the k-th largest logit of token t0 + t of r [T, n] (NaN counts as -inf), 0 where
 * that is not finite: Circuit._shift (kth_largest, then 0), made inside a pass's tile instead of by
 * a call of its own. Each lane's k largest sink through a sorted column by max/min swaps, as in
 * select.c. rt [n][TILE], best [k][TILE], carry [TILE]: scratch. */
static void kth_shift(const float *r, int64_t n, int64_t k, int64_t t0, int64_t nt, float *rt, float *best,
                      float *carry, float *shift) {
    load_tile(r, n, t0, nt, 0.0f, rt);
    for (int64_t q = 0; q < k * TILE; q++) best[q] = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t t = 0; t < TILE; t++) {
            const float x = rt[i * TILE + t];
            carry[t] = x == x ? x : -INFINITY;
        }
        for (int64_t q = 0; q < k; q++)
            for (int64_t t = 0; t < TILE; t++) {
                const float x = carry[t], y = best[q * TILE + t];
                best[q * TILE + t] = max2(x, y);
                carry[t] = min2(x, y);
            }
    }
    for (int64_t t = 0; t < nt; t++) {
        const float v = best[(k - 1) * TILE + t];
        shift[t0 + t] = isfinite(v) ? v : 0.0f;
    }
}

/* The centring of the linear upward when every model has k true variables (lin_k >= 0): such a
 * circuit's distribution does not change when a token's logits all move by one amount, so the
 * linear pass moves them to where the circuit's constants assume them, their mean at the nominal
 * logit lin_r0. (Shifted to their k-th largest, logits that are nearly equal sit far from it at
 * exactly 16 of 256: P(exactly 16 | p = 1/2) ~ e^-120.) c [TILE]: the amount, the mean of a lane's
 * logits above -inf less lin_r0 (0 without one; +inf or NaN make it inf or NaN, and the leaves'
 * check then sends the tile to the logarithms), subtracted from rt [n][TILE] in place. */
static void centre(const Prog *P, float *rt, float *c) {
    const int64_t n = P->n;
    float cnt[TILE];
    for (int64_t t = 0; t < TILE; t++) c[t] = cnt[t] = 0.0f;
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < TILE; t++) {
            const float x = rt[i * TILE + t], live = x > -INFINITY;
            c[t] += live ? x : 0.0f;
            cnt[t] += live;
        }
    for (int64_t t = 0; t < TILE; t++) c[t] = cnt[t] > 0.0f ? c[t] / cnt[t] - P->lin_r0 : 0.0f;
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < TILE; t++) rt[i * TILE + t] -= c[t];
}

/* log Z of the logits before the centring, from the centred pass's (logz [TILE], in place): with
 * Z(r) = e_k(e^r) / prod(1 + e^r_i), log Z(r) = log Z(r - c) + k c - sum_i log((1 + e^r_i) /
 * (1 + e^(r_i - c))), and with x = r_i - c that ratio is sigma(-x) + sigma(x) e^c, a sum of two
 * positive terms (written e^c (sigma(x) + sigma(-x) e^-c) for c > 0, so nothing overflows).
 * A -inf logit's ratio is 1 exactly: its term is skipped (for c > 87, e^-c would underflow and its
 * log be -inf). sigma(+-x) from the stored leaves (val's rows: lin_pos and lin_neg times them);
 * the sum in double. */
static void uncentre_log_z(const Prog *P, const float *val, const float *c, float *logz) {
    const int64_t n = P->n;
    const float *pos = val + 2 * TILE, *neg = pos + n * TILE;
    double acc[TILE];
    float ec[TILE], x[TILE];
    const float up = 1.0f / (float)P->lin_pos, un = 1.0f / (float)P->lin_neg;
    for (int64_t t = 0; t < TILE; t++) {
        acc[t] = (double)P->lin_k * c[t];
        ec[t] = expf(-fabsf(c[t]));
    }
    for (int64_t i = 0; i < n; i++) {
        for (int64_t t = 0; t < TILE; t++) {
            const float sp = pos[i * TILE + t] * up, sn = neg[i * TILE + t] * un;
            x[t] = sp == 0.0f ? 1.0f : c[t] > 0.0f ? sp + sn * ec[t] : sn + sp * ec[t]; /* sp = 0: -inf */
        }
        pm_log(x, TILE);
        for (int64_t t = 0; t < TILE; t++) {
            const float sp = pos[i * TILE + t];
            acc[t] -= sp == 0.0f ? 0.0 : (double)x[t] + (c[t] > 0.0f ? (double)c[t] : 0.0);
        }
    }
    for (int64_t t = 0; t < TILE; t++) logz[t] = (float)(logz[t] + acc[t]);
}

static int desc(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* softplus in double: log(1 + e^z) for z in [-inf, inf) */
static inline double softplus(double z) { return (z > 0.0 ? z : 0.0) + log1p(exp(-fabs(z))); }

/* log(sigma(y) + sigma(-y) e^-d) for d >= 0, without cancellation (torch_passes._tilt_term). */
static inline float tilt_term(float y, float d) {
    const float soft = log1pf(expf(-fabsf(y))); /* sp(y), sp(-y) (not sp(y) - y: inf - inf at y = inf) */
    const float sy = (y > 0.0f ? y : 0.0f) + soft, smy = (y < 0.0f ? -y : 0.0f) + soft;
    if (y >= 0.0f) {
        const float z = -d - y;
        return ((z > 0.0f ? z : 0.0f) + log1pf(expf(-fabsf(z)))) - smy;
    }
    const float hi = max2(y, -d), lo = min2(y, -d);
    return (hi + log1pf(expf(lo - hi))) - sy;
}

#define TILT_STEPS 4 /* as torch_passes.TILT_STEPS */

/* The tilt of the pass on logarithms (torch_passes.tilt and _refine) for one tile: per lane c from the
 * kmin-th and kmax-th largest logits, then Newton steps on log sum sigma(r - c) towards the expected
 * size clamp(sum sigma(r), kmin, kmax); rt [n][TILE] becomes x = r - c in place. g [n][TILE] gets the
 * implicit variables' addends (not smooth), dg [n][TILE] (unless NULL) their tangents
 * (sigma(r) - sigma(x)) vt. c, cp, cn [TILE]; col [n], w [n][TILE]: scratch. */
static void tilt_tile(const Prog *P, float *rt, const float *vt, float *c, float *cp, float *cn, float *g,
                      float *dg, float *col, float *w, int refine) {
    const int64_t n = P->n, m = n * TILE, kmin = P->tilt_kmin, kmax = P->tilt_kmax;
    for (int64_t t = 0; t < TILE; t++) {
        for (int64_t i = 0; i < n; i++) col[i] = rt[i * TILE + t];
        qsort(col, n, sizeof(float), desc);
        const float hi = kmax > 0 ? col[kmax - 1] : INFINITY, lo = kmin > 0 ? col[kmin - 1] : INFINITY;
        const float cc = min2(lo, max2(hi, 0.0f));
        c[t] = isfinite(cc) ? cc : 0.0f;
    }
    if (kmax > 0 && refine) {
        float want[TILE], total[TILE], slope[TILE];
        for (int64_t s = 0; s <= TILT_STEPS; s++) { /* s = 0: sum sigma(r), the target */
            for (int64_t i = 0; i < m; i++) w[i] = -fabsf(rt[i] - (s ? c[i % TILE] : 0.0f));
            pm_exp(w, m);
            for (int64_t t = 0; t < TILE; t++) total[t] = slope[t] = 0.0f;
            for (int64_t i = 0; i < n; i++)
                for (int64_t t = 0; t < TILE; t++) {
                    const float x = rt[i * TILE + t] - (s ? c[t] : 0.0f), e = w[i * TILE + t], big = 1.0f / (1.0f + e);
                    const float q = x >= 0.0f ? big : e * big;
                    total[t] += q;
                    slope[t] += q * (1.0f - q);
                }
            for (int64_t t = 0; t < TILE; t++) {
                if (s == 0) {
                    want[t] = logf(min2(max2(total[t], (float)kmin), (float)kmax));
                    continue;
                }
                const float step = (logf(total[t]) - want[t]) * total[t] / slope[t];
                c[t] += total[t] > 0.0f && slope[t] > 0.0f && isfinite(step) ? min2(max2(step, -20.0f), 20.0f) : 0.0f;
            }
        }
    }
    for (int64_t t = 0; t < TILE; t++) {
        cp[t] = max2(c[t], 0.0f);
        cn[t] = min2(c[t], 0.0f);
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < TILE; t++) {
            const float r = rt[i * TILE + t], x = r - c[t];
            rt[i * TILE + t] = x;
            if (P->smooth || !g) continue;
            g[i * TILE + t] = c[t] > 0.0f ? tilt_term(x, c[t]) : c[t] < 0.0f ? tilt_term(-x, -c[t]) : 0.0f;
            if (dg) {
                const float sr = 1.0f / (1.0f + expf(-r)), sx = 1.0f / (1.0f + expf(-x));
                dg[i * TILE + t] = (sr - sx) * vt[i * TILE + t];
            }
        }
}

/* log Z of r from the tilted root's log-values logz [TILE] (in place): + kmax c+ + kmin c- + sum_i
 * sp(r_i - c) - sp(r_i), in double (equal logits would round alike n times). rt [n][TILE]. */
static void untilt_log_z(const Prog *P, const float *rt, const float *c, const float *cp, const float *cn,
                         float *logz) {
    double acc[TILE];
    for (int64_t t = 0; t < TILE; t++) acc[t] = (double)P->tilt_kmax * cp[t] + (double)P->tilt_kmin * cn[t];
    for (int64_t i = 0; i < P->n; i++) /* x = r - c in double (see torch_passes.tilt) */
        for (int64_t t = 0; t < TILE; t++) {
            const double r = rt[i * TILE + t];
            acc[t] += softplus(r - (double)c[t]) - softplus(r);
        }
    for (int64_t t = 0; t < TILE; t++) logz[t] = (float)((double)logz[t] + acc[t]);
}

/* p [n][TILE] = sigma(rt) */
static void sigmoid_rows(int64_t n, const float *rt, float *p) {
    const int64_t m = n * TILE;
    for (int64_t i = 0; i < m; i++) p[i] = -fabsf(rt[i]);
    pm_exp(p, m);
    for (int64_t i = 0; i < m; i++) {
        const float e = p[i], big = 1.0f / (1.0f + e);
        p[i] = rt[i] >= 0.0f ? big : e * big;
    }
}

/* The scratch floats the pass on logarithms takes for its tilt (up_tile's tw). */
#define TILT_FLOATS(n) ((size_t)(4 * (n) + 5) * TILE)

/* The leaves and the upward pass of one tile, linear when the program has the constants for it
 * and the tile stays in range, else on logarithms. rt [n][TILE]: tile t0..t0+nt of r less the
 * shift (tile_logits), centred in place by a linear try (see centre) and restored after a failed
 * one; p [n][TILE] gets sigma(r) (of the centred logits after a linear pass) unless NULL (the
 * tangents need it). With dval != NULL also the leaves' tangents d log sigma(r) = (1 - p) vt,
 * d log sigma(-r) = -p vt, and the nodes'. logz [nt]: log Z of the tile's tokens (NULL: not
 * wanted). top: [TILE] scratch. Returns 1 when the pass was linear, 0 on logarithms. */
static int up_tile(const Prog *P, float *rt, const float *r, const float *shift, int64_t t0, const float *vt,
                   float *p, float *val, float *ex, float *norm, float *dval, float *top, float *logz, int64_t nt,
                   float *tw) {
    const int64_t n = P->n, S = P->num_slots;
    if (P->lin_float) {
        float c[TILE];
        const int centred = P->lin_k >= 0.0f;
        if (centred) centre(P, rt, c);
        const int leaves_ok = linear_leaves(P, rt, val, p);
        if (leaves_ok && dval) leaf_tangents(n, p, vt, dval);
        if (leaves_ok && upward(P, val, ex, norm, dval, top, 1, NULL, NULL)) {
            if (logz) {
                /* log(root) + lin_root, not log(root e^-20): that product can fall below the
                 * smallest normal float (exactly 1 of 24, log Z = -100: off by 3e-3) */
                memcpy(top, val + (S - 1) * TILE, TILE * sizeof(float));
                pm_log(top, TILE);
                for (int64_t t = 0; t < TILE; t++) top[t] = (float)((double)top[t] + P->lin_root);
                if (centred) uncentre_log_z(P, val, c, top);
                memcpy(logz, top, nt * sizeof(float));
            }
            return 1;
        }
        if (centred) tile_logits(r, shift, n, t0, nt, rt); /* the same bits as before the centring */
    }
    /* on logarithms, tilted: tw holds c, c+, c-, a row of scratch, g, dg, and [n] + [n][TILE] scratch */
    float *c = tw, *cp = c + TILE, *cn = cp + TILE, *tmp = cn + TILE, *g = tmp + TILE, *dg = g + n * TILE;
    float *w = dg + n * TILE, *col = w + n * TILE;
    const int need_dg = dval && !P->smooth;
    tilt_tile(P, rt, vt, c, cp, cn, g, need_dg ? dg : NULL, col, w, 1);
    const Tilt tl = {c, cp, cn, g, need_dg ? dg : NULL};
    float *px = p ? p : w; /* sigma(x) for the leaves' tangents */
    leaves(n, rt, val, dval ? px : NULL);
    if (dval) leaf_tangents(n, px, vt, dval);
    upward(P, val, ex, norm, dval, top, 0, P->tilt_moves ? &tl : NULL, tmp);
    tile_logits(r, shift, n, t0, nt, rt); /* r back: sigma(r) for the implicit variables, log Z's offset */
    if (p) sigmoid_rows(n, rt, p);
    if (logz) {
        memcpy(top, val + (S - 1) * TILE, TILE * sizeof(float));
        untilt_log_z(P, rt, c, cp, cn, top);
        memcpy(logz, top, nt * sizeof(float));
    }
    return 0;
}

/* Exact ancestral sampling (torch_passes.sample) of one tile, tokens t0..t0+nt of r [T, n], into
 * z [T, n], or with `ch` the drawn variables by score into its slots (z unused). U [count, T]: the
 * uniforms, one row per vtree id; uid [S]: each decision slot's row of U.
 * fill [T, n]: uniforms for implicit variables (unused when the circuit is smooth).
 * logz [T]: the root's log-value, for the caller's checks (NULL: not wanted). Returns 1 when the
 * upward pass was linear, 0 on logarithms, -1 when scratch cannot be allocated. */
static int64_t sample_tile(const Prog *P, const float *r, const float *shift, const float *U, const int64_t *uid,
                           const float *fill, float *z, float *logz, int64_t T, int64_t t0, int64_t nt,
                           const Chosen *ch) {
    const int64_t n = P->n, S = P->num_slots, R = P->num_rows;
    const int64_t words = (n + 63) / 64;
    const size_t extra = ch ? (size_t)(2 * n + (n + 1 + 2 * words) * TILE) : 0; /* pm_put_chosen's, kth_shift's */
    float *buf = pm_scratch((size_t)(3 * n + 3 * S + R + 1) * TILE + TILT_FLOATS(n) + extra);
    if (!buf) return -1;
    float *rt = buf, *p = rt + n * TILE, *fl = p + n * TILE, *val = fl + n * TILE, *norm = val + S * TILE;
    float *act = norm + S * TILE, *ex = act + S * TILE, *top = ex + R * TILE; /* fl: the fill's uniforms */
    int32_t *at = (int32_t *)(top + TILE + TILT_FLOATS(n)); /* [2n]: past the tilt's scratch */
    float *column = (float *)(at + 2 * n);                     /* [n + 1][TILE] */
    uint64_t *bits = (uint64_t *)(column + (n + 1) * TILE);    /* [words][TILE] */
    if (ch && ch->k > 0) {
        kth_shift(r, n, ch->k, t0, nt, rt, column, column + n * TILE, ch->shift);
        shift = ch->shift;
    }
    tile_logits(r, shift, n, t0, nt, rt);
    const int linear = up_tile(P, rt, r, shift, t0, NULL, P->smooth ? NULL : p, val, ex, norm, NULL, top,
                               logz ? logz + t0 : NULL, nt, top + TILE);
    root_flow(act, S, S);
    for (int64_t d = P->num_nodes - 1; d >= 0; d--) {
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        const float *a = act + slot * TILE, *urow = U + uid[slot] * T + t0, *tot = norm + slot * TILE;
        /* VL lanes at a time, skipping those no token reaches (their flows are all 0). total is the
         * sum of the weights c accumulates, in the same order, and u < 1, so u * total < total:
         * some element passes. */
        for (int64_t b = 0; b < TILE; b += VL) {
            if (!any_lane(a + b)) continue;
            if (F == 1) {
                *(vf *)(act + P->prime[r0] * TILE + b) += *(const vf *)(a + b);
                *(vf *)(act + P->sub[r0] * TILE + b) += *(const vf *)(a + b);
                continue;
            }
            vf ub;
            if (b + VL <= nt) {
                ub = *(const vfu *)(urow + b);
            } else {
                for (int k = 0; k < VL; k++) ub[k] = b + k < nt ? urow[b + k] : 0.5f;
            }
            pick(P->prime, P->sub, act, ex, r0, F, b, a + b, (const float *)&ub, tot + b);
        }
    }
    const float *pos = act + 2 * TILE, *neg = act + (2 + n) * TILE;
    float *on = rt; /* [n][TILE], rt is free now */
    if (P->smooth || !fill) {
        for (int64_t k = 0; k < n * TILE; k++) on[k] = pos[k] > 0.0f ? 1.0f : 0.0f;
    } else { /* an implicit variable (neither literal reached) tosses its own coin */
        load_tile(fill, n, t0, nt, 1.0f, fl);
        for (int64_t k = 0; k < n * TILE; k++)
            on[k] = pos[k] > 0.0f ? 1.0f : neg[k] > 0.0f ? 0.0f : fl[k] < p[k] ? 1.0f : 0.0f;
    }
    if (!ch) {
        store_tile(on, n, t0, nt, z);
        return linear;
    }
    pm_chosen_bits(on, n, TILE, bits);
    for (int64_t t = 0; t < nt; t++) {
        const int64_t row = t0 + t, o = row * ch->slots;
        pm_put_chosen(bits, TILE, t, n, ch->p + row * n, ch->slots, n, ch->idx + o, ch->w + o, ch->mask + o, at);
    }
    return linear;
}

/* log Z and, when m != NULL, the marginals (torch_passes.upward, downward and marginals_from_flows)
 * for tokens t0..t0+nt (one tile): r, m [T, n], logz [T]; lin [T] (unless NULL): 1 for the tile's
 * tokens when its upward pass was linear, else 0. Returns 1 (linear upward), 0 or -1. */
static int64_t marginals_tile(const Prog *P, const float *r, const float *shift, float *m, float *logz, uint8_t *lin,
                              int64_t t0, int64_t nt) {
    const int64_t n = P->n, S = P->num_slots, R = P->num_rows;
    float *buf = pm_scratch((size_t)(2 * n + 3 * S + R + 2) * TILE + TILT_FLOATS(n));
    if (!buf) return -1;
    float *rt = buf, *p = rt + n * TILE, *val = p + n * TILE, *norm = val + S * TILE, *g = norm + S * TILE;
    float *ex = g + S * TILE, *top = ex + R * TILE, *coef = top + TILE;
    tile_logits(r, shift, n, t0, nt, rt);
    const int linear = up_tile(P, rt, r, shift, t0, NULL, P->smooth || !m ? NULL : p, val, ex, norm, NULL, top,
                               logz + t0, nt, coef + TILE);
    if (lin) memset(lin + t0, linear, nt);
    if (!m) return linear;
    root_flow(g, S, S);
    for (int64_t d = P->num_nodes - 1; d >= 0; d--) {
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        const float *gs = g + slot * TILE;
        if (F == 1) {
            pass_rows(g + P->prime[r0] * TILE, g + P->sub[r0] * TILE, gs);
            continue;
        }
        const float *nm = norm + slot * TILE;
        for (int64_t t = 0; t < TILE; t++) coef[t] = gs[t] / nm[t];
        for (int64_t e = 0; e < F; e++)
            flow_row(g + P->prime[r0 + e] * TILE, g + P->sub[r0 + e] * TILE, ex + (r0 + e) * TILE, coef);
    }
    float *gpos = g + 2 * TILE;
    const float *gneg = g + (2 + n) * TILE;
    if (!P->smooth) /* an implicit x_i is 1 with probability p_i */
        for (int64_t k = 0; k < n * TILE; k++) gpos[k] = gpos[k] + p[k] * (1.0f - gpos[k] - gneg[k]);
    store_tile(gpos, n, t0, nt, m);
    return linear;
}

/* log Z alone, accumulated in double (pm_log_z). A float pass rounds every leaf and element it
 * stores, and on rows whose values repeat (equal logits) those roundings go the same way through
 * the circuit's n levels: log Z off by up to 1e-5 where it is about 1 (exactly 16 of 256). Here the
 * linear upward (see upward) runs in double with the constants unrounded, on DLANES tokens at a
 * time: the logits (less the shift, as float: the same bits as the other passes), centred in
 * double when every model has k true variables (see centre and uncentre_log_z: log Z(r) =
 * log Z(x) + k c - sum_i log(sigma(-x_i) + sigma(x_i) e^c), x = r - c, the logarithm taken once per
 * DPROD variables of the product), leaves sigma(+-x) from exp(-|x|) (exp_nonpos), then each node
 * sum_e (prime sub) c_e. A lane is refused (bad = 1; the caller takes the float64 torch passes there) when a
 * logit is NaN, +inf, or further than DLIN_LEAF from the centre, when the centring moves it by more
 * than DLIN_CENTRE, or when a node leaves [DLIN_FLOOR, DLIN_TOP] other than by being
 * exactly 0 (a node that -inf logits make impossible is 0 from zero leaves, which is exact).
 * x [n][DLANES], val [S][DLANES]: scratch. */
#define DLANES 32
#define DLIN_LEAF 250.0  /* a leaf then stores at least e^-250 lin / 2 > 2^-340 (lin >= e^20) */
#define DLIN_CENTRE 40.0 /* a product of DPROD terms in [e^-40, 1] stays above 2^-1000 */
#define DPROD 16
#define DLIN_FLOOR 0x1p-350 /* with constants of at least 2^-300 (c_passes.DOUBLE_COEF_MIN), an element */
#define DLIN_TOP 0x1p350    /* of two children in range is a normal double: no rounding below 2^-1022 */

/* e^x for x in [-708, 0] in double, vectorisable (libm's exp is a call per value): x = k ln 2 + y
 * with |y| <= ln 2 / 2 (ln 2 in two parts), e^y by its Taylor series to y^12 (the rest below
 * 2e-16 of it), 2^k put into the exponent bits. Within a few units in the last place. */
static inline double exp_nonpos(double x) {
    const double shifter = 0x1.8p52; /* x log2(e) + shifter: k in the low bits */
    const double kd = x * 1.4426950408889634 + shifter, k = kd - shifter;
    const double y = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    double p = 1.0 / 479001600.0;
    p = p * y + 1.0 / 39916800.0;
    p = p * y + 1.0 / 3628800.0;
    p = p * y + 1.0 / 362880.0;
    p = p * y + 1.0 / 40320.0;
    p = p * y + 1.0 / 5040.0;
    p = p * y + 1.0 / 720.0;
    p = p * y + 1.0 / 120.0;
    p = p * y + 1.0 / 24.0;
    p = p * y + 1.0 / 6.0;
    p = p * y + 0.5;
    p = p * y + 1.0;
    p = p * y + 1.0;
    int64_t bits;
    memcpy(&bits, &kd, sizeof bits);
    bits = (bits - 0x4338000000000000LL + 1023) << 52; /* kd's bits less shifter's: k */
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* One variable's leaves for DLANES lanes: pos = sigma(x) lin_pos, neg = sigma(-x) lin_neg (-inf:
 * 0 and lin_neg); no = 1 where x is NaN, +inf or beyond DLIN_LEAF. */
static inline void dleaf_row(const double *restrict x, double *restrict pos, double *restrict neg, double lp,
                             double ln, double *restrict no) {
    for (int64_t t = 0; t < DLANES; t++) {
        const double v = x[t], a = fabs(v);
        const int dead = v == -INFINITY;
        no[t] = !dead && !(a <= DLIN_LEAF) ? 1.0 : no[t];
        const double e = exp_nonpos(a <= DLIN_LEAF ? -a : -DLIN_LEAF), big = 1.0 / (1.0 + e), small = e * big;
        pos[t] = (dead ? 0.0 : v >= 0.0 ? big : small) * lp;
        neg[t] = (dead ? 1.0 : v >= 0.0 ? small : big) * ln;
    }
}

/* prod *= sigma(-x) + sigma(x) e^c for c <= 0, sigma(x) + sigma(-x) e^-c for c > 0 (ec = e^-|c|; the
 * caller counts the c taken out of each live term), from the leaves just stored (up = 1 / lin_pos,
 * un = 1 / lin_neg); 1 for a -inf logit (sigma(x) = 0: its softplus does not move). */
static inline void uncentre_row(const double *restrict pos, const double *restrict neg, double up, double un,
                                const double *restrict c, const double *restrict ec, double *restrict prod) {
    for (int64_t t = 0; t < DLANES; t++) {
        const double sp = pos[t] * up, sn = neg[t] * un;
        prod[t] *= sp == 0.0 ? 1.0 : c[t] > 0.0 ? sp + sn * ec[t] : sn + sp * ec[t];
    }
}

/* v += (a b) ce for DLANES lanes. */
static inline void delement_row(double *restrict v, const double *restrict a, const double *restrict b, double ce) {
    for (int64_t t = 0; t < DLANES; t++) v[t] += (a[t] * b[t]) * ce;
}

static void log_z_block(const Prog *P, const float *r, const float *shift, int64_t t0, int64_t nt, double *x,
                        double *val, float *logz, uint8_t *bad) {
    const int64_t n = P->n, S = P->num_slots, L = DLANES;
    const int centred = P->lin_k >= 0.0f;
    double c[DLANES], ec[DLANES], acc[DLANES], no[DLANES], prod[DLANES];
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < L; t++) {
            const int64_t tok = t0 + (t < nt ? t : 0); /* padding lanes: the block's first token */
            const float v = r[tok * n + i];
            x[i * L + t] = shift ? (double)(v - shift[tok]) : (double)v;
        }
    for (int64_t t = 0; t < L; t++) c[t] = no[t] = 0.0, ec[t] = prod[t] = 1.0, acc[t] = P->lin_root;
    if (centred) {
        double cnt[DLANES];
        for (int64_t t = 0; t < L; t++) cnt[t] = 0.0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t t = 0; t < L; t++) {
                const double v = x[i * L + t];
                c[t] += v > -INFINITY ? v : 0.0; /* NaN and +inf: the leaves refuse the lane */
                cnt[t] += v > -INFINITY;
            }
        for (int64_t t = 0; t < L; t++) {
            c[t] = cnt[t] > 0.0 ? c[t] / cnt[t] - P->lin_r0 : 0.0;
            no[t] = fabs(c[t]) <= DLIN_CENTRE ? 0.0 : 1.0;
            c[t] = no[t] != 0.0 ? 0.0 : c[t];
            ec[t] = exp_nonpos(-fabs(c[t]));
            acc[t] += P->lin_k * c[t] - (c[t] > 0.0 ? cnt[t] * c[t] : 0.0); /* c > 0: e^c out of each term */
        }
        for (int64_t i = 0; i < n; i++)
            for (int64_t t = 0; t < L; t++) x[i * L + t] -= c[t];
    }
    double *pos = val + 2 * L, *neg = pos + n * L;
    for (int64_t t = 0; t < L; t++) val[t] = 0.0, val[L + t] = P->lin_true;
    for (int64_t i = 0; i < n; i++) {
        dleaf_row(x + i * L, pos + i * L, neg + i * L, P->lin_pos, P->lin_neg, no);
        if (!centred) continue;
        uncentre_row(pos + i * L, neg + i * L, 1.0 / P->lin_pos, 1.0 / P->lin_neg, c, ec, prod);
        if ((i + 1) % DPROD == 0 || i == n - 1)
            for (int64_t t = 0; t < L; t++) acc[t] -= log(prod[t]), prod[t] = 1.0;
    }
    for (int64_t d = 0; d < P->num_nodes; d++) {
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        double *v = val + slot * L;
        memset(v, 0, L * sizeof(double));
        for (int64_t e = r0; e < r0 + F; e++)
            delement_row(v, val + P->prime[e] * L, val + P->sub[e] * L, P->lin_coef[e]);
        for (int64_t t = 0; t < L; t++) no[t] = !(v[t] <= DLIN_TOP) || (v[t] != 0.0 && v[t] < DLIN_FLOOR) ? 1.0 : no[t];
    }
    const double *root = val + (S - 1) * L;
    for (int64_t t = 0; t < nt; t++) {
        bad[t] = no[t] != 0.0;
        const double lz = log(root[t]) + acc[t]; /* root 0: -inf, nothing satisfies */
        logz[t] = (float)(lz < 0.0 ? lz : 0.0);  /* a log-probability: its last bit is not above 0 */
    }
}

/* log Z of tokens t0..t0+nt (one tile) of r [T, n] into logz [T] by log_z_block on each block of
 * DLANES tokens; bad [T]: 1 where a token was refused (the caller takes another pass there).
 * Returns 1 when every token of the tile was done, 0 otherwise, -1. */
static int64_t log_z_tile(const Prog *P, const float *r, const float *shift, float *logz, uint8_t *bad, int64_t t0,
                          int64_t nt) {
    const int64_t n = P->n, S = P->num_slots;
    double *buf = (double *)pm_scratch((size_t)4 * (n + S) * DLANES); /* x [n][DLANES], val [S][DLANES] */
    if (!buf) return -1;
    int any = 0;
    for (int64_t b = 0; b < nt; b += DLANES) {
        const int64_t m = nt - b < DLANES ? nt - b : DLANES;
        log_z_block(P, r, shift, t0 + b, m, buf, buf + n * DLANES, logz + t0 + b, bad + t0 + b);
        for (int64_t t = 0; t < m; t++) any |= bad[t0 + b + t];
    }
    return !any;
}

/* MAP (torch_passes.max_upward and map_assignment) of one tile, tokens t0..t0+nt of r [T, n], into
 * z [T, n]; best [T]: the root's max log-value (-inf exactly when no assignment satisfies). An implicit
 * variable adds log max(p, 1 - p) to its element on the way up and takes r > 0 in the end; each
 * node takes its first maximal element. Returns 0, or -1. */
static int64_t map_tile(const Prog *P, const float *r, const float *shift, float *z, float *best, int64_t t0,
                        int64_t nt) {
    const int64_t n = P->n, S = P->num_slots, R = P->num_rows;
    float *buf = pm_scratch((size_t)(2 * n + 2 * S + R + 2) * TILE + TILT_FLOATS(n));
    if (!buf) return -1;
    float *rt = buf, *h = rt + n * TILE, *val = h + n * TILE, *act = val + S * TILE, *ex = act + S * TILE;
    float *gap = ex + R * TILE, *found = gap + TILE, *tw = found + TILE;
    float *c = tw, *cp = c + TILE, *cn = cp + TILE, *w = cn + 2 * TILE + 2 * n * TILE, *col = w + n * TILE;
    tile_logits(r, shift, n, t0, nt, rt);
    const int tilt = (int)P->tilt_moves; /* exactly-k: not tilted (torch_passes.max_upward) */
    if (tilt) tilt_tile(P, rt, NULL, c, cp, cn, NULL, NULL, col, w, 0); /* rt = x */
    leaves(n, rt, val, NULL);
    for (int64_t i = 0; i < n; i++) /* an implicit variable's best value (torch_passes.max_terms) */
        for (int64_t t = 0; t < TILE; t++) {
            const float x = rt[i * TILE + t], a = max2(x, -c[t]), sm = log1pf(expf(-fabsf(x)));
            h[i * TILE + t] = (x >= 0.0f ? (a - x) - sm : a - (sm + max2(x, 0.0f))) + cn[t];
        }
    const Tilt tl = {c, cp, cn, h, NULL};
    for (int64_t d = 0; d < P->num_nodes; d++) { /* max-product upward, tilted as torch: (prime + sub) + gap */
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        float *v = val + slot * TILE;
        for (int64_t t = 0; t < TILE; t++) v[t] = -INFINITY;
        for (int64_t e = r0; e < r0 + F; e++) {
            float *x = ex + e * TILE;
            if (!tilted(P, P->tilt_moves ? &tl : NULL, e)) {
                add_rows_max(x, v, val + P->prime[e] * TILE, val + P->sub[e] * TILE);
                continue;
            }
            tilt_addend(P, &tl, e, gap);
            add_rows(x, val + P->prime[e] * TILE, val + P->sub[e] * TILE);
            acc_row(x, gap);
            max_row(v, x);
        }
    }
    memcpy(gap, val + (S - 1) * TILE, TILE * sizeof(float));
    if (tilt) {
        tile_logits(r, shift, n, t0, nt, rt); /* r back (implicit variables take r > 0) */
        untilt_log_z(P, rt, c, cp, cn, gap); /* the best log-value for r */
    }
    memcpy(best + t0, gap, nt * sizeof(float));
    root_flow(act, S, S);
    for (int64_t d = P->num_nodes - 1; d >= 0; d--) { /* argmax descent */
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        const float *a = act + slot * TILE, *v = val + slot * TILE;
        memset(found, 0, TILE * sizeof(float));
        for (int64_t e = r0; e < r0 + F; e++)
            argmax_row(act + P->prime[e] * TILE, act + P->sub[e] * TILE, found, ex + e * TILE, v, a);
    }
    const float *pos = act + 2 * TILE, *neg = act + (2 + n) * TILE;
    for (int64_t k = 0; k < n * TILE; k++) /* into h, free now */
        h[k] = pos[k] > 0.0f ? 1.0f : (neg[k] > 0.0f || P->smooth) ? 0.0f : (rt[k] > 0.0f ? 1.0f : 0.0f);
    store_tile(h, n, t0, nt, z);
    return 0;
}

/* Cov(z) v (torch_passes.marginals_jvp) of one tile, tokens t0..t0+nt: r, v, out [T, n]. Forward-mode
 * tangents through the upward pass, then flows g and their tangents dg down. With `cg` (v unused)
 * the gradient of circuits::chosen_scores instead: v = g_t from the slots' gradient and the scores
 * of r (not shifted), and out = Cov(z) g_t + the scores' backward (chosen.c). Returns 1 (linear
 * upward), 0 or -1. */
static int64_t jvp_tile(const Prog *P, const float *r, const float *shift, const float *v, float *out, int64_t t0,
                        int64_t nt, const ChosenGrad *cg) {
    const int64_t n = P->n, S = P->num_slots, R = P->num_rows;
    const size_t extra = cg ? (size_t)(2 * n + 6) * TILE : 0; /* scores [n][TILE], top, q, 3 rows; kth_shift's */
    float *buf = pm_scratch((size_t)(3 * n + 6 * S + R + 3) * TILE + TILT_FLOATS(n) + extra);
    if (!buf) return -1;
    float *rt = buf, *vt = rt + n * TILE, *p = vt + n * TILE, *val = p + n * TILE, *dval = val + S * TILE;
    float *norm = dval + S * TILE, *g = norm + S * TILE, *dg = g + S * TILE, *ex = dg + S * TILE;
    float *top = ex + R * TILE, *coef = top + TILE, *dcoef = coef + TILE, *tw = dcoef + TILE;
    float *sc = tw + TILT_FLOATS(n), *q = sc + n * TILE, *spare = q + TILE; /* spare: [3][TILE] */
    int32_t *best = (int32_t *)(spare + 3 * TILE);
    if (cg && cg->k > 0) {
        float *column = spare + 4 * TILE; /* [k][TILE], then a row */
        kth_shift(r, n, cg->k, t0, nt, rt, column, column + n * TILE, cg->shift);
        shift = cg->shift;
    }
    if (cg) {
        load_tile(r, n, t0, nt, 0.0f, sc);
        pm_tile_scores(sc, n, TILE, cg->sigmoid, best, q, spare);
        pm_slot_tangents(cg->idx, cg->g, cg->mask, cg->slots, n, TILE, t0, nt, sc, vt);
    }
    tile_logits(r, shift, n, t0, nt, rt);
    if (!cg) load_tile(v, n, t0, nt, 0.0f, vt);
    const int linear = up_tile(P, rt, r, shift, t0, vt, p, val, ex, norm, dval, top, NULL, nt, tw);
    const float *gsum = tw + 4 * TILE + P->n * TILE; /* the tilt's dg (pass on logarithms, not smooth) */
    const Tilt tl = {NULL, NULL, NULL, NULL, gsum};
    float *tmp = tw + 3 * TILE;
    root_flow(g, S, 2 * S); /* g, and dg = 0 after it */
    for (int64_t d = P->num_nodes - 1; d >= 0; d--) {
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        const float *gs = g + slot * TILE, *dgs = dg + slot * TILE;
        if (F == 1) { /* weight 1, d e = d node: both flows pass through */
            pass_rows(g + P->prime[r0] * TILE, g + P->sub[r0] * TILE, gs);
            pass_rows(dg + P->prime[r0] * TILE, dg + P->sub[r0] * TILE, dgs);
            continue;
        }
        const float *nm = norm + slot * TILE, *dv = dval + slot * TILE;
        for (int64_t t = 0; t < TILE; t++) {
            coef[t] = gs[t] / nm[t];
            dcoef[t] = dgs[t] / nm[t] - dv[t] * coef[t];
        }
        for (int64_t e = 0; e < F; e++) {
            const int64_t pr = P->prime[r0 + e] * TILE, sb = P->sub[r0 + e] * TILE;
            const float *da = dval + pr;
            if (!linear && !P->smooth && P->imp_off[r0 + e] != P->imp_off[r0 + e + 1]) {
                tilt_tangent(P, &tl, r0 + e, da, tmp); /* d e with the tilt addend's tangent */
                da = tmp;
            }
            flow_rows(g + pr, g + sb, dg + pr, dg + sb, ex + (r0 + e) * TILE, da, dval + sb, coef, dcoef);
        }
    }
    const float *gpos = g + 2 * TILE, *gneg = g + (2 + n) * TILE, *dgneg = dg + (2 + n) * TILE;
    float *dgpos = dg + 2 * TILE;
    if (!P->smooth) /* an implicit x_i is 1 with probability p_i wherever neither literal is reached */
        for (int64_t k = 0; k < n * TILE; k++) {
            const float pi = p[k];
            dgpos[k] = dgpos[k] + pi * (1.0f - pi) * vt[k] * (1.0f - gpos[k] - gneg[k]) - pi * (dgpos[k] + dgneg[k]);
        }
    if (cg) pm_scores_backward(dgpos, vt, sc, best, q, cg->sigmoid, n, TILE, spare);
    store_tile(dgpos, n, t0, nt, out);
    return linear;
}

/* The entry points: tiles split statically over `threads` OpenMP threads (the runtime torch
 * itself uses, so its idle workers take the tiles). Tiles are independent, so the results do not
 * depend on the thread count. Each returns how many tiles took the linear upward pass (>= 0; MAP:
 * 0), or -1 when some thread's scratch cannot be allocated. OVER_TILES runs CALL, an expression of
 * the tile's tokens t0..t0+nt returning -1, 0 or 1 (linear), on every tile. */
#define OVER_TILES(T, CALL)                                                                                    \
    int64_t failed = 0, linear_tiles = 0;                                                                      \
    const int64_t tiles = ((T) + TILE - 1) / TILE;                                                             \
    _Pragma("omp parallel for num_threads(threads) schedule(static) reduction(| : failed) reduction(+ : linear_tiles) if (tiles > 1)") \
    for (int64_t k = 0; k < tiles; k++) {                                                                      \
        const int64_t t0 = k * TILE, nt = (T) - t0 < TILE ? (T) - t0 : TILE;                                   \
        const int64_t got = (CALL);                                                                            \
        failed |= got < 0;                                                                                     \
        linear_tiles += got > 0;                                                                               \
    }                                                                                                          \
    return failed ? -1 : linear_tiles

int64_t pm_sample(const Prog *P, const float *r, const float *shift, const float *U, const int64_t *uid,
                  const float *fill, float *z, float *logz, int64_t T, int64_t threads) {
    OVER_TILES(T, sample_tile(P, r, shift, U, uid, fill, z, logz, T, t0, nt, NULL));
}

int64_t pm_jvp(const Prog *P, const float *r, const float *shift, const float *v, float *out, int64_t T,
               int64_t threads) {
    OVER_TILES(T, jvp_tile(P, r, shift, v, out, t0, nt, NULL));
}

/* circuits::chosen_scores' forward: pm_sample's draw, then each token's drawn variables by the scores
 * p [T, n] into idx [T, slots] int64, w [T, slots] and mask [T, slots] (chosen.c, pm_put_chosen).
 * k > 0: the circuit's shift is each token's k-th largest logit (Circuit._shift), made per tile into
 * shift [T] (scratch the caller gives); k = 0: no shift. */
int64_t pm_chosen(const Prog *P, const float *r, int64_t k, float *shift, const float *U, const int64_t *uid,
                  const float *fill, const float *p, int64_t slots, int64_t *idx, float *w, uint8_t *mask, int64_t T,
                  int64_t threads) {
    const Chosen ch = {p, slots, idx, w, mask, k, shift};
    OVER_TILES(T, sample_tile(P, r, shift, U, uid, fill, NULL, NULL, T, t0, nt, &ch));
}

/* Its backward: the slots' gradient g [T, slots] at idx [T, slots] int32 (mask: the used slots) ->
 * out [T, n] = Cov(z) g_t + the scores' backward; sigmoid: the scores are sigmoid(r), else softmax(r);
 * k and shift as pm_chosen's. */
int64_t pm_chosen_backward(const Prog *P, const float *r, int64_t k, float *shift, const int32_t *idx,
                           const float *g, const uint8_t *mask, int64_t slots, int64_t sigmoid, float *out, int64_t T,
                           int64_t threads) {
    const ChosenGrad cg = {idx, g, mask, slots, sigmoid, k, shift};
    OVER_TILES(T, jvp_tile(P, r, shift, NULL, out, t0, nt, &cg));
}

int64_t pm_marginals(const Prog *P, const float *r, const float *shift, float *m, float *logz, uint8_t *lin, int64_t T,
                     int64_t threads) {
    OVER_TILES(T, marginals_tile(P, r, shift, m, logz, lin, t0, nt));
}

/* log Z alone, accumulated in double (log_z_tile): logz [T], and bad [T] = 1 for the tokens it
 * refused (their logz is not meaningful). Returns how many tiles had none refused; needs the
 * double constants (lin_coef; c_passes.py calls it only with them). */
int64_t pm_log_z(const Prog *P, const float *r, const float *shift, float *logz, uint8_t *bad, int64_t T,
                 int64_t threads) {
    OVER_TILES(T, log_z_tile(P, r, shift, logz, bad, t0, nt));
}

/* The tokens per tile (the entry points' tiles are ceil(T / this)). */
int64_t pm_tile_tokens(void) { return TILE; }

int64_t pm_map(const Prog *P, const float *r, const float *shift, float *z, float *best, int64_t T,
               int64_t threads) {
    OVER_TILES(T, map_tile(P, r, shift, z, best, t0, nt));
}
