/* The cardinality DP (the paper's Alg. 2) fused in C for fp32 on the CPU:
 * P(S | C) ∝ exp(Σ_{i∈S} r_i) for kmin <= |S| <= kmax over N variables, one tile of B tokens at a time.
 *
 * circuits/kernels/torch_dp.py is the reference and the oracle (read its module docstring first): the same two
 * sweeps (dp.up, dp.down, dp.cov_vec) with the same numerics: the tilt c of the circuit passes
 * (clamp(0, kmax-th largest, kmin-th largest logit), without its Newton steps) and the lattice on
 * log-probabilities of x = r - c (take = P[i, j-1] + log sigmoid(x_i), skip = P[i, j] +
 * log sigmoid(-x_i)), the finite LOG_ZERO
 * for -inf logits and unreachable states, logaddexp = max + log1p(exp(-|a - b|)), W =
 * sigmoid(take - skip) stored signed (min(W, 1 - W), the sign set where W >= 1/2), the band
 * probabilities as a softmax of P[N, j] + (j - kmin) c, and the clamped size draw; and its
 * precision: the log sweep's states L and the marginals' adjoints A in double, exp and log1p,
 * the tables W, dW, the linear sweep's states and Cov(z) v's adjoints in float (torch_dp's
 * "Precision" says why). tests/circuits/test_dp_native.py checks these functions
 * against it. Tiles whose logits allow it take the linear sweep instead (below), which is tested
 * against the log sweep.
 *
 * Layout: a tile's buffers are [rows][B] floats or doubles (B lanes = tokens), so the inner loops
 * over tokens vectorise. A level of the lattice is [K1][B] for j = 0..K (K1 = kmax + 1); the L and D
 * rows are [K1 + 1][B], with the always-empty j = -1 in front. The tables W (and dW for Cov(z) v) are
 * [N][K1][B], written by the up sweep and read back by the down sweep; B is the largest of
 * 128, 64, 32, 16 whose tables fit TABLE_BUDGET, so they stay in a core's L2 cache (see lanes()).
 * A draw without the marginals (the routing forward) keeps the linear sweep's states S [N + 1][K1 + 1][B]
 * in W's place instead, and makes W[i, c] on its path alone from them (draw_step_linear): a
 * division per token and variable, not per state, and the same bits.
 * exp and log1p run on whole levels through vmath.c (libmvec). A partial last tile is padded with logit 0,
 * tangent 0 and uniform 0.5; only its first nt lanes are written out. Tiles are split statically
 * over OpenMP threads, each with its own scratch; the results do not depend on the thread count.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define LOG_ZERO (-1e30f) /* dp.LOG_ZERO */
#define MAX_LANES 128
#define MIN_LANES 16
#define TABLE_BUDGET (640 * 1024) /* bytes of W (and dW) per thread */
#define ROWS_BUDGET (32 * 1024) /* bytes of a tile's [N][B] logits */
/* exp's arguments are clamped to EXP_MIN (kernels.h) and the results below it taken as 0: LOG_ZERO
 * states make many that would send libmvec's expf to its slow path. */

typedef struct {
    int64_t T, N, kmin, K1, B; /* tokens, variables, smallest size, kmax + 1, lanes per tile */
    int64_t linear;            /* whether tiles may take the linear sweep (0: always the log sweep) */
} Dims;

/* One tile's buffers, carved from its thread's scratch (NULL: not used by this entry point). */
typedef struct {
    float *rt, *vt;        /* [N][B]: logits (log sigmoid(x) once tilted, in the log sweep); tangents */
    float *wt;             /* [N][B]: the linear sweep's weights exp(r - tau); log sigmoid(-x) in the log sweep */
    float *W, *dW;         /* [N][K1][B]: W signed (see up_step), dW */
    float *S;              /* [N + 1][K1 + 1][B]: the linear sweep's states, kept for a draw alone (NULL:
                            * not kept; W's memory, which the log sweep overwrites) */
    double *L;             /* [2][K1 + 1][B]: L[i] and L[i + 1] for j = -1..K, alternating (the log sweep) */
    float *Lf;             /* the same memory as [2][K1 + 1][B] floats: the linear sweep's L */
    double *mx;            /* [B]: band_probs' scratch */
    float *D;              /* [2][K1 + 1][B]: their tangents */
    double *take;          /* [K1][B]: an up step's scratch */
    float *g;              /* [K1][B]: an up step's scratch */
    double *A, *f;         /* [K1][B]: the marginals' adjoints and flows (the band probabilities first) */
    float *cA, *cdA;       /* [K1][B]: Cov(z) v's adjoints and their tangents */
    float *cf, *cdf;       /* [B]: a size's flows and their tangents (cov_step) */
    float *out, *z;        /* [N][B]: m or Cov(z) v; the draw */
    float *p;              /* [N][B]: the scores softmax(r) or sigmoid(r) (chosen_backward_tile) */
    float *q;              /* [B]: 1 - p at each lane's largest logit (pm_tile_scores) */
    int32_t *top;          /* [B]: the variable of each lane's largest logit */
    float *rows3;          /* [3][B]: pm_scores_backward's scratch */
    float *tau, *u;        /* [B]: tau (the linear sweep's mean, or the tilt c); a variable's uniforms */
    float *nxs;            /* [B]: draw_step_linear's L[i + 1, c] */
    float *ts;             /* [K1][B]: the tilt's scratch */
    int32_t *c;            /* [B]: how many of the draw's members are still to come */
    float *bits;           /* [ceil(N / 64)][B] uint64: the draw as bit masks (chosen_tile) */
    float *at;             /* [2 K1]: pm_put_chosen's scratch */
} Tile;

/* Points the buffers of `w` into `base` (NULL: only counts); returns the floats they take.
 * tangents: the buffers of Cov(z) v; sampling: those of the draw; scores: p; states: S (a draw
 * without the marginals). */
static int64_t carve(Tile *w, const Dims *d, int tangents, int sampling, int scores, int states, float *base) {
    const int64_t N = d->N, K1 = d->K1, B = d->B, kept = (N + 1) * (K1 + 1);
    int64_t at = 0;
#define SLICE(field, type, n, used) /* n: elements of `type` (a float or a double; all counts are even) */ \
    (w->field = (used) && base ? (type *)(base + at) : NULL,                                    \
     at += (used) ? (n) * (int64_t)(sizeof(type) / sizeof(float)) : 0)
    SLICE(rt, float, N * B, 1);
    SLICE(vt, float, N * B, tangents);
    SLICE(wt, float, N * B, 1);
    SLICE(W, float, (states && kept > N * K1 ? kept : N * K1) * B, 1);
    w->S = states ? w->W : NULL;
    SLICE(dW, float, N * K1 * B, tangents);
    SLICE(L, double, 2 * (K1 + 1) * B, 1);
    w->Lf = (float *)w->L;
    SLICE(D, float, 2 * (K1 + 1) * B, tangents);
    SLICE(take, double, K1 * B, 1);
    SLICE(g, float, K1 * B, 1);
    SLICE(A, double, K1 * B, 1);
    SLICE(f, double, K1 * B, 1);
    SLICE(cA, float, K1 * B, tangents);
    SLICE(cdA, float, K1 * B, tangents);
    SLICE(cf, float, B, tangents);
    SLICE(cdf, float, B, tangents);
    SLICE(out, float, N * B, 1);
    SLICE(z, float, N * B, sampling);
    SLICE(bits, float, 2 * ((N + 63) / 64) * B, sampling); /* uint64 words */
    SLICE(at, float, 2 * K1, sampling);
    SLICE(p, float, N * B, scores);
    SLICE(q, float, B, scores);
    SLICE(top, int32_t, B, scores);
    SLICE(rows3, float, 3 * B, scores);
    SLICE(tau, float, B, 1);
    SLICE(mx, double, B, 1);
    SLICE(ts, float, K1 * B, 1);
    SLICE(u, float, B, sampling);
    SLICE(nxs, float, B, sampling);
    SLICE(c, int32_t, B, sampling); /* int32 and float have the same size */
#undef SLICE
    return at;
}


