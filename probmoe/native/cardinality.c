/* The cardinality DP (the paper's Alg. 2) fused in C for fp32 on the CPU:
 * P(S | C) ∝ exp(Σ_{i∈S} r_i) for kmin <= |S| <= kmax over N experts, one tile of B tokens at a time.
 *
 * probmoe/dp.py is the reference and the oracle (read its module docstring first): the same two
 * sweeps (dp.up, dp.down, dp.cov_vec) with the same numerics: the row-max tilt tau, the finite
 * LOG_ZERO for -inf logits and unreachable states, logaddexp = max + log1p(exp(-|a - b|)),
 * W = sigmoid(take - L[i, j]), the band probabilities as a softmax of the log counts, and the
 * clamped size draw. tests/test_dp_native.py checks these functions against it.
 *
 * Layout: a tile's buffers are [rows][B] floats (B lanes = tokens), so the inner loops over tokens
 * vectorise. A level of the lattice is [K1][B] for j = 0..K (K1 = kmax + 1); the L and D rows are
 * [K1 + 1][B], with the always-empty j = -1 in front. The tables W (and dW for Cov(z) v) are
 * [N][K1][B], written by the up sweep and read back by the down sweep; B is the largest of
 * 128, 64, 32, 16 whose tables fit TABLE_BUDGET, so they stay in a core's L2 cache (see lanes()).
 * exp and log1p run on whole levels through vmath.c (libmvec). A partial last tile is padded with logit 0,
 * tangent 0 and uniform 0.5; only its first nt lanes are written out. Tiles are split statically
 * over OpenMP threads, each with its own scratch; the results do not depend on the thread count.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void pm_exp(float *x, int64_t n);
void pm_log1p(float *x, int64_t n);

#define LOG_ZERO (-1e30f) /* dp.LOG_ZERO */
#define MAX_LANES 128
#define MIN_LANES 16
#define TABLE_BUDGET (640 * 1024) /* bytes of W (and dW) per thread */
#define ROWS_BUDGET (32 * 1024) /* bytes of a tile's [N][B] logits */
/* exp's arguments are clamped to EXP_MIN and the results below it taken as 0: libmvec's expf takes
 * a slow scalar path for a whole vector when one argument's exp underflows (LOG_ZERO states make
 * many), as does its log1pf near FLT_MIN; exp(EXP_MIN) ~ 2e-35 is safe for both. */
#define EXP_MIN (-80.0f)

/* max as a comparison, which vectorises (fmaxf's NaN rules make gcc call libm). */
static inline float max2(float a, float b) { return a > b ? a : b; }

typedef struct {
    int64_t T, N, kmin, K1, B; /* tokens, experts, smallest size, kmax + 1, lanes per tile */
} Dims;

/* One tile's buffers, carved from its thread's scratch (NULL: not used by this entry point). */
typedef struct {
    float *rt, *vt;        /* [N][B]: tilted logits; tangents */
    float *W, *dW;         /* [N][K1][B] */
    float *L, *D;          /* [2][K1 + 1][B]: L[i] and L[i + 1] for j = -1..K, alternating; their tangents */
    float *take, *g;       /* [K1][B]: an up step's scratch */
    float *A, *dA, *f, *df; /* [K1][B]: adjoints, flows and their tangents */
    float *out, *z;        /* [N][B]: m or Cov(z) v; the draw */
    float *tau, *u;        /* [B]: the tilt; an expert's uniforms */
    int32_t *c;            /* [B]: how many of the draw's members are still to come */
} Tile;

/* Points the buffers of `w` into `base` (NULL: only counts); returns the floats they take.
 * tangents: the buffers of Cov(z) v; sampling: those of the draw. */
static int64_t carve(Tile *w, const Dims *d, int tangents, int sampling, float *base) {
    const int64_t N = d->N, K1 = d->K1, B = d->B;
    int64_t at = 0;
#define SLICE(field, type, n, used) \
    (w->field = (used) && base ? (type *)(base + at) : NULL, at += (used) ? (n) : 0)
    SLICE(rt, float, N * B, 1);
    SLICE(vt, float, N * B, tangents);
    SLICE(W, float, N * K1 * B, 1);
    SLICE(dW, float, N * K1 * B, tangents);
    SLICE(L, float, 2 * (K1 + 1) * B, 1);
    SLICE(D, float, 2 * (K1 + 1) * B, tangents);
    SLICE(take, float, K1 * B, 1);
    SLICE(g, float, K1 * B, 1);
    SLICE(A, float, K1 * B, 1);
    SLICE(dA, float, K1 * B, tangents);
    SLICE(f, float, K1 * B, 1);
    SLICE(df, float, K1 * B, tangents);
    SLICE(out, float, N * B, 1);
    SLICE(z, float, N * B, sampling);
    SLICE(tau, float, B, 1);
    SLICE(u, float, B, sampling);
    SLICE(c, int32_t, B, sampling); /* int32 and float have the same size */
#undef SLICE
    return at;
}

