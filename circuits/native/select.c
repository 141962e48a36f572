/* The k-th largest value of each row, the shift of exactly-k circuits (Circuit._shift; its
 * torch reference is topk(k).values.amin()). LANES rows at a time, one per SIMD lane: each value
 * sinks through a sorted column of k bests by max/min swaps, with no branches. */
#include <math.h>
#include <stdint.h>

#define LANES 32

static inline float max2(float a, float b) { return a > b ? a : b; }
static inline float min2(float a, float b) { return a < b ? a : b; }

/* out[t] = the k-th largest of r[t, :] (r [T, n], 1 <= k <= n). NaN counts as -inf. */
void pm_kth_largest(const float *r, int64_t T, int64_t n, int64_t k, float *out, int64_t threads) {
    const int64_t blocks = (T + LANES - 1) / LANES;
#pragma omp parallel for num_threads(threads) schedule(static) if (blocks > 8)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t t0 = b * LANES, m = T - t0 < LANES ? T - t0 : LANES;
        float best[k][LANES], x[LANES]; /* best[j]: the j-th largest so far, per lane */
        for (int64_t j = 0; j < k; j++)
            for (int64_t l = 0; l < LANES; l++) best[j][l] = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            for (int64_t l = 0; l < LANES; l++) {
                const float v = l < m ? r[(t0 + l) * n + i] : -INFINITY;
                x[l] = v == v ? v : -INFINITY;
            }
            for (int64_t j = 0; j < k; j++)
                for (int64_t l = 0; l < LANES; l++) {
                    const float hi = max2(best[j][l], x[l]);
                    x[l] = min2(best[j][l], x[l]);
                    best[j][l] = hi;
                }
        }
        for (int64_t l = 0; l < m; l++) out[t0 + l] = best[k - 1][l];
    }
}
