/* The k-th largest value of each row, the shift of exactly-k circuits (Circuit._shift; its torch
 * reference is topk(k).values.amin(), TorchPasses.kth_largest). LANES rows at a time, one per
 * SIMD lane: each value sinks through a sorted column of the j best so far by max/min swaps, with
 * no branches. j = min(k, n - k + 1): past the middle the k-th largest is minus the (n - k + 1)-th
 * largest of the negated row. The column lives on the heap (j * LANES floats per thread): a
 * k in the tens of thousands would overflow an OpenMP worker's stack. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define LANES 32

/* out[t] = the k-th largest of r[t, :] (r [T, n], 1 <= k <= n). NaN counts as -inf.
 * Returns 0, or 1 when the scratch could not be allocated. */
int64_t pm_kth_largest(const float *r, int64_t T, int64_t n, int64_t k, float *out, int64_t threads) {
    const int64_t blocks = (T + LANES - 1) / LANES;
    const int flip = n - k + 1 < k;   /* work on -r, for its (n - k + 1)-th largest */
    const int64_t j = flip ? n - k + 1 : k;
    const float sign = flip ? -1.0f : 1.0f;
    int64_t failed = 0;
#pragma omp parallel num_threads(threads) if (blocks > 8) reduction(| : failed)
    {
        float *best = malloc(sizeof(float) * (size_t)(j * LANES)); /* best[c * LANES + l]: c-th largest, lane l */
        float x[LANES];
        if (best == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            if (best == NULL) continue;
            const int64_t t0 = b * LANES, m = T - t0 < LANES ? T - t0 : LANES;
            for (int64_t c = 0; c < j * LANES; c++) best[c] = -INFINITY;
            for (int64_t i = 0; i < n; i++) {
                for (int64_t l = 0; l < LANES; l++) {
                    float v = l < m ? r[(t0 + l) * n + i] : -INFINITY;
                    v = v == v ? v : -INFINITY;
                    x[l] = sign * v;
                }
                for (int64_t c = 0; c < j; c++) {
                    float *restrict col = best + c * LANES;
                    for (int64_t l = 0; l < LANES; l++) {
                        const float hi = max2(col[l], x[l]);
                        x[l] = min2(col[l], x[l]);
                        col[l] = hi;
                    }
                }
            }
            for (int64_t l = 0; l < m; l++) out[t0 + l] = sign * best[(j - 1) * LANES + l];
        }
        free(best);
            }
    return failed;
}

/* The k largest values of each row in descending order, ties to the lower index (values [T, k],
 * indices [T, k] int64; its torch reference is a stable descending sort, circuits.kernels.rows.topk_reference).
 * NaN counts as -inf and -0 as 0. Each entry becomes one int64 key that orders as (value, -index):
 * the float's bits made monotone in the high half, n - 1 - index in the low half. Then, as above,
 * LANES rows at a time, each key sinks through a sorted column of the k best so far by max/min
 * swaps; INT64_MIN, below every key, marks an empty place. Returns 0, or 1 when the scratch could
 * not be allocated. */
static inline int64_t key_of(float v, int64_t i, int64_t n) {
    v = v == v ? v + 0.0f : -INFINITY; /* NaN -> -inf, -0 -> +0 */
    int32_t bits;
    memcpy(&bits, &v, sizeof bits);
    bits = bits >= 0 ? bits : bits ^ INT32_MAX; /* monotone in v */
    return (int64_t)((uint64_t)(int64_t)bits << 32 | (uint64_t)(n - 1 - i));
}