float *pm_scratch(size_t floats); /* scratch.c: this thread's buffer of at least `floats` floats */

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

/* src [T, N] rows t0..t0+nt -> dst [N][B]; lanes past nt hold 0. */
static void load_rows(const Dims *d, const float *src, int64_t t0, int64_t nt, float *dst) {
    const int64_t N = d->N, B = d->B;
    for (int64_t t = 0; t < B; t++) {
        const float *row = t < nt ? src + (t0 + t) * N : NULL;
        for (int64_t i = 0; i < N; i++) dst[i * B + t] = row ? row[i] : 0.0f;
    }
}

/* src [N][B] -> dst [T, N] rows t0..t0+nt. */
static void store_rows(const Dims *d, const float *src, int64_t t0, int64_t nt, float *dst) {
    const int64_t N = d->N, B = d->B;
    for (int64_t t = 0; t < nt; t++) {
        float *row = dst + (t0 + t) * N;
        for (int64_t i = 0; i < N; i++) row[i] = src[i * B + t];
    }
}

/* src [nt] -> dst [B], lanes past nt hold 0.5. */
static void load_uniforms(const float *src, int64_t nt, int64_t B, float *dst) {
    for (int64_t t = 0; t < B; t++) dst[t] = t < nt ? src[t] : 0.5f;
}

/* As dp.up: tau [B] = the row max of rt [N][B] (0 where it is not finite), then
 * rt = max(rt - tau, LOG_ZERO) (-inf logits -> LOG_ZERO). */
static void tilt(const Dims *d, float *restrict rt, float *restrict tau) {
    const int64_t N = d->N, B = d->B;
    for (int64_t t = 0; t < B; t++) tau[t] = -INFINITY;
    for (int64_t i = 0; i < N; i++)
        for (int64_t t = 0; t < B; t++) tau[t] = max2(tau[t], rt[i * B + t]);
    for (int64_t t = 0; t < B; t++) tau[t] = isfinite(tau[t]) ? tau[t] : 0.0f;
    for (int64_t i = 0; i < N; i++)
        for (int64_t t = 0; t < B; t++) {
            const float x = rt[i * B + t] - tau[t];
            rt[i * B + t] = x < LOG_ZERO ? LOG_ZERO : x; /* NaN stays NaN, as torch's clamp */
        }
}

/* One step of Alg. 2 for expert i: lo = L[i], hi = L[i + 1] ([K1 + 1][B], row 0 is j = -1),
 * ri = r_i - tau [B], w = W[i] [K1][B]; take, g: [K1][B] scratch. With take = L[i, j-1] + r_i,
 * d = take - L[i, j] and e = exp(-|d|) (0 below EXP_MIN): L[i + 1, j] = logaddexp(L[i, j], take)
 * = max + log1p(e) and W[i, j] = sigmoid(d) = (d >= 0 ? 1 : e) / (1 + e), exactly 0 at j = 0 (so
 * a draw never takes more experts than its size). */
static void up_step(int64_t K1, int64_t B, const float *restrict lo, float *restrict hi, const float *restrict ri,
                    float *restrict w, float *restrict take, float *restrict g) {
    const int64_t n = K1 * B;
    const float *prev = lo, *cur = lo + B; /* L[i, j-1] and L[i, j] for j = 0..K */
    float *next = hi + B;
    for (int64_t j = 0; j < K1; j++)
        for (int64_t t = 0; t < B; t++) {
            const int64_t k = j * B + t;
            take[k] = prev[k] + ri[t];
            const float x = -fabsf(take[k] - cur[k]);
            w[k] = x < EXP_MIN ? EXP_MIN : x; /* NaN stays NaN */
        }
    pm_exp(w, n);
    memcpy(g, w, n * sizeof(float));
    pm_log1p(g, n);
    for (int64_t k = 0; k < n; k++) {
        const float d = take[k] - cur[k];
        const int far = -fabsf(d) < EXP_MIN;
        const float e = far ? 0.0f : w[k];
        w[k] = (d >= 0.0f ? 1.0f : e) / (1.0f + e);
        next[k] = max2(cur[k], take[k]) + (far ? 0.0f : g[k]);
    }
}

