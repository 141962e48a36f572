/* The per-token pieces of the straight-through selection (circuits::chosen_scores; its plain-torch
 * reference is circuits/kernels/straight_through.py), shared by the cardinality DP (cardinality.c) and the
 * circuit passes (passes.c), each of which links this unit. A tile is [n][B]
 * floats, B lanes (tokens) per variable, as in both of them.
 *
 *   pm_chosen_bits      a tile's draw as bit masks, per lane
 *   pm_put_chosen       a token's drawn variables by score, into its slots (the forward)
 *   pm_tile_scores      a tile's scores: softmax or sigmoid of its logits
 *   pm_slot_tangents    g_t = (the slots' gradient scattered to their variables) * p, for Cov(z) g_t
 *   pm_scores_backward  Cov(z) g_t + the scores' backward, in place of the tile
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h" /* EXP_MIN: exp's arguments are clamped, as in cardinality.c; scores below exp(EXP_MIN) are 0 */

/* bits [W][B] (W = ceil(n / 64) words per lane): bit i % 64 of word i / 64 set where z [n][B] > 0,
 * made a variable at a time over all lanes (vectorised), so that a token's drawn variables are then
 * read from its set bits, not from a column of z. */
void pm_chosen_bits(const float *z, int64_t n, int64_t B, uint64_t *bits) {
    memset(bits, 0, (size_t)((n + 63) / 64 * B) * sizeof(uint64_t));
    for (int64_t i = 0; i < n; i++) {
        uint64_t *w = bits + (i / 64) * B;
        const uint64_t one = (uint64_t)1 << (i % 64);
        for (int64_t t = 0; t < B; t++) w[t] |= z[i * B + t] > 0.0f ? one : 0;
    }
}

/* Token t's drawn variables (lane t of pm_chosen_bits' bits [W][B]), by p [n] descending, ties to
 * the lower index (pm_topk_chosen's order), into its `slots` slots: idx [slots] int64, wv [slots] =
 * p there, mask [slots] 1. Slots past the draw hold the lowest undrawn variables, ascending (so a
 * token's slots never repeat a variable), weight 0, mask 0. At most `cap` drawn variables are taken (the draw's largest size); at: scratch
 * of 2 cap int32 (their indices, then their scores). */
void pm_put_chosen(const uint64_t *bits, int64_t B, int64_t t, int64_t n, const float *p, int64_t slots,
                   int64_t cap, int64_t *idx, float *wv, uint8_t *mask, int32_t *at) {
    float *xs = (float *)(at + cap);
    int64_t c = 0;
    for (int64_t w = 0; w < (n + 63) / 64; w++)
        for (uint64_t b = bits[w * B + t]; b && c < cap; b &= b - 1) at[c++] = (int32_t)(w * 64 + __builtin_ctzll(b));
    for (int64_t q = 0; q < c; q++) xs[q] = p[at[q]];
    for (int64_t s = 0; s < slots; s++) {
        idx[s] = 0;
        wv[s] = 0.0f;
        mask[s] = 0;
    }
    for (int64_t q = 0; q < c; q++) { /* its place: the drawn above it, and the equal ones before it */
        const float x = xs[q];
        int64_t rank = 0;
        for (int64_t q2 = 0; q2 < c; q2++) rank += (xs[q2] > x) | ((xs[q2] == x) & (q2 < q));
        if (rank < slots) {
            idx[rank] = at[q];
            wv[rank] = x;
            mask[rank] = 1;
        }
    }
    int64_t v = 0; /* the unused slots: the lowest variables not drawn, ascending (distinct, weight 0) */
    for (int64_t s = c < slots ? c : slots; s < slots; s++) {
        while (v < n && (bits[(v / 64) * B + t] >> (v % 64)) & 1) v++;
        idx[s] = v < n ? v : 0;
        v++;
    }
}

/* The scores of a tile's logits, in place: p [n][B] = sigmoid(r) (`sigmoid`), or the softmax over
 * the n variables per lane (exactly 0 where r - max < EXP_MIN), with top [B] the first variable at
 * the lane's largest logit and q [B] = 1 - p there as Σ_{i != top} e_i / Σ_i e_i (e = exp(r -
 * max)): 1 - p by subtraction loses the digits the softmax backward needs when p is near 1.
 * sum [B]: scratch. */
