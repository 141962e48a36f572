/* Vector math over arrays, the one unit built with -ffast-math so gcc calls glibc's libmvec
 * (SIMD expf/logf/log1pf, correct for every input, inf and 0 included). Only these loops are
 * built this way: the logic in passes.c keeps IEEE semantics, and the library is linked without
 * -ffast-math so the process's denormal mode is left alone. */
#include <math.h>
#include <stdint.h>

void pm_exp(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = expf(x[i]);
}

void pm_log(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = logf(x[i]);
}

void pm_log1p(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = log1pf(x[i]);
}