/* The tangents of one up step (dp.up with v): lo = D[i], hi = D[i + 1] ([K1 + 1][B], row 0 is
 * j = -1, always 0), vi [B], w = W[i]. With s = D[i, j-1] + v_i: D[i + 1, j] = lerp(D[i, j], s, W)
 * (torch.lerp's formula) and dw = dW[i] = (s - D[i + 1, j]) W. */
static void tangent_step(int64_t K1, int64_t B, const float *restrict lo, float *restrict hi, const float *restrict vi,
                         const float *restrict w, float *restrict dw) {
    const float *prev = lo, *cur = lo + B;
    float *next = hi + B;
    for (int64_t j = 0; j < K1; j++)
        for (int64_t t = 0; t < B; t++) {
            const int64_t k = j * B + t;
            const float s = prev[k] + vi[t], a = cur[k], wt = w[k];
            const float nd = wt < 0.5f ? a + wt * (s - a) : s - (s - a) * (1.0f - wt);
            next[k] = nd;
            dw[k] = (s - nd) * wt;
        }
}

/* The up sweep (dp.up) of tokens t0..t0+nt of r [T, N]: rt, tau, W, and with v [T, N] also vt, D
 * and dW. Returns L[N] [K1][B] (tilted); *dtop = D[N] [K1][B] with v. */
static const float *up_sweep(const Dims *d, const Tile *w, const float *r, const float *v, int64_t t0, int64_t nt,
                             const float **dtop) {
    const int64_t N = d->N, K1 = d->K1, B = d->B, level = (K1 + 1) * B;
    load_rows(d, r, t0, nt, w->rt);
    tilt(d, w->rt, w->tau);
    for (int64_t k = 0; k < 2 * level; k++) w->L[k] = LOG_ZERO;
    for (int64_t t = 0; t < B; t++) w->L[B + t] = 0.0f; /* the empty set: L[0, 0] = 0 */
    if (v) {
        load_rows(d, v, t0, nt, w->vt);
        memset(w->D, 0, 2 * level * sizeof(float));
    }
    for (int64_t i = 0; i < N; i++) {
        const int64_t a = (i % 2) * level, b = ((i + 1) % 2) * level;
        float *wi = w->W + i * K1 * B;
        up_step(K1, B, w->L + a, w->L + b, w->rt + i * B, wi, w->take, w->g);
        if (v) tangent_step(K1, B, w->D + a, w->D + b, w->vt + i * B, wi, w->dW + i * K1 * B);
    }
    if (v) *dtop = w->D + (N % 2) * level + B;
    return w->L + (N % 2) * level + B;
}

/* out = exp(x) over n floats, exactly 0 below EXP_MIN (NaN stays NaN). */
static void exp_clamped(float *restrict out, const float *restrict x, int64_t n) {
    for (int64_t k = 0; k < n; k++) out[k] = x[k] < EXP_MIN ? EXP_MIN : x[k];
    pm_exp(out, n);
    for (int64_t k = 0; k < n; k++) out[k] = x[k] < EXP_MIN ? 0.0f : out[k];
}

/* Up.band_probs into the adjoint seed: A [K1][B] = P(|S| = j) for j = kmin..K (the softmax of the
 * log counts top + j tau, -inf where top <= LOG_ZERO / 2: 0 for a size no subset reaches, NaN
 * when none is reachable), 0 below kmin. top = L[N] [K1][B]; lc [K1][B], mx [B]: scratch. */
static void band_probs(const Dims *d, const float *top, const float *tau, float *A, float *lc, float *mx) {
    const int64_t K1 = d->K1, B = d->B, kmin = d->kmin;
    memset(A, 0, kmin * B * sizeof(float));
    for (int64_t t = 0; t < B; t++) mx[t] = -INFINITY;
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) {
            const float x = top[j * B + t];
            lc[j * B + t] = x > LOG_ZERO / 2 ? x + (float)j * tau[t] : -INFINITY;
            mx[t] = max2(mx[t], lc[j * B + t]);
        }
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) lc[j * B + t] -= mx[t];
    exp_clamped(A + kmin * B, lc + kmin * B, (K1 - kmin) * B);
    float *sum = mx;
    memset(sum, 0, B * sizeof(float));
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) sum[t] += A[j * B + t];
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) A[j * B + t] /= sum[t];
}