void pm_tile_scores(float *p, int64_t n, int64_t B, int64_t sigmoid, int32_t *top, float *q, float *sum) {
    const int64_t m = n * B;
    if (sigmoid) {
        for (int64_t k = 0; k < m; k++) {
            const float x = -p[k];
            p[k] = x < EXP_MIN ? EXP_MIN : x > 88.0f ? 88.0f : x;
        }
        pm_exp(p, m);
        for (int64_t k = 0; k < m; k++) p[k] = 1.0f / (1.0f + p[k]);
        return;
    }
    float *mx = q; /* [B]: the largest logit, until q is made */
    for (int64_t t = 0; t < B; t++) {
        mx[t] = -INFINITY;
        top[t] = 0;
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < B; t++) {
            const int bigger = p[i * B + t] > mx[t];
            mx[t] = bigger ? p[i * B + t] : mx[t];
            top[t] = bigger ? (int32_t)i : top[t];
        }
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < B; t++) {
            const float x = p[i * B + t] - mx[t]; /* -inf stays -inf */
            p[i * B + t] = x < EXP_MIN ? EXP_MIN : x;
        }
    pm_exp(p, m);
    /* what the clamped arguments give, taken as 0: pm_exp's vectorised exp (libmvec's in the portable
     * build) may land an ulp above the scalar expf(EXP_MIN), so the cut-off sits 2^-10 above it (an
     * unclamped argument there is within 1e-3 of EXP_MIN: its score is below 3e-35 either way) */
    const float least = expf(EXP_MIN) * (1.0f + 0x1p-10f);
    for (int64_t k = 0; k < m; k++) p[k] = p[k] <= least ? 0.0f : p[k];
    float *rest = q; /* Σ_{i != top} e_i */
    memset(rest, 0, B * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < B; t++) rest[t] += i == top[t] ? 0.0f : p[i * B + t];
    for (int64_t t = 0; t < B; t++) sum[t] = rest[t] + p[top[t] * B + t];
    for (int64_t t = 0; t < B; t++) q[t] = rest[t] / sum[t];
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < B; t++) p[i * B + t] /= sum[t];
}

/* vt [n][B] = g_t for tokens t0..t0+nt (0 in the other lanes): the used slots' g [T, slots] summed at
 * their variables idx [T, slots] int32 (mask [T, slots]: the used slots; indices outside 0..n-1
 * are skipped), times the scores p [n][B]. */
void pm_slot_tangents(const int32_t *idx, const float *g, const uint8_t *mask, int64_t slots, int64_t n, int64_t B,
                      int64_t t0, int64_t nt, const float *p, float *vt) {
    memset(vt, 0, n * B * sizeof(float));
    for (int64_t t = 0; t < nt; t++)
        for (int64_t s = 0; s < slots; s++) {
            const int64_t at = (t0 + t) * slots + s, i = idx[at];
            if (mask[at] && i >= 0 && i < n) vt[i * B + t] += g[at];
        }
    for (int64_t k = 0; k < n * B; k++) vt[k] *= p[k];
}

/* The gradient of a tile, in place of cov [n][B] (Cov(z) g_t): cov + the scores' backward of g_t / p:
 * softmax g_t - p Σ g_t, sigmoid g_t (1 - p); the caller stores its rows. At the largest logit
 * j = top (softmax), where p_j may be near 1, g_t_j q - p_j Σ_{i != j} g_t_i with q = 1 - p_j from
 * pm_tile_scores: the same value, without the cancellation of g_t_j - p_j (g_t_j + ...).
 * vt [n][B]: g_t; p, top, q: pm_tile_scores'; others [B]: scratch. */
void pm_scores_backward(float *cov, const float *vt, const float *p, const int32_t *top, const float *q,
                        int64_t sigmoid, int64_t n, int64_t B, float *others) {
    if (sigmoid) {
        for (int64_t k = 0; k < n * B; k++) cov[k] += vt[k] * (1.0f - p[k]);
        return;
    }
    memset(others, 0, B * sizeof(float)); /* Σ_{i != top} g_t */
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < B; t++) others[t] += i == top[t] ? 0.0f : vt[i * B + t];
    float *total = others + B; /* [B]: Σ_i g_t */
    for (int64_t t = 0; t < B; t++) total[t] = others[t] + vt[top[t] * B + t];
    float *at_top = total + B; /* [B]: the value at top, made before the rows below overwrite it */
    for (int64_t t = 0; t < B; t++) {
        const int64_t k = top[t] * B + t;
        at_top[t] = cov[k] + (vt[k] * q[t] - p[k] * others[t]);
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < B; t++) cov[i * B + t] += vt[i * B + t] - p[i * B + t] * total[t];
    for (int64_t t = 0; t < B; t++) cov[top[t] * B + t] = at_top[t];
}