static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int64_t pm_topk(const float *r, int64_t T, int64_t n, int64_t k, float *values, int64_t *indices,
                int64_t threads) {
    const int64_t blocks = (T + LANES - 1) / LANES;
    int64_t failed = 0;
#pragma omp parallel num_threads(threads) if (blocks > 8) reduction(| : failed)
    {
        int64_t *best = malloc(sizeof(int64_t) * (size_t)(k * LANES)); /* best[c * LANES + l] */
        int64_t *keys = malloc(sizeof(int64_t) * (size_t)(n * LANES)); /* keys[i * LANES + l] */
        int64_t *row = malloc(sizeof(int64_t) * (size_t)n);
        int64_t x[LANES];
        if (best == NULL || keys == NULL || row == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            if (best == NULL || keys == NULL || row == NULL) continue;
            const int64_t t0 = b * LANES, m = T - t0 < LANES ? T - t0 : LANES;
            for (int64_t c = 0; c < k * LANES; c++) best[c] = INT64_MIN;
            for (int64_t l = 0; l < LANES; l++) { /* keys, a row at a time, stored lane-major */
                const float *src = r + (t0 + (l < m ? l : 0)) * n;
                for (int64_t i = 0; i < n; i++) row[i] = key_of(src[i], i, n);
                for (int64_t i = 0; i < n; i++) keys[i * LANES + l] = l < m ? row[i] : INT64_MIN;
            }
            for (int64_t i = 0; i < n; i++) {
                for (int64_t l = 0; l < LANES; l++) x[l] = keys[i * LANES + l];
                for (int64_t c = 0; c < k; c++) {
                    int64_t *restrict col = best + c * LANES;
                    for (int64_t l = 0; l < LANES; l++) {
                        const int64_t hi = max64(col[l], x[l]);
                        x[l] = min64(col[l], x[l]);
                        col[l] = hi;
                    }
                }
            }
            for (int64_t l = 0; l < m; l++)
                for (int64_t c = 0; c < k; c++) {
                    const int64_t i = n - 1 - (int64_t)(uint32_t)best[c * LANES + l];
                    const float v = r[(t0 + l) * n + i];
                    indices[(t0 + l) * k + c] = i;
                    values[(t0 + l) * k + c] = v == v ? v : -INFINITY;
                }
        }
        free(best);
        free(keys);
        free(row);
    }
    return failed;
}

/* topk of the keys (z - 1) + x z for z in {0, 1} and x >= 0 (pm_topk's order: descending, ties
 * to the lower index), without sorting every entry: the chosen entries (z > 0, key x) come first,
 * by x descending, then the others (key -1) by index. Each row's chosen indices are gathered
 * from bit masks of 64 entries (one branch per chosen entry, not per entry), then each is put at
 * its rank (the chosen with a larger value, or an equal one and a lower index), counted without
 * branches: O(n + c^2) for c chosen, where pm_topk takes O(n k). An entry whose key is NaN (x
 * NaN, or z = 0 with x infinite, as in the key's formula) counts as -inf in pm_topk's order: such
 * entries come last, by index, with the value -inf (so every slot is written, whatever x holds).
 * values [T, k], indices [T, k] int64. Returns 0, or 1 when the scratch could not be allocated. */
static inline int nan_key(float z, float x) {
    const float key = (z - 1.0f) + x * z;
    return key != key;
}

int64_t pm_topk_chosen(const float *z, const float *x, int64_t T, int64_t n, int64_t k, float *values,
                       int64_t *indices, int64_t threads) {
    int64_t failed = 0;
#pragma omp parallel num_threads(threads) if (T > 256) reduction(| : failed)
    {
        int64_t *at = malloc(sizeof(int64_t) * (size_t)n); /* a row's chosen indices */
        float *xs = malloc(sizeof(float) * (size_t)n);   /* and their values */
        if (at == NULL || xs == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            if (at == NULL || xs == NULL) continue;
            const float *zt = z + t * n, *xt = x + t * n;
            float *v = values + t * k;
            int64_t *ix = indices + t * k, c = 0;
            for (int64_t i0 = 0; i0 < n; i0 += 64) { /* 64 entries as one bit mask, then its set bits */
                const int64_t w = n - i0 < 64 ? n - i0 : 64;
                uint64_t bits = 0;
                for (int64_t i = 0; i < w; i++)
                    bits |= (uint64_t)(zt[i0 + i] > 0.0f && !nan_key(zt[i0 + i], xt[i0 + i])) << i;
                for (; bits; bits &= bits - 1) at[c++] = i0 + __builtin_ctzll(bits);
            }
            for (int64_t q = 0; q < c; q++) xs[q] = xt[at[q]];
            for (int64_t q = 0; q < c; q++) { /* its place: the chosen above it, and the equal ones before it */
                const float xq = xs[q];
                int64_t rank = 0;
                for (int64_t q2 = 0; q2 < c; q2++) rank += (xs[q2] > xq) | ((xs[q2] == xq) & (q2 < q));
                if (rank < k) {
                    v[rank] = xq;
                    ix[rank] = at[q];
                }
            }
            int64_t kept = c < k ? c : k;
            for (int64_t i = 0; kept < k && i < n; i++) /* then the first unchosen entries, key -1 */
                if (!(zt[i] > 0.0f) && !nan_key(zt[i], xt[i])) {
                    v[kept] = (zt[i] - 1.0f) + xt[i] * zt[i];
                    ix[kept++] = i;
                }
            for (int64_t i = 0; kept < k && i < n; i++) /* then the NaN keys, as -inf */
                if (nan_key(zt[i], xt[i])) {
                    v[kept] = -INFINITY;
                    ix[kept++] = i;
                }
        }
        free(at);
        free(xs);
    }
    return failed;
}