/* The size of the draw (dp.down): with cum the cumulative band probabilities (summed in double,
 * as torch.cumsum) and x = min(u total, total (1 - eps)), c = kmin + #{j: cum_j <= x}.
 * A [K1][B]: the band probabilities from kmin on; u [B]. */
static void draw_size(const Dims *d, const float *A, const float *u, int32_t *c) {
    const int64_t K1 = d->K1, B = d->B, kmin = d->kmin;
    for (int64_t t = 0; t < B; t++) {
        double acc = 0.0;
        for (int64_t j = kmin; j < K1; j++) acc += A[j * B + t];
        const float total = (float)acc, cap = total * (1.0f - FLT_EPSILON), ux = u[t] * total;
        const float x = ux < cap ? ux : cap;
        int32_t passed = 0;
        acc = 0.0;
        for (int64_t j = kmin; j < K1; j++) {
            acc += A[j * B + t];
            passed += (float)acc <= x;
        }
        c[t] = (int32_t)kmin + passed;
    }
}

/* One step of the draw along the path (dp.down): z_i = [u_i < W[i, c]], c -= z_i.
 * w = W[i] [K1][B]; u, c, z: [B]. */
static void draw_step(int64_t B, const float *restrict w, const float *restrict u, int32_t *restrict c,
                      float *restrict z) {
    for (int64_t t = 0; t < B; t++) {
        /* c > 0: W[i, 0] is 0 for valid logits, but NaN together with |r| > 1e30 (validation off)
         * makes it 1 and would drive c negative, reading W rows below the table. */
        const int32_t on = c[t] > 0 && u[t] < w[c[t] * B + t];
        z[t] = (float)on;
        c[t] -= on;
    }
}

/* Σ_j x[j] over a level: x [K1][B] -> out [B]. */
static void sum_level(int64_t K1, int64_t B, const float *restrict x, float *restrict out) {
    memcpy(out, x, B * sizeof(float));
    for (int64_t j = 1; j < K1; j++)
        for (int64_t t = 0; t < B; t++) out[t] += x[j * B + t];
}

/* A = A - f + f shifted down one size (the path through (i, j-1) took expert i into (i + 1, j)). */
static void pass_down(int64_t K1, int64_t B, float *restrict A, const float *restrict f) {
    const int64_t n = K1 * B;
    for (int64_t k = 0; k < n - B; k++) A[k] = (A[k] - f[k]) + f[k + B];
    for (int64_t k = n - B; k < n; k++) A[k] -= f[k];
}

/* One step of the down sweep (dp.down) for expert i: F = A W[i], m_i = Σ_j F[j], then A = A[i].
 * A, f: [K1][B]; w = W[i]; m [B]. */
static void down_step(int64_t K1, int64_t B, float *restrict A, const float *restrict w, float *restrict f,
                      float *restrict m) {
    for (int64_t k = 0; k < K1 * B; k++) f[k] = A[k] * w[k];
    sum_level(K1, B, f, m);
    pass_down(K1, B, A, f);
}

/* One step of dp.cov_vec's down sweep: F = A W, dF = dA W + A dW, out_i = Σ_j dF[j], then A and
 * dA pass down. A, dA, f, df: [K1][B]; w, dw = W[i], dW[i]; out [B]. */
static void cov_step(int64_t K1, int64_t B, float *restrict A, float *restrict dA, const float *restrict w,
                     const float *restrict dw, float *restrict f, float *restrict df, float *restrict out) {
    for (int64_t k = 0; k < K1 * B; k++) {
        f[k] = A[k] * w[k];
        df[k] = dA[k] * w[k] + A[k] * dw[k];
    }
    sum_level(K1, B, df, out);
    pass_down(K1, B, A, f);
    pass_down(K1, B, dA, df);
}

/* Cardinality.forward_marginals for tokens t0..t0+nt: r [T, N]; m [T, N] (NULL: not wanted);
 * U [(N + 1) T]: the size uniforms [T], then the experts' [N][T]; z [T, N] (both NULL: no draw).
 * Returns 0, or -1 when scratch cannot be allocated. */