/* The lanes per tile: the largest power of two in [MIN_LANES, MAX_LANES] whose `tables` tables of
 * [N][K1][B] floats fit TABLE_BUDGET and whose [N][B] rows fit ROWS_BUDGET (MIN_LANES when none
 * does). The second keeps the transposes fast: they write N lines B floats apart, which share few
 * L1 sets. */
static int64_t lanes(int64_t N, int64_t K1, int64_t tables) {
    int64_t B = MAX_LANES;
    while (B > MIN_LANES && (tables * N * K1 * B * (int64_t)sizeof(float) > TABLE_BUDGET ||
                             N * B * (int64_t)sizeof(float) > ROWS_BUDGET))
        B /= 2;
    return B;
}

/* dst [8][ds] = the transpose of src [8][ss]: 8 rows of 8 floats each way. */
static inline void transpose8(const float *restrict src, int64_t ss, float *restrict dst, int64_t ds) {
#ifdef __AVX2__
    __m256 r[8], t[8];
    for (int q = 0; q < 8; q++) r[q] = _mm256_loadu_ps(src + q * ss);
    for (int q = 0; q < 8; q += 2) {
        t[q] = _mm256_unpacklo_ps(r[q], r[q + 1]);
        t[q + 1] = _mm256_unpackhi_ps(r[q], r[q + 1]);
    }
    for (int q = 0; q < 8; q += 4) {
        r[q] = _mm256_shuffle_ps(t[q], t[q + 2], 0x44);
        r[q + 1] = _mm256_shuffle_ps(t[q], t[q + 2], 0xEE);
        r[q + 2] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0x44);
        r[q + 3] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0xEE);
    }
    for (int q = 0; q < 4; q++) {
        _mm256_storeu_ps(dst + q * ds, _mm256_permute2f128_ps(r[q], r[q + 4], 0x20));
        _mm256_storeu_ps(dst + (q + 4) * ds, _mm256_permute2f128_ps(r[q], r[q + 4], 0x31));
    }
#else
    for (int q = 0; q < 8; q++)
        for (int k = 0; k < 8; k++) dst[k * ds + q] = src[q * ss + k];
#endif
}

/* src [T, N] rows t0..t0+nt -> dst [N][B]; lanes past nt hold 0. Blocks of 8 tokens and 8
 * variables by transpose8, the rest one by one. */
static void load_rows(const Dims *d, const float *src, int64_t t0, int64_t nt, float *dst) {
    const int64_t N = d->N, B = d->B, full = nt / 8 * 8, wide = N / 8 * 8;
    for (int64_t t = 0; t < full; t += 8)
        for (int64_t i = 0; i < wide; i += 8) transpose8(src + (t0 + t) * N + i, N, dst + i * B + t, B);
    for (int64_t t = 0; t < B; t++) {
        const float *row = t < nt ? src + (t0 + t) * N : NULL;
        for (int64_t i = t < full ? wide : 0; i < N; i++) dst[i * B + t] = row ? row[i] : 0.0f;
    }
}

/* src [N][B] -> dst [T, N] rows t0..t0+nt. */
static void store_rows(const Dims *d, const float *src, int64_t t0, int64_t nt, float *dst) {
    const int64_t N = d->N, B = d->B, full = nt / 8 * 8, wide = N / 8 * 8;
    for (int64_t t = 0; t < full; t += 8)
        for (int64_t i = 0; i < wide; i += 8) transpose8(src + i * B + t, B, dst + (t0 + t) * N + i, N);
    for (int64_t t = 0; t < nt; t++) {
        float *row = dst + (t0 + t) * N;
        for (int64_t i = t < full ? wide : 0; i < N; i++) row[i] = src[i * B + t];
    }
}

/* src [nt] -> dst [B], lanes past nt hold 0.5. */
static void load_uniforms(const float *src, int64_t nt, int64_t B, float *dst) {
    for (int64_t t = 0; t < B; t++) dst[t] = t < nt ? src[t] : 0.5f;
}

/* As dp.up (torch_passes.tilt_constant without the Newton steps): per lane the tilt c [B] =
 * clamp(0, kmax-th largest, kmin-th largest logit of rt [N][B]) (0 where not finite); then, with
 * x = r - c and soft = log1p(exp(-|x|)) (dp.log_sigmoids), rt = max(log sigmoid(x), LOG_ZERO) and
 * lq [N][B] = log sigmoid(-x). ts [K1][B], e [N][B]: scratch. */
static void tilt(const Dims *d, float *restrict rt, float *restrict lq, float *restrict c, float *restrict ts,
                 float *restrict e) {
    const int64_t N = d->N, B = d->B, K = d->K1 - 1, kmin = d->kmin, m = N * B;
    float *top = ts, *carry = top + K * B;
    for (int64_t k = 0; k < K * B; k++) top[k] = -INFINITY;
    for (int64_t i = 0; i < N; i++) { /* insertion into the sorted [K][B] per lane: the K largest */
        memcpy(carry, rt + i * B, B * sizeof(float));
        for (int64_t q = 0; q < K; q++)
            for (int64_t t = 0; t < B; t++) {
                const float x = carry[t], y = top[q * B + t];
                top[q * B + t] = x > y ? x : y;
                carry[t] = x > y ? y : x;
            }
    }
    for (int64_t t = 0; t < B; t++) {
        const float hi = K > 0 ? max2(top[(K - 1) * B + t], 0.0f) : INFINITY;
        const float lo = kmin > 0 ? top[(kmin - 1) * B + t] : INFINITY, cc = lo < hi ? lo : hi;
        c[t] = isfinite(cc) ? cc : 0.0f;
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t t = 0; t < B; t++) {
            const float x = -fabsf(rt[i * B + t] - c[t]);
            e[i * B + t] = x < EXP_MIN ? EXP_MIN : x;
        }
    pm_exp(e, m);
    pm_log1p(e, m); /* soft; about 2e-35 (not 0) where |x| > 80: far below a state's rounding */
    for (int64_t i = 0; i < N; i++)
        for (int64_t t = 0; t < B; t++) {
            const float x = rt[i * B + t] - c[t], soft = e[i * B + t];
            const float lp = -((x < 0.0f ? -x : 0.0f) + soft);
            rt[i * B + t] = lp < LOG_ZERO ? LOG_ZERO : lp; /* NaN stays NaN */
            lq[i * B + t] = -((x > 0.0f ? x : 0.0f) + soft);
        }
}

