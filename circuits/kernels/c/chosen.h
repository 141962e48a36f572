/* chosen.c's functions: the per-token pieces of the straight-through selection (circuits::chosen_scores),
 * declared once for the units that link it (cardinality.c, passes.c) and for chosen.c
 * itself, so the compiler checks the definitions against these. */
#ifndef PM_CHOSEN_H
#define PM_CHOSEN_H
#include <stdint.h>

void pm_chosen_bits(const float *z, int64_t n, int64_t B, uint64_t *bits);
void pm_put_chosen(const uint64_t *bits, int64_t B, int64_t t, int64_t n, const float *p, int64_t slots,
                   int64_t cap, int64_t *idx, float *wv, uint8_t *mask, int32_t *at);
void pm_tile_scores(float *p, int64_t n, int64_t B, int64_t sigmoid, int32_t *top, float *q, float *sum);
void pm_slot_tangents(const int32_t *idx, const float *g, const uint8_t *mask, int64_t slots, int64_t n, int64_t B,
                      int64_t t0, int64_t nt, const float *p, float *vt);
void pm_scores_backward(float *cov, const float *vt, const float *p, const int32_t *top, const float *q,
                        int64_t sigmoid, int64_t n, int64_t B, float *others);

#endif