static int64_t forward_tile(const Dims *d, const float *r, const float *U, float *m, float *z, int64_t t0,
                            int64_t nt) {
    const int64_t T = d->T, N = d->N, K1 = d->K1, B = d->B;
    Tile w;
    float *buf = pm_scratch(carve(&w, d, 0, z != NULL, NULL));
    if (!buf) return -1;
    carve(&w, d, 0, z != NULL, buf);
    const float *top = up_sweep(d, &w, r, NULL, t0, nt, NULL);
    band_probs(d, top, w.tau, w.A, w.take, w.g);
    if (z) {
        load_uniforms(U + t0, nt, B, w.u);
        draw_size(d, w.A, w.u, w.c);
    }
    for (int64_t i = N - 1; i >= 0; i--) {
        const float *wi = w.W + i * K1 * B;
        if (m) down_step(K1, B, w.A, wi, w.f, w.out + i * B);
        if (z) {
            load_uniforms(U + (i + 1) * T + t0, nt, B, w.u);
            draw_step(B, wi, w.u, w.c, w.z + i * B);
        }
    }
    if (m) store_rows(d, w.out, t0, nt, m);
    if (z) store_rows(d, w.z, t0, nt, z);
    return 0;
}

/* Cardinality.cov_vec for tokens t0..t0+nt: Cov(z) v from r alone (dp.cov_vec); r, v, out [T, N].
 * The adjoints start at A = q (the band probabilities) and dA = q (D[N] - Σ_j q_j D[N, j]).
 * Returns 0, or -1. */
static int64_t cov_tile(const Dims *d, const float *r, const float *v, float *out, int64_t t0, int64_t nt) {
    const int64_t N = d->N, K1 = d->K1, B = d->B, kmin = d->kmin;
    Tile w;
    float *buf = pm_scratch(carve(&w, d, 1, 0, NULL));
    if (!buf) return -1;
    carve(&w, d, 1, 0, buf);
    const float *dtop = NULL, *top = up_sweep(d, &w, r, v, t0, nt, &dtop);
    band_probs(d, top, w.tau, w.A, w.take, w.g);
    float *mean = w.take; /* [B]: Σ_j q_j D[N, j] */
    memset(mean, 0, B * sizeof(float));
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) mean[t] += w.A[j * B + t] * dtop[j * B + t];
    memset(w.dA, 0, K1 * B * sizeof(float));
    for (int64_t j = kmin; j < K1; j++)
        for (int64_t t = 0; t < B; t++) w.dA[j * B + t] = w.A[j * B + t] * (dtop[j * B + t] - mean[t]);
    for (int64_t i = N - 1; i >= 0; i--)
        cov_step(K1, B, w.A, w.dA, w.W + i * K1 * B, w.dW + i * K1 * B, w.f, w.df, w.out + i * B);
    store_rows(d, w.out, t0, nt, out);
    return 0;
}

/* The entry points: tiles of B tokens split statically over `threads` OpenMP threads (the runtime
 * torch itself uses). Each returns 0, or -1 when some thread's scratch cannot be allocated.
 * OVER_TILES runs CALL, an expression of the tile's tokens t0..t0+nt, on every tile. */
#define OVER_TILES(d, CALL)                                                                                    \
    int64_t failed = 0;                                                                                        \
    const int64_t tiles = ((d).T + (d).B - 1) / (d).B;                                                         \
    _Pragma("omp parallel for num_threads(threads) schedule(static) reduction(| : failed) if (tiles > 1)")   \
    for (int64_t k = 0; k < tiles; k++) {                                                                      \
        const int64_t t0 = k * (d).B, nt = (d).T - t0 < (d).B ? (d).T - t0 : (d).B;                            \
        failed |= (CALL);                                                                                      \
    }                                                                                                          \
    return failed ? -1 : 0

/* Cardinality.forward_marginals: r [T, N] -> m [T, N] (NULL: not wanted) and one draw z [T, N]
 * from the uniforms U [(N + 1) T] (both NULL: no draw), for kmin <= |S| <= kmax. */
int64_t dp_forward(const float *r, const float *U, float *m, float *z, int64_t T, int64_t N, int64_t kmin,
                   int64_t kmax, int64_t threads) {
    const Dims d = {T, N, kmin, kmax + 1, lanes(N, kmax + 1, 1)};
    OVER_TILES(d, forward_tile(&d, r, U, m, z, t0, nt));
}

/* Cardinality.cov_vec: Cov(z) v, r, v, out [T, N], for kmin <= |S| <= kmax. */
int64_t dp_cov_vec(const float *r, const float *v, float *out, int64_t T, int64_t N, int64_t kmin, int64_t kmax,
                   int64_t threads) {
    const Dims d = {T, N, kmin, kmax + 1, lanes(N, kmax + 1, 2)};
    OVER_TILES(d, cov_tile(&d, r, v, out, t0, nt));
}