/* One step of Alg. 2 on log-probabilities for variable i: lo = P[i], hi = P[i + 1] ([K1 + 1][B]
 * doubles, row 0 is j = -1), lp = log sigmoid(x_i), lq = log sigmoid(-x_i) [B], w = W[i] [K1][B];
 * take [K1][B] doubles, g [K1][B] floats: scratch. With take = P[i, j-1] + lp, skip = P[i, j] + lq,
 * d = take - skip and e = exp(-|d|) in float (0 below EXP_MIN): P[i + 1, j] = logaddexp(skip, take)
 * = max + log1p(e), in double, and W[i, j] = sigmoid(d) stored signed as dp.unpack_w reads it:
 * e / (1 + e) = min(W, 1 - W), negative where d >= 0 (W >= 1/2; -0.0 for W = 1). W is exactly 0
 * at j = 0 (so a draw never takes more variables than its size). */
static void up_step(int64_t K1, int64_t B, const double *restrict lo, double *restrict hi, const float *restrict lp,
                    const float *restrict lq, float *restrict w, double *restrict take, float *restrict g) {
    const int64_t n = K1 * B;
    const double *prev = lo, *cur = lo + B; /* P[i, j-1] and P[i, j] for j = 0..K */
    double *next = hi + B;
    for (int64_t j = 0; j < K1; j++)
        for (int64_t t = 0; t < B; t++) {
            const int64_t k = j * B + t;
            take[k] = prev[k] + (double)lp[t];
            next[k] = cur[k] + (double)lq[t]; /* skip, for now */
            const float x = (float)-fabs(take[k] - next[k]);
            w[k] = x < EXP_MIN ? EXP_MIN : x; /* NaN stays NaN */
        }
    pm_exp(w, n);
    memcpy(g, w, n * sizeof(float));
    pm_log1p(g, n);
    for (int64_t k = 0; k < n; k++) {
        const double d = take[k] - next[k];
        const int far = (float)-fabs(d) < EXP_MIN;
        const float e = far ? 0.0f : w[k], small = e / (1.0f + e);
        w[k] = d >= 0.0 ? -small : small;
        next[k] = (next[k] > take[k] ? next[k] : take[k]) + (far ? 0.0 : (double)g[k]);
    }
}

/* W[i, j] from its signed entry s (up_step): 1 + s where the sign is set, else s. */
static inline float unpack_w(float s) { return signbit(s) ? 1.0f + s : s; }

/* The tangents of one up step (dp.up with v): lo = D[i], hi = D[i + 1] ([K1 + 1][B], row 0 is
 * j = -1, always 0), vi [B], w = W[i] (signed). With s = D[i, j-1] + v_i: D[i + 1, j] = lerp(D[i, j], s, W)
 * (torch.lerp's formula) and dw = dW[i] = (s - D[i + 1, j]) W. */

static void tangent_step(int64_t K1, int64_t B, const float *restrict lo, float *restrict hi, const float *restrict vi,
                         const float *restrict w, float *restrict dw) {
    const float *prev = lo, *cur = lo + B;
    float *next = hi + B;
    for (int64_t j = 0; j < K1; j++)
        for (int64_t t = 0; t < B; t++) {
            const int64_t k = j * B + t;
            const float s = prev[k] + vi[t], a = cur[k], wt = unpack_w(w[k]);
            const float nd = wt < 0.5f ? a + wt * (s - a) : s - (s - a) * (1.0f - wt);
            next[k] = nd;
            dw[k] = (s - nd) * wt;
        }
}

/* The linear sweep. Where a tile's logits allow it, the lattice holds numbers, not logarithms:
 * L[i, j] = 2^-s e_j(w_0..w_{i-1}) / C(i, j), the j-th elementary symmetric sum of w = exp(r - tau)
 * over the first i variables divided by its number of terms, with tau the mean of the row's finite
 * logits. As C(i + 1, j) = C(i, j) + C(i, j-1), a step is a weighted mean of two states,
 * L[i + 1, j] = a L[i, j] + b w_i L[i, j-1] with a = (i + 1 - j) / (i + 1) and b = j / (i + 1),
 * and W[i, j] = b w_i L[i, j-1] / L[i + 1, j]: two products and a division per state, where the
 * log sweep takes an exp, a log1p and a division.
 *
 * The numbers stay within float32, and the states are floats (W is stored signed, as in the log
 * sweep): a state's rounding is relative to it, not to a logarithm's magnitude, and on the nearly
 * equal rows where float log-states missed by 1.5e-5 these are within 2e-6 (docs/circuits.md,
 * "The DP's precision"). Divided by C(i, j), a state is the mean over the j-subsets of their
 * products, at most (the prefix's mean of w)^j (Maclaurin's inequality), so with U = the largest
 * min(i, kmax) log(mean of w_0..w_{i-1}), the scale 2^-s with s = ceil(U / ln 2) - 126
 * keeps every state below 2^127. Small states are checked as they are made: a reachable state (j
 * no more than the finite logits so far) below 2^-120 marks its lane. Above it a state is a normal
 * float, and the rounding of a term that fell below 2^-126 (2^-150 at most) is 2^-30 of it. A tile
 * with a marked lane is swept again on logarithms, whose tilt and LOG_ZERO take any logits; the
 * marks are looked at every 16 variables, so such a tile stops early. That happens for logits spread
 * far apart (c_dp.linear_tiles counts the tiles; docs/performance.md has the shares for
 * N(0, s^2) logits), and for ±1e4, NaN, +inf or rows without a finite logit (the last three
 * refused before the sweep). -inf logits are w = 0 exactly; unreachable states are exactly 0, W = 0. */
#define LINEAR_TOP 126 /* log2 of the largest state's bound after scaling */
#define LINEAR_FLOOR 0x1p-120f /* the smallest reachable state the linear sweep accepts */

/* The linear sweep's setup for a tile's logits rt [N][B] (not tilted): tau [B] (the mean of the
 * finite logits), wt [N][B] = exp(rt - tau), and s [B], the scale's power of two. Returns 0 (the
 * tile takes the log sweep) when a lane has no finite logit, a NaN or +inf, a weight that
 * overflows, or a bound U too large for the range between 2^-120 and 2^126. mean [N][B], cnt and
 * big [B]: scratch. */
