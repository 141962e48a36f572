/* The one header of the kernels' C library: every unit of this folder includes it, and
 * circuits/kernels/library.py builds them all into one library per instruction set. It declares
 * every function a unit exports, once (the units compile clean under -Wall -Wextra
 * -Wmissing-prototypes), the helpers more than one unit uses, and Prog, the circuit passes' view
 * of a program. The functions Python calls and Prog's fields are declared for ctypes in one place,
 * library.py, which tests/circuits/kernels/test_c_library.py checks against this file.
 *
 *   vmath.c        SIMD exp / log / log1p over arrays (the one unit built with -ffast-math)
 *   scratch.c      per-thread scratch buffers
 *   uniforms.c     counter-based uniforms (circuits/kernels/uniforms.py is their reference)
 *   select.c       row top-k, top-k of chosen entries, k-th largest (circuits/kernels/rows.py)
 *   chosen.c       the straight-through selection's per-token pieces (circuits/kernels/straight_through.py)
 *   passes.c       the circuit passes (circuits/kernels/torch_passes.py is their reference)
 *   cardinality.c  the cardinality DP's sweeps (circuits/kernels/torch_dp.py is their reference)
 *
 * Entry points return a count of tiles (>= 0) or -1 when scratch cannot be allocated; `threads`
 * is the OpenMP thread count (torch's). */
#ifndef PM_KERNELS_H
#define PM_KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* max/min as comparisons, which vectorise (fmaxf's NaN rules make gcc call libm). No NaN reaches them. */
static inline float max2(float a, float b) { return a > b ? a : b; }
static inline float min2(float a, float b) { return a < b ? a : b; }

/* exp's arguments are clamped to EXP_MIN and the results below it taken as 0: libmvec's expf takes
 * a slow scalar path for a whole vector when one result underflows, as does its log1pf near FLT_MIN;
 * exp(EXP_MIN) ~ 2e-35 is safe for both. */
#define EXP_MIN (-80.0f)

/* A circuit's program as the passes read it (c_passes.py makes it). */
typedef struct {
    int64_t n, num_slots, num_rows, num_nodes, smooth;
    const int64_t *nodes;   /* [D, 3]: slot, first element row, fan-in of each decision node, bottom-up */
    const int64_t *prime;   /* [R] */
    const int64_t *sub;     /* [R] */
    const int64_t *imp_off; /* [R + 1]: element row e's implicit variables are imp_var[imp_off[e]:imp_off[e + 1]] */
    const int64_t *imp_var; /* [P] */
    /* The linear upward (see upward in passes.c): the element constants c_e [R] (NULL: the log
     * upward only), in double for the double pass of log Z alone (pm_log_z), rounded to float as
     * the float pass reads each; lin_float: whether the float pass may take them (none below
     * 2^-100, c_passes.FLOAT_COEF_MIN); what sigma(r) and sigma(-r) are multiplied by to give the
     * stored x_i and not x_i, and TRUE's stored value; log Z = log(root's stored value) + lin_root;
     * the nominal logit; the cardinality k of every model (-1: not one k, or not smooth: no
     * centring, see up_tile). */
    const double *lin_coef;
    int64_t lin_float;
    double lin_pos, lin_neg, lin_true, lin_root;
    float lin_r0, lin_k;
    /* The tilt of the pass on logarithms (torch_passes.tilt): per element row, tilt_up and tilt_down
     * [R] (the sizes its node and children store); the fewest and most true variables of a model;
     * tilt_moves: some row has a nonzero one or the circuit is not smooth (else only the leaves move). */
    const float *tilt_up, *tilt_down;
    int64_t tilt_kmin, tilt_kmax, tilt_moves;
} Prog;

/* vmath.c: x = exp(x), log(x), log1p(x) in place over n floats; the shifted and added forms the
 * passes use; exp and log over doubles */
void pm_exp(float *x, int64_t n);
void pm_log(float *x, int64_t n);
void pm_log1p(float *x, int64_t n);
void pm_exp_shift(float *x, const float *top, int64_t rows, int64_t w);
void pm_log_add(float *v, const float *s, const float *top, int64_t n);
void pm_exp_double(double *x, int64_t n);
void pm_log_double(double *x, int64_t n);

/* scratch.c: this thread's buffer of at least `floats` floats, or NULL */
float *pm_scratch(size_t floats);