static int linear_setup(const Dims *d, const float *restrict rt, float *restrict wt, float *restrict tau,
                        float *restrict s, float *restrict mean, float *restrict cnt, float *restrict big) {
    const int64_t N = d->N, K = d->K1 - 1, B = d->B;
    memset(tau, 0, B * sizeof(float));
    memset(cnt, 0, B * sizeof(float));
    for (int64_t i = 0; i < N; i++)
        for (int64_t t = 0; t < B; t++) {
            const float x = rt[i * B + t], live = x > -INFINITY; /* NaN is not counted: its w fails below */
            tau[t] += live ? x : 0.0f;
            cnt[t] += live;
        }
    for (int64_t t = 0; t < B; t++) tau[t] = cnt[t] > 0.0f ? tau[t] / cnt[t] : NAN;
    for (int64_t i = 0; i < N; i++)
        for (int64_t t = 0; t < B; t++) wt[i * B + t] = rt[i * B + t] - tau[t]; /* -inf stays -inf */
    pm_exp(wt, N * B); /* inf where r - tau > 88 */
    /* U: min(i + 1, K) log(the mean of w_0..w_i), largest over i: K log of the largest prefix mean
     * from i = K - 1 on, and the first K - 1 prefixes one by one (K logs per lane, not N). */
    float *sum = cnt; /* [B]: the running sum of w */
    memset(sum, 0, B * sizeof(float));
    for (int64_t t = 0; t < B; t++) big[t] = 0.0f;
    for (int64_t i = 0; i < N; i++) {
        const float inv = 1.0f / (float)(i + 1);
        for (int64_t t = 0; t < B; t++) {
            sum[t] += wt[i * B + t];
            const float m = sum[t] * inv;
            if (i + 1 < K) mean[i * B + t] = m;
            else big[t] = m > big[t] || m != m ? m : big[t]; /* NaN stays */
        }
    }
    const int64_t small = K < 1 ? 0 : N < K - 1 ? N : K - 1; /* the prefixes shorter than K */
    const int64_t rows = small < N ? small + 1 : small; /* and the largest mean of the others, if any */
    if (small < N) memcpy(mean + small * B, big, B * sizeof(float));
    pm_log(mean, rows * B);
    memset(s, 0, B * sizeof(float)); /* U, for now */
    for (int64_t i = 0; i < rows; i++) {
        const float m = (float)(i < small ? i + 1 : K);
        for (int64_t t = 0; t < B; t++) {
            const float u = m * mean[i * B + t];
            s[t] = u > s[t] || u != u ? u : s[t]; /* NaN stays; log 0 = -inf adds nothing */
        }
    }
    int ok = 1;
    for (int64_t t = 0; t < B; t++) {
        const float bits = s[t] * 1.44269502f; /* log2 of the bound */
        ok &= tau[t] == tau[t] && bits <= (float)(LINEAR_TOP + 100); /* NaN and inf fail */
        s[t] = ok ? ceilf(bits) - (float)LINEAR_TOP : 0.0f;
    }
    return ok;
}

/* One step of the linear sweep for variable i: lo = L[i], hi = L[i + 1] ([K1 + 1][B], row 0 is
 * j = -1, always 0), wi = w_i [B], w = W[i] [K1][B] (NULL: not made): L[i + 1, j] = keep + take
 * with keep = a L[i, j] and take = b w_i L[i, j-1], a = (i + 1 - j) / (i + 1), b = j / (i + 1)
 * (states past j = i + 1 are 0 whatever a is), and W[i, j] = linear_w(take, keep, L[i + 1, j]).
 * reach [B]: the finite logits among variables 0..i; a reachable state (j <= reach) below
 * LINEAR_FLOOR sets low [B] to 1. */
static inline float linear_a(int64_t i, int64_t j, float inv) { return (float)(i + 1 - j) * inv; }

/* W[i, j] of the linear sweep, stored signed as up_step's: take / L[i + 1, j] where take < keep,
 * else -(keep / L[i + 1, j]) (0 for an unreachable state, and at j = 0); nx = L[i + 1, j]. */
static inline float linear_w(float take, float keep, float nx) {
    return nx > 0.0f ? (take < keep ? take : -keep) / nx : 0.0f;
}

static inline void up_step_linear(int64_t i, int64_t K1, int64_t B, const float *restrict lo, float *restrict hi,
                                  const float *restrict wi, float *restrict w, const float *restrict reach,
                                  float *restrict low) {
    const float *prev = lo, *cur = lo + B;
    float *next = hi + B;
    const float inv = 1.0f / (float)(i + 1);
    for (int64_t j = 0; j < K1; j++) {
        const float jf = (float)j, a = linear_a(i, j, inv), b = jf * inv;
        if (w)
            for (int64_t t = 0; t < B; t++) {
                const int64_t k = j * B + t;
                const float take = (b * prev[k]) * wi[t], keep = a * cur[k], nx = keep + take;
                next[k] = nx;
                w[k] = linear_w(take, keep, nx);
                low[t] = jf <= reach[t] && nx < LINEAR_FLOOR ? 1.0f : low[t];
            }
        else /* the states alone: the draw makes the W it reads (draw_step_linear) */
            for (int64_t t = 0; t < B; t++) {
                const int64_t k = j * B + t;
                const float take = (b * prev[k]) * wi[t], keep = a * cur[k], nx = keep + take;
                next[k] = nx;
                low[t] = jf <= reach[t] && nx < LINEAR_FLOOR ? 1.0f : low[t];
            }
    }
}

/* The linear sweep's last row L[N] [K1][B] as the log sweep's: top [K1][B] doubles = log L[N, j] +
 * s ln 2 + log C(N, j), the log count tilted by tau (LOG_ZERO where the state is unreachable). */
static void linear_to_log(int64_t N, int64_t K1, int64_t B, const float *restrict last, double *restrict top,
                          const float *restrict s) {
    for (int64_t k = 0; k < K1 * B; k++) top[k] = last[k] > 0.0f ? (double)last[k] : 1.0;
    pm_log_double(top, K1 * B);
    double log_c = 0.0; /* log C(N, j), by C(N, j) = C(N, j - 1) (N - j + 1) / j (lgamma writes a global) */
    for (int64_t j = 0; j < K1; j++) {
        if (j > 0 && j <= N) log_c += log((double)(N - j + 1) / (double)j); /* past N: unreachable, unused */
        for (int64_t t = 0; t < B; t++) {
            const int64_t k = j * B + t;
            top[k] = last[k] > 0.0f ? (top[k] + (double)s[t] * 0.6931471805599453) + log_c : LOG_ZERO;
        }
    }
}

/* The sweeps of up_sweep after its setup: linear (then L holds numbers; returns 0 when a lane
 * went below LINEAR_FLOOR, 1 otherwise) or on logarithms (returns 1). The linear sweep of a tile
 * with S keeps every level there in place of W. */
static int sweep(const Dims *d, const Tile *w, int linear) {
    const int64_t N = d->N, K1 = d->K1, B = d->B, level = (K1 + 1) * B;
    float *reach = (float *)w->take, *low = w->g; /* [B]: free in the linear sweep */
    const float *s = (const float *)w->A; /* [B]: the linear scale's power of two (up_sweep) */
    float *const Lf = linear && w->S ? w->S : w->Lf;
    if (linear) {
        memset(Lf, 0, 2 * level * sizeof(float));
        for (int64_t t = 0; t < B; t++) Lf[B + t] = ldexpf(1.0f, -(int)s[t]); /* the empty set: 2^-s */
        memset(reach, 0, B * sizeof(float));
        memset(low, 0, B * sizeof(float));
    } else {
        for (int64_t k = 0; k < 2 * level; k++) w->L[k] = LOG_ZERO;
        for (int64_t t = 0; t < B; t++) w->L[B + t] = 0.0; /* the empty set: L[0, 0] = 0 */
    }
    if (w->vt) memset(w->D, 0, 2 * level * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
        const int64_t a = (i % 2) * level, b = ((i + 1) % 2) * level;
        float *wi = w->W + i * K1 * B;
        if (!linear) {
            up_step(K1, B, w->L + a, w->L + b, w->rt + i * B, w->wt + i * B, wi, w->take, w->g);
            if (w->vt) tangent_step(K1, B, w->D + a, w->D + b, w->vt + i * B, wi, w->dW + i * K1 * B);
            continue;
        }
        for (int64_t t = 0; t < B; t++) reach[t] += w->rt[i * B + t] > -INFINITY ? 1.0f : 0.0f;
        if (w->S) { /* every level kept, no W (the draw makes it) */
            memset(Lf + (i + 1) * level, 0, B * sizeof(float)); /* j = -1 */
            up_step_linear(i, K1, B, Lf + i * level, Lf + (i + 1) * level, w->wt + i * B, NULL, reach, low);
        } else {
            up_step_linear(i, K1, B, Lf + a, Lf + b, w->wt + i * B, wi, reach, low);
            if (w->vt) tangent_step(K1, B, w->D + a, w->D + b, w->vt + i * B, wi, w->dW + i * K1 * B);
        }
        if (i % 16 == 15 || i == N - 1)
            for (int64_t t = 0; t < B; t++)
                if (low[t] != 0.0f) return 0;
    }
    return 1;
}

/* Whether x [n] holds no inf or NaN. After a linear sweep, on its last row: the bound on the states
 * says that no state overflows; this guards it (an inf or NaN state leaves inf or NaN in every
 * state of its column below it, as a > 0 there or 0 inf = NaN). */
static int all_finite(const float *x, int64_t n) {
    int ok = 1;
    for (int64_t k = 0; k < n; k++) ok &= x[k] <= FLT_MAX; /* false for inf and NaN */
    return ok;
}

/* The up sweep (dp.up) of tokens t0..t0+nt of r [T, N] (NULL: rt holds them, loaded by the
 * caller): tau, W, and with tangents (the tile has
 * vt: loaded here from v [T, N], or by the caller when v is NULL) also D and dW; linear where the
 * tile's logits allow (*linear = 1), else on logarithms (0). Returns the last row [K1][B]: log
 * counts less j tau (linear; tau the mean logit) or P[N] (the log sweep; tau the tilt c); either
 * way the band's weights are it + (j - kmin) tau. *dtop = D[N] [K1][B] with tangents. */
static const double *up_sweep(const Dims *d, const Tile *w, const float *r, const float *v, int64_t t0, int64_t nt,
                              const float **dtop, int *linear) {
    const int64_t N = d->N, K1 = d->K1, B = d->B, level = (K1 + 1) * B;
    if (r) load_rows(d, r, t0, nt, w->rt);
    if (v) load_rows(d, v, t0, nt, w->vt);
    float *s = (float *)w->A; /* [B]: the linear scale's power of two; A is free until the down sweep */
    const float *last = w->S ? w->S + N * level + B : w->Lf + (N % 2) * level + B; /* the linear L[N] */
    *linear = d->linear && linear_setup(d, w->rt, w->wt, w->tau, s, w->out, (float *)w->take, w->g) &&
              sweep(d, w, 1) && all_finite(last, K1 * B);
    if (!*linear) {
        tilt(d, w->rt, w->wt, w->tau, w->ts, w->out);
        sweep(d, w, 0);
    }
    if (w->vt) *dtop = w->D + (N % 2) * level + B;
    if (*linear) { /* the last row, converted into take (free after the sweep) */
        linear_to_log(N, K1, B, last, w->take, s);
        return w->take;
    }
    return w->L + (N % 2) * level + B;
}

/* Up.band_probs into the adjoint seed: A [K1][B] = P(|S| = j) for j = kmin..K (the softmax of the
 * band weights top + (j - kmin) tau, -inf where top <= LOG_ZERO / 2: 0 for a size no subset reaches, NaN
 * when none is reachable), 0 below kmin, in double. top: up_sweep's last row [K1][B]; lc [K1][B],
 * mx [B]: scratch. */
static void band_probs(const Dims *d, const double *top, const float *tau, double *A, double *lc, double *mx) {
    const int64_t K1 = d->K1, B = d->B, kmin = d->kmin;
    memset(A, 0, kmin * B * sizeof(double));
    for (int64_t t = 0; t < B; t++) mx[t] = -INFINITY;
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) {
            const double x = top[j * B + t];
            lc[j * B + t] = x > LOG_ZERO / 2 ? x + (double)(j - kmin) * (double)tau[t] : -INFINITY;
            mx[t] = mx[t] > lc[j * B + t] ? mx[t] : lc[j * B + t];
        }
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) {
            const int64_t k = j * B + t;
            lc[k] -= mx[t]; /* NaN where no size is reachable */
            A[k] = lc[k] > -700.0 ? lc[k] : -700.0;
        }
    pm_exp_double(A + kmin * B, (K1 - kmin) * B);
    for (int64_t k = kmin * B; k < K1 * B; k++) A[k] = lc[k] > -700.0 ? A[k] : lc[k] == lc[k] ? 0.0 : NAN;
    double *sum = mx;
    memset(sum, 0, B * sizeof(double));
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) sum[t] += A[j * B + t];
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) A[j * B + t] /= sum[t];
}

/* The size of the draw (dp.down): with cum the cumulative band probabilities (in double, as
 * torch.cumsum) and x = min(u total, total (1 - FLT_EPSILON)), c = kmin + #{j: cum_j <= x}.
 * A [K1][B]: the band probabilities from kmin on; u [B]. */
static void draw_size(const Dims *d, const double *A, const float *u, int32_t *c) {
    const int64_t K1 = d->K1, B = d->B, kmin = d->kmin;
    for (int64_t t = 0; t < B; t++) {
        double total = 0.0;
        for (int64_t j = kmin; j < K1; j++) total += A[j * B + t];
        const double cap = total * (1.0 - (double)FLT_EPSILON), ux = (double)u[t] * total;
        const double x = ux < cap ? ux : cap;
        int32_t passed = 0;
        double acc = 0.0;
        for (int64_t j = kmin; j < K1; j++) {
            acc += A[j * B + t];
            passed += acc <= x;
        }
        c[t] = (int32_t)kmin + passed;
    }
}

/* One step of the draw along the path (dp.down): z_i = [u_i < W[i, c]], c -= z_i, exactly: where
 * W = 1 + s (s's sign set), as u - 1 < s, with u - 1 exact in float for the uniforms, multiples of
 * 2^-24 in [0, 1) (uniforms.c; the padding's 0.5), so the same as u < 1 + s in double. w = W[i]
 * [K1][B] (signed); u, c, z: [B]. */