/* uniforms.c: out[i] = u(seed, offset + i), i < count (in parallel; and on the calling thread) */
int64_t pm_uniforms(int64_t seed, int64_t offset, int64_t count, float *out, int64_t threads);
void pm_uniforms_serial(int64_t seed, int64_t offset, int64_t count, float *out);

/* select.c: per-row selection of r [T, n] */
int64_t pm_kth_largest(const float *r, int64_t T, int64_t n, int64_t k, float *out, int64_t threads);
int64_t pm_topk(const float *r, int64_t T, int64_t n, int64_t k, float *values, int64_t *indices, int64_t threads);
int64_t pm_topk_chosen(const float *z, const float *x, int64_t T, int64_t n, int64_t k, float *values,
                       int64_t *indices, int64_t threads);

/* chosen.c: the straight-through selection's pieces over a tile [n][B] (B lanes, tokens) */
void pm_chosen_bits(const float *z, int64_t n, int64_t B, uint64_t *bits);
void pm_put_chosen(const uint64_t *bits, int64_t B, int64_t t, int64_t n, const float *p, int64_t slots,
                   int64_t cap, int64_t *idx, float *wv, uint8_t *mask, int32_t *at);
void pm_tile_scores(float *p, int64_t n, int64_t B, int64_t sigmoid, int32_t *top, float *q, float *sum);
void pm_slot_tangents(const int32_t *idx, const float *g, const uint8_t *mask, int64_t slots, int64_t n, int64_t B,
                      int64_t t0, int64_t nt, const float *p, float *vt);
void pm_scores_backward(float *cov, const float *vt, const float *p, const int32_t *top, const float *q,
                        int64_t sigmoid, int64_t n, int64_t B, float *others);

/* passes.c: the circuit passes over logits r [T, n] less shift [T] (NULL: none) */
int64_t pm_sample(const Prog *P, const float *r, const float *shift, const float *U, const int64_t *uid,
                  const float *fill, float *z, float *logz, int64_t T, int64_t threads);
int64_t pm_jvp(const Prog *P, const float *r, const float *shift, const float *v, float *out, int64_t T,
               int64_t threads);
int64_t pm_chosen(const Prog *P, const float *r, int64_t k, float *shift, const float *U, const int64_t *uid,
                  const float *fill, const float *p, int64_t slots, int64_t *idx, float *w, uint8_t *mask, int64_t T,
                  int64_t threads);
int64_t pm_chosen_backward(const Prog *P, const float *r, int64_t k, float *shift, const int32_t *idx, const float *g,
                           const uint8_t *mask, int64_t slots, int64_t sigmoid, float *out, int64_t T,
                           int64_t threads);
int64_t pm_marginals(const Prog *P, const float *r, const float *shift, float *m, float *logz, uint8_t *lin, int64_t T,
                     int64_t threads);
int64_t pm_log_z(const Prog *P, const float *r, const float *shift, float *logz, uint8_t *bad, int64_t T,
                 int64_t threads);
int64_t pm_tile_tokens(void);
int64_t pm_map(const Prog *P, const float *r, const float *shift, float *z, float *best, int64_t T, int64_t threads);

/* cardinality.c: the DP's sweeps over logits r [T, N] for kmin <= |S| <= kmax */
int64_t dp_forward(const float *r, const float *U, float *m, float *z, int64_t T, int64_t N, int64_t kmin,
                   int64_t kmax, int64_t linear, int64_t threads);
int64_t dp_cov_vec(const float *r, const float *v, float *out, int64_t T, int64_t N, int64_t kmin, int64_t kmax,
                   int64_t linear, int64_t threads);
int64_t dp_forward_lanes(int64_t N, int64_t kmax);
int64_t dp_chosen(const float *r, int64_t seed, const float *p, int64_t *idx, float *wv, uint8_t *mask, int64_t T,
                  int64_t N, int64_t kmin, int64_t kmax, int64_t slots, int64_t linear, int64_t threads);
int64_t dp_chosen_backward(const float *r, const int32_t *idx, const float *g, const uint8_t *mask, float *out,
                           int64_t T, int64_t N, int64_t kmin, int64_t kmax, int64_t slots, int64_t sigmoid,
                           int64_t linear, int64_t threads);

#endif