static inline int32_t draw_one(float s, int32_t ct, float u) {
    /* c > 0: W[i, 0] is 0 for valid logits, but NaN together with |r| > 1e30 (validation off)
     * makes it 1 and would drive c negative, reading W rows below the table. */
    uint32_t bits; /* W = s + 1 where s's sign is set (unpack_w): u < W as u - 1 < s, without a branch */
    memcpy(&bits, &s, sizeof bits);
    return (ct > 0) & (u - (float)(bits >> 31) < s);
}

static void draw_step(int64_t B, const float *restrict w, const float *restrict u, int32_t *restrict c,
                      float *restrict z) {
    for (int64_t t = 0; t < B; t++) {
        const int32_t ct = c[t], on = draw_one(w[(ct > 0 ? ct : 0) * B + t], ct, u[t]);
        z[t] = (float)on;
        c[t] -= on;
    }
}

/* draw_step after a linear sweep that kept its states S (sweep): W[i, c] made from lo = L[i],
 * hi = L[i + 1] ([K1 + 1][B], row 0 is j = -1) and wi = w_i [B] by the operations of
 * up_step_linear, so the same bits as the W it would have stored: a division per lane and step
 * instead of one per state. With AVX2, L[i + 1, c] is the state the step before gathered (nxs
 * [B], gathered from hi at the first step, the last variable's). */
static void draw_step_linear(int64_t i, int64_t B, const float *restrict lo, const float *restrict hi,
                             const float *restrict wi, const float *restrict u, int32_t *restrict c,
                             float *restrict z, float *restrict nxs, int first) {
    const float inv = 1.0f / (float)(i + 1);
    int64_t t = 0;
#ifdef __AVX2__ /* 8 lanes at a time, the same operations (gathers for the three states) */
    const __m256 vinv = _mm256_set1_ps(inv), zero = _mm256_setzero_ps();
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), vB = _mm256_set1_epi32((int32_t)B);
    for (; t + 8 <= B; t += 8) {
        const __m256i ct = _mm256_loadu_si256((const __m256i *)(c + t));
        const __m256i j = _mm256_max_epi32(ct, _mm256_setzero_si256());
        const __m256i at = _mm256_add_epi32(_mm256_mullo_epi32(j, vB), lane); /* j B + lane */
        const __m256 b = _mm256_mul_ps(_mm256_cvtepi32_ps(j), vinv);
        const __m256i left = _mm256_sub_epi32(_mm256_set1_epi32((int32_t)(i + 1)), j); /* linear_a's i + 1 - j */
        const __m256 a = _mm256_mul_ps(_mm256_cvtepi32_ps(left), vinv);
        const __m256 prev = _mm256_i32gather_ps(lo + t, at, 4), cur = _mm256_i32gather_ps(lo + B + t, at, 4);
        const __m256 take = _mm256_mul_ps(_mm256_mul_ps(b, prev), _mm256_loadu_ps(wi + t));
        const __m256 keep = _mm256_mul_ps(a, cur);
        const __m256 nx = first ? _mm256_i32gather_ps(hi + B + t, at, 4) : _mm256_loadu_ps(nxs + t);
        const __m256 neg = _mm256_xor_ps(keep, _mm256_set1_ps(-0.0f)); /* -keep, -0.0 for 0 (W = 1) */
        const __m256 num = _mm256_blendv_ps(neg, take, _mm256_cmp_ps(take, keep, _CMP_LT_OQ));
        const __m256 sv = _mm256_and_ps(_mm256_div_ps(num, nx), _mm256_cmp_ps(nx, zero, _CMP_GT_OQ));
        /* u < W as draw_one: u - 1 < s where s's sign is set, else u < s */
        const __m256 one = _mm256_and_ps(_mm256_castsi256_ps(_mm256_srai_epi32(_mm256_castps_si256(sv), 31)),
                                         _mm256_set1_ps(1.0f));
        const __m256 below_ps = _mm256_cmp_ps(_mm256_sub_ps(_mm256_loadu_ps(u + t), one), sv, _CMP_LT_OQ);
        const __m256i below = _mm256_castps_si256(below_ps);
        const __m256i on = _mm256_and_si256(below, _mm256_cmpgt_epi32(ct, _mm256_setzero_si256())); /* -1 or 0 */
        _mm256_storeu_ps(z + t, _mm256_and_ps(_mm256_castsi256_ps(on), _mm256_set1_ps(1.0f)));
        _mm256_storeu_si256((__m256i *)(c + t), _mm256_add_epi32(ct, on));
        _mm256_storeu_ps(nxs + t, _mm256_blendv_ps(cur, prev, _mm256_castsi256_ps(on))); /* L[i, c] for step i - 1 */
    }
#else
    (void)nxs, (void)first;
#endif
    for (; t < B; t++) {
        const int32_t ct = c[t];
        const int64_t j = ct > 0 ? ct : 0;
        const float b = (float)j * inv, take = (b * lo[j * B + t]) * wi[t];
        const float keep = linear_a(i, j, inv) * lo[(j + 1) * B + t];
        const int32_t on = draw_one(linear_w(take, keep, hi[(j + 1) * B + t]), ct, u[t]);
        z[t] = (float)on;
        c[t] -= on;
    }
}

/* One step of the draw for variable i: draw_step_linear where the tile kept its linear states
 * (linear and S), else draw_step. */
static void draw_at(const Dims *d, const Tile *w, int linear, int64_t i, int32_t *c, float *z) {
    const int64_t K1 = d->K1, B = d->B, level = (K1 + 1) * B;
    if (linear && w->S)
        draw_step_linear(i, B, w->S + i * level, w->S + (i + 1) * level, w->wt + i * B, w->u, c, z, w->nxs,
                         i == d->N - 1);
    else
        draw_step(B, w->W + i * K1 * B, w->u, c, z);
}

/* Σ_j x[j] over a level: x [K1][B] doubles -> out [B] floats. */
static void sum_level(int64_t K1, int64_t B, const double *restrict x, float *restrict out) {
    for (int64_t t = 0; t < B; t++) {
        double acc = x[t];
        for (int64_t j = 1; j < K1; j++) acc += x[j * B + t];
        out[t] = (float)acc;
    }
}

/* One step of the down sweep (dp.down) for variable i, in double: F = A W[i], m_i = Σ_j F[j], then
 * A[i] = A (1 - W[i]) + F shifted down one size (the path through (i, j-1) took variable i into
 * (i + 1, j)); 1 - W comes from W's signed entry, so no cancellation where W is near 1.
 * A, f: [K1][B]; w = W[i] (signed); m [B]. */
static void down_step(int64_t K1, int64_t B, double *restrict A, const float *restrict w, double *restrict f,
                      float *restrict m) {
    const int64_t n = K1 * B;
    for (int64_t k = 0; k < n; k++) {
        const float s = w[k];
        const double neg = signbit(s) ? 1.0 : 0.0, wk = neg + (double)s, wc = (1.0 - neg) - (double)s;
        f[k] = A[k] * wk;
        A[k] *= wc;
    }
    sum_level(K1, B, f, m);
    for (int64_t k = 0; k < n - B; k++) A[k] += f[k + B];
}

/* One step of dp.cov_vec's down sweep, in float (the routing backward's; the marginals' down_step
 * is double): F = A W, dF = dA W + A dW, out_i = Σ_j dF[j], then A = A (1 - W) + F shifted and
 * dA = dA - dF + dF shifted. In one pass over the sizes, F and dF of size j + 1 made before A and dA
 * of size j are updated (the same operations as in three passes, so the same bits). A, dA: [K1][B];
 * w, dw = W[i] (signed), dW[i]; f, df [B]: scratch; out [B]. */
static void cov_step(int64_t K1, int64_t B, float *restrict A, float *restrict dA, const float *restrict w,
                     const float *restrict dw, float *restrict f, float *restrict df, float *restrict out) {
    for (int64_t t = 0; t < B; t++) { /* F, dF of size 0 */
        const float wk = unpack_w(w[t]);
        f[t] = A[t] * wk;
        df[t] = dA[t] * wk + A[t] * dw[t];
        out[t] = df[t];
    }
    for (int64_t j = 0; j < K1; j++) {
        float *a = A + j * B, *da = dA + j * B;
        const float *s = w + j * B;
        if (j + 1 < K1) {
            const float *s1 = s + B, *dw1 = dw + (j + 1) * B, *a1 = a + B, *da1 = da + B;
            for (int64_t t = 0; t < B; t++) {
                const float wk1 = unpack_w(s1[t]), fn = a1[t] * wk1, dfn = da1[t] * wk1 + a1[t] * dw1[t];
                const float wc = signbit(s[t]) ? -s[t] : 1.0f - s[t];
                out[t] += dfn;
                a[t] = a[t] * wc + fn;
                da[t] = (da[t] - df[t]) + dfn;
                f[t] = fn;
                df[t] = dfn;
            }
        } else {
            for (int64_t t = 0; t < B; t++) {
                const float wc = signbit(s[t]) ? -s[t] : 1.0f - s[t];
                a[t] *= wc;
                da[t] -= df[t];
            }
        }
    }
}

/* Cardinality.forward_marginals for tokens t0..t0+nt: r [T, N]; m [T, N] (NULL: not wanted);
 * U [(N + 1) T]: the size uniforms [T], then the variables' [N][T]; z [T, N] (both NULL: no draw).
 * Returns 1 when the tile took the linear sweep, 0 the log sweep, -1 when scratch cannot be
 * allocated. */
static int64_t forward_tile(const Dims *d, const float *r, const float *U, float *m, float *z, int64_t t0,
                            int64_t nt) {
    const int64_t T = d->T, N = d->N, K1 = d->K1, B = d->B;
    Tile w;
    float *buf = pm_scratch(carve(&w, d, 0, z != NULL, 0, z && !m, NULL));
    if (!buf) return -1;
    carve(&w, d, 0, z != NULL, 0, z && !m, buf);
    int linear;
    const double *top = up_sweep(d, &w, r, NULL, t0, nt, NULL, &linear);
    band_probs(d, top, w.tau, w.A, w.f, w.mx);
    if (z) {
        load_uniforms(U + t0, nt, B, w.u);
        draw_size(d, w.A, w.u, w.c);
    }
    for (int64_t i = N - 1; i >= 0; i--) {
        const float *wi = w.W + i * K1 * B;
        if (m) down_step(K1, B, w.A, wi, w.f, w.out + i * B);
        if (z) {
            load_uniforms(U + (i + 1) * T + t0, nt, B, w.u);
            draw_at(d, &w, linear, i, w.c, w.z + i * B);
        }
    }
    if (m) store_rows(d, w.out, t0, nt, m);
    if (z) store_rows(d, w.z, t0, nt, z);
    return linear;
}

/* The down sweep of dp.cov_vec after up_sweep with tangents (top, dtop: its last rows): Cov(z) v
 * into w->out [N][B], in float (cov_step). The adjoints start at A = q (the band probabilities)
 * and dA = q (D[N] - Σ_j q_j D[N, j]). */
static void cov_down(const Dims *d, const Tile *w, const double *top, const float *dtop) {
    const int64_t N = d->N, K1 = d->K1, B = d->B, kmin = d->kmin, n = K1 * B;
    double *q = w->A; /* [K1][B]: the band probabilities */
    band_probs(d, top, w->tau, q, w->f, w->mx);
    double *mean = w->mx; /* [B]: Σ_j q_j D[N, j] */
    memset(mean, 0, B * sizeof(double));
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) mean[t] += q[j * B + t] * dtop[j * B + t];
    for (int64_t k = 0; k < n; k++) {
        w->cA[k] = (float)q[k];
        w->cdA[k] = (float)(q[k] * ((double)dtop[k] - mean[k % B]));
    }
    for (int64_t i = N - 1; i >= 0; i--)
        cov_step(K1, B, w->cA, w->cdA, w->W + i * K1 * B, w->dW + i * K1 * B, w->cf, w->cdf, w->out + i * B);
}

/* Cardinality.cov_vec for tokens t0..t0+nt: Cov(z) v from r alone (dp.cov_vec); r, v, out [T, N].
 * Returns 1 (the linear sweep), 0 (the log sweep) or -1, as forward_tile. */
static int64_t cov_tile(const Dims *d, const float *r, const float *v, float *out, int64_t t0, int64_t nt) {
    Tile w;
    float *buf = pm_scratch(carve(&w, d, 1, 0, 0, 0, NULL));
    if (!buf) return -1;
    carve(&w, d, 1, 0, 0, 0, buf);
    int linear;
    const float *dtop = NULL;
    const double *top = up_sweep(d, &w, r, v, t0, nt, &dtop, &linear);
    cov_down(d, &w, top, dtop);
    store_rows(d, w.out, t0, nt, out);
    return linear;
}

/* The straight-through selection (circuits::chosen_scores, whose plain-torch reference is
 * circuits/kernels/straight_through.py): one draw z ~ P(z | C, r) from the counter-based uniforms of `seed`, the
 * same bits dp_forward reads from U (so the same draw), and then, per token, the drawn variables
 * by their score p descending, ties to the lower index (pm_topk_chosen's order), in `slots` slots:
 * idx [T, slots] int64, wv [T, slots] = p there, mask [T, slots] (1: a used slot). Unused slots hold
 * the lowest undrawn variables, ascending (distinct), weight 0, mask 0. */

/* The uniforms [B] of tokens t0..t0+nt at `offset` of the draw (the sizes at 0, variable i at
 * (i + 1) T), lanes past nt 0.5 (load_uniforms' padding). */
static void make_uniforms(int64_t seed, int64_t offset, int64_t nt, int64_t B, float *u) {
    pm_uniforms_serial(seed, offset, nt, u);
    for (int64_t t = nt; t < B; t++) u[t] = 0.5f;
}

static int64_t chosen_tile(const Dims *d, const float *r, int64_t seed, const float *p, int64_t slots,
                           int64_t *idx, float *wv, uint8_t *mask, int64_t t0, int64_t nt) {
    const int64_t T = d->T, N = d->N, K1 = d->K1, B = d->B;
    Tile w;
    float *buf = pm_scratch(carve(&w, d, 0, 1, 0, 1, NULL));
    if (!buf) return -1;
    carve(&w, d, 0, 1, 0, 1, buf);
    int linear;
    const double *top = up_sweep(d, &w, r, NULL, t0, nt, NULL, &linear);
    band_probs(d, top, w.tau, w.A, w.f, w.mx);
    make_uniforms(seed, t0, nt, B, w.u);
    draw_size(d, w.A, w.u, w.c);
    for (int64_t i = N - 1; i >= 0; i--) {
        make_uniforms(seed, (i + 1) * T + t0, nt, B, w.u);
        draw_at(d, &w, linear, i, w.c, w.z + i * B);
    }
    uint64_t *bits = (uint64_t *)w.bits;
    pm_chosen_bits(w.z, N, B, bits);
    for (int64_t t = 0; t < nt; t++) {
        const int64_t row = t0 + t;
        pm_put_chosen(bits, B, t, N, p + row * N, slots, K1, idx + row * slots, wv + row * slots, mask + row * slots,
                      (int32_t *)w.at);
    }
    return linear;
}

/* The backward of the routing operator for tokens t0..t0+nt: with p the scores (recomputed from r)
 * and g_t = (Σ of the used slots' g [T, slots] at their variables idx) ⊙ p, the gradient
 * out [T, N] = Cov(z) g_t + the scores' backward (chosen.c). Returns 1, 0 or -1 as forward_tile. */
static int64_t chosen_backward_tile(const Dims *d, const float *r, const int32_t *idx, const float *g,
                                    const uint8_t *mask, int64_t slots, int sigmoid, float *out, int64_t t0,
                                    int64_t nt) {
    const int64_t N = d->N, B = d->B;
    Tile w;
    float *buf = pm_scratch(carve(&w, d, 1, 0, 1, 0, NULL));
    if (!buf) return -1;
    carve(&w, d, 1, 0, 1, 0, buf);
    load_rows(d, r, t0, nt, w.rt);
    memcpy(w.p, w.rt, N * B * sizeof(float));
    pm_tile_scores(w.p, N, B, sigmoid, w.top, w.q, w.tau);
    pm_slot_tangents(idx, g, mask, slots, N, B, t0, nt, w.p, w.vt);
    int linear;
    const float *dtop = NULL;
    const double *top = up_sweep(d, &w, NULL, NULL, t0, nt, &dtop, &linear); /* rt: loaded above */
    cov_down(d, &w, top, dtop);
    pm_scores_backward(w.out, w.vt, w.p, w.top, w.q, sigmoid, N, B, w.rows3);
    store_rows(d, w.out, t0, nt, out);
    return linear;
}

/* The entry points: tiles of B tokens split statically over `threads` OpenMP threads (the runtime
 * torch itself uses). Each returns how many tiles took the linear sweep (>= 0), or -1 when some
 * thread's scratch cannot be allocated. OVER_TILES runs CALL, an expression of the tile's tokens
 * t0..t0+nt, on every tile. */
#define OVER_TILES(d, CALL)                                                                                    \
    int64_t failed = 0, linear_tiles = 0;                                                                        \
    const int64_t tiles = ((d).T + (d).B - 1) / (d).B;                                                         \
    _Pragma("omp parallel for num_threads(threads) schedule(static) reduction(| : failed) reduction(+ : linear_tiles) if (tiles > 1)") \
    for (int64_t k = 0; k < tiles; k++) {                                                                      \
        const int64_t t0 = k * (d).B, nt = (d).T - t0 < (d).B ? (d).T - t0 : (d).B;                            \
        const int64_t got = (CALL);                                                                            \
        failed |= got < 0;                                                                                     \
        linear_tiles += got > 0;                                                                               \
    }                                                                                                          \
    return failed ? -1 : linear_tiles

/* Cardinality.forward_marginals: r [T, N] -> m [T, N] (NULL: not wanted) and one draw z [T, N]
 * from the uniforms U [(N + 1) T] (both NULL: no draw), for kmin <= |S| <= kmax. linear: 1 lets
 * tiles take the linear sweep where their logits allow (0: the log sweep everywhere, for tests). */
int64_t dp_forward(const float *r, const float *U, float *m, float *z, int64_t T, int64_t N, int64_t kmin,
                   int64_t kmax, int64_t linear, int64_t threads) {
    const Dims d = {T, N, kmin, kmax + 1, lanes(N, kmax + 1, 1), linear};
    OVER_TILES(d, forward_tile(&d, r, U, m, z, t0, nt));
}

/* Cardinality.cov_vec: Cov(z) v, r, v, out [T, N], for kmin <= |S| <= kmax; linear as dp_forward. */
int64_t dp_cov_vec(const float *r, const float *v, float *out, int64_t T, int64_t N, int64_t kmin, int64_t kmax,
                   int64_t linear, int64_t threads) {
    const Dims d = {T, N, kmin, kmax + 1, lanes(N, kmax + 1, 2), linear};
    OVER_TILES(d, cov_tile(&d, r, v, out, t0, nt));
}

/* The tokens per tile of dp_forward for N variables and kmax: its tiles are ceil(T / this). */
int64_t dp_forward_lanes(int64_t N, int64_t kmax) { return lanes(N, kmax + 1, 1); }

/* The routing operator's forward (chosen_tile): r [T, N], p [T, N] the scores, one draw from `seed`
 * for kmin <= |S| <= kmax -> idx [T, slots] int64, wv [T, slots], mask [T, slots] uint8. */
int64_t dp_chosen(const float *r, int64_t seed, const float *p, int64_t *idx, float *wv, uint8_t *mask, int64_t T,
                  int64_t N, int64_t kmin, int64_t kmax, int64_t slots, int64_t linear, int64_t threads) {
    const Dims d = {T, N, kmin, kmax + 1, lanes(N, kmax + 1, 1), linear};
    OVER_TILES(d, chosen_tile(&d, r, seed, p, slots, idx, wv, mask, t0, nt));
}

/* Its backward (chosen_backward_tile): r [T, N], idx [T, slots] int32, g [T, slots], mask [T, slots]
 * uint8 -> out [T, N]; sigmoid: the scores are sigmoid(r), else softmax(r). */
int64_t dp_chosen_backward(const float *r, const int32_t *idx, const float *g, const uint8_t *mask, float *out,
                           int64_t T, int64_t N, int64_t kmin, int64_t kmax, int64_t slots, int64_t sigmoid,
                           int64_t linear, int64_t threads) {
    const Dims d = {T, N, kmin, kmax + 1, lanes(N, kmax + 1, 2), linear};
    OVER_TILES(d, chosen_backward_tile(&d, r, idx, g, mask, slots, (int)sigmoid, out, t0, nt));
}
