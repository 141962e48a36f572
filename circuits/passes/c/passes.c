/* Fused fp32 CPU passes over a level layout, one tile of TILE tokens at a time.
 *
 * The same mathematics as circuits/passes/torch_passes.py, the plain-torch reference these
 * passes are tested against; read that file first. The torch passes stream every group through [slots, T] buffers
 * in memory; here one tile's whole circuit (values, element weights, flows: a few hundred kB)
 * stays in cache while all groups are evaluated, and each element is touched once per pass.
 *
 * Buffers are [rows][TILE] floats. A partial last tile is padded with logit 0 (and uniform 0.5),
 * so every lane holds ordinary numbers; only the first nt lanes are written out. The entry
 * points at the end (pm_marginals, pm_sample, pm_map, pm_jvp) split the tiles between OpenMP
 * threads; each thread has its own scratch.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void pm_exp(float *x, int64_t n);
void pm_log(float *x, int64_t n);
void pm_log1p(float *x, int64_t n);

#define TILE 128 /* tokens per tile: 64 and 128 measured fastest, 32 and 256 slower */

/* max/min as comparisons, which vectorise (fmaxf's NaN rules make gcc call libm). No NaN reaches them. */
static inline float max2(float a, float b) { return a > b ? a : b; }
static inline float min2(float a, float b) { return a < b ? a : b; }

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

/* d = da + db, acc += w d: an element's tangent and its weighted sum. */
static inline void tangent_row(float *restrict d, float *restrict acc, const float *restrict w,
                               const float *restrict da, const float *restrict db) {
    for (int64_t t = 0; t < TILE; t++) {
        d[t] = da[t] + db[t];
        acc[t] += w[t] * d[t];
    }
}

/* p += a, q += a: a flow passed to an element's prime and sub. */
static inline void pass_rows(float *restrict p, float *restrict q, const float *restrict a) {
    for (int64_t t = 0; t < TILE; t++) {
        p[t] += a[t];
        q[t] += a[t];
    }
}

/* One element of the inverse-CDF choice: c += w; the flow [c > x] - [previous c > x] goes to p, q. */
static inline void pick_row(float *restrict p, float *restrict q, float *restrict c, float *restrict prev,
                            const float *restrict w, const float *restrict x) {
    for (int64_t t = 0; t < TILE; t++) {
        c[t] += w[t];
        const float passed = c[t] > x[t] ? 1.0f : 0.0f, flow = passed - prev[t];
        prev[t] = passed;
        p[t] += flow;
        q[t] += flow;
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
        const float hit = found[t] == 0.0f && x[t] == v[t] ? 1.0f : 0.0f, f = hit * a[t];
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

/* One element of the paired downward pass: flow = w coef, d flow = w (dcoef + coef (de - d node)),
 * both to the prime (gp, dgp) and the sub (gq, dgq). */
static inline void flow_rows(float *restrict gp, float *restrict gq, float *restrict dgp, float *restrict dgq,
                             const float *restrict w, const float *restrict d, const float *restrict dnode,
                             const float *restrict coef, const float *restrict dcoef) {
    for (int64_t t = 0; t < TILE; t++) {
        const float f = w[t] * coef[t], df = w[t] * ((d[t] - dnode[t]) * coef[t] + dcoef[t]);
        gp[t] += f;
        gq[t] += f;
        dgp[t] += df;
        dgq[t] += df;
    }
}

typedef struct {
    int64_t n, num_slots, num_rows, num_nodes, smooth;
    const int64_t *nodes;  /* [D, 3]: slot, first element row, fan-in of each decision node, bottom-up */
    const int64_t *prime;  /* [R] */
    const int64_t *sub;    /* [R] */
    const int64_t *imp_off; /* [R + 1]: element row e's implicit variables are imp_var[imp_off[e]:imp_off[e + 1]] */
    const int64_t *imp_var; /* [P] */
} Prog;

static __thread float *scratch_buf = NULL;
static __thread size_t scratch_cap = 0;

/* This thread's scratch of at least `floats` floats (kept for the next call), or NULL. */
static float *scratch(size_t floats) {
    if (floats > scratch_cap) {
        free(scratch_buf);
        scratch_buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        scratch_cap = scratch_buf ? floats : 0;
    }
    return scratch_buf;
}

/* The start of a top-down pass: rows [rows][TILE] all 0 but the root (slot S - 1), 1. */
static void root_flow(float *flow, int64_t S, int64_t rows) {
    memset(flow, 0, rows * TILE * sizeof(float));
    for (int64_t t = 0; t < TILE; t++) flow[(S - 1) * TILE + t] = 1.0f;
}

/* src [T, n] rows t0..t0+nt -> dst [n][TILE], lanes past nt = pad. */
static void load_tile(const float *src, int64_t n, int64_t t0, int64_t nt, float pad, float *dst) {
    for (int64_t t = 0; t < TILE; t++) {
        const float *row = src + (t0 + t) * n;
        for (int64_t i = 0; i < n; i++) dst[i * TILE + t] = t < nt ? row[i] : pad;
    }
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

/* The "sum" upward pass (torch_passes.upward): node log-values val, element weights ex = exp(e - top)
 * (fan-in > 1 only), norm = sum of ex clamped to FLT_MIN. With dval != NULL also the tangents:
 * de = d prime + d sub per element, d node = E_w[de]. top: [TILE] scratch. */
static void upward(const Prog *P, float *val, float *ex, float *norm, float *dval, float *de, float *top) {
    for (int64_t d = 0; d < P->num_nodes; d++) {
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        float *v = val + slot * TILE;
        if (F == 1) { /* a product: weight 1 */
            add_rows(v, val + P->prime[r0] * TILE, val + P->sub[r0] * TILE);
            if (dval) add_rows(dval + slot * TILE, dval + P->prime[r0] * TILE, dval + P->sub[r0] * TILE);
            continue;
        }
        for (int64_t t = 0; t < TILE; t++) top[t] = -FLT_MAX; /* a dead node keeps exp(e - top) = 0 */
        for (int64_t e = 0; e < F; e++)
            add_rows_max(ex + (r0 + e) * TILE, top, val + P->prime[r0 + e] * TILE, val + P->sub[r0 + e] * TILE);
        float *x = ex + r0 * TILE;
        for (int64_t e = 0; e < F; e++)
            for (int64_t t = 0; t < TILE; t++) x[e * TILE + t] -= top[t];
        pm_exp(x, F * TILE);
        float *s = norm + slot * TILE;
        memcpy(s, x, TILE * sizeof(float));
        for (int64_t e = 1; e < F; e++)
            for (int64_t t = 0; t < TILE; t++) s[t] += x[e * TILE + t]; /* in element order, as the descent */
        memcpy(v, s, TILE * sizeof(float));
        pm_log(v, TILE);
        for (int64_t t = 0; t < TILE; t++) {
            v[t] += top[t];
            s[t] = max2(s[t], FLT_MIN); /* a dead node's zero flow / FLT_MIN = 0 */
        }
        if (!dval) continue;
        float *dv = dval + slot * TILE;
        memset(dv, 0, TILE * sizeof(float));
        for (int64_t e = 0; e < F; e++)
            tangent_row(de + (r0 + e) * TILE, dv, x + e * TILE, dval + P->prime[r0 + e] * TILE,
                        dval + P->sub[r0 + e] * TILE);
        for (int64_t t = 0; t < TILE; t++) dv[t] /= s[t];
    }
}

/* Exact ancestral sampling (torch_passes.sample) of one tile, tokens t0..t0+nt of r [T, n], into
 * z [T, n]. U [count, T]: the uniforms, one row per vtree id; uid [S]: each decision slot's row of U.
 * fill [T, n]: uniforms for implicit variables (unused when the circuit is smooth).
 * logz [T]: the root's log-value, for the caller's checks. Returns 0, or -1 when scratch cannot
 * be allocated. */
static int64_t sample_tile(const Prog *P, const float *r, const float *U, const int64_t *uid, const float *fill,
                           float *z, float *logz, int64_t T, int64_t t0, int64_t nt) {
    const int64_t n = P->n, S = P->num_slots, R = P->num_rows;
    float *buf = scratch((size_t)(3 * n + 3 * S + R + 5) * TILE);
    if (!buf) return -1;
    float *rt = buf, *p = rt + n * TILE, *val = p + n * TILE, *norm = val + S * TILE, *act = norm + S * TILE;
    float *ex = act + S * TILE, *top = ex + R * TILE, *x = top + TILE, *c = x + TILE, *prev = c + TILE,
          *u = prev + TILE;
    load_tile(r, n, t0, nt, 0.0f, rt);
    leaves(n, rt, val, P->smooth ? NULL : p);
    upward(P, val, ex, norm, NULL, NULL, top);
    memcpy(logz + t0, val + (S - 1) * TILE, nt * sizeof(float));
    root_flow(act, S, S);
    for (int64_t d = P->num_nodes - 1; d >= 0; d--) {
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        const float *a = act + slot * TILE;
        if (F == 1) {
            pass_rows(act + P->prime[r0] * TILE, act + P->sub[r0] * TILE, a);
            continue;
        }
        const float *urow = U + uid[slot] * T + t0, *tot = norm + slot * TILE;
        for (int64_t t = 0; t < TILE; t++) u[t] = t < nt ? urow[t] : 0.5f;
        /* A live node's largest weight is 1, so u * total < total: some element passes.
         * Inactive nodes get x = inf, which nothing passes. */
        for (int64_t t = 0; t < TILE; t++) {
            x[t] = a[t] > 0.0f ? u[t] * tot[t] : INFINITY;
            c[t] = 0.0f;
            prev[t] = 0.0f;
        }
        for (int64_t e = 0; e < F; e++)
            pick_row(act + P->prime[r0 + e] * TILE, act + P->sub[r0 + e] * TILE, c, prev, ex + (r0 + e) * TILE, x);
    }
    const float *pos = act + 2 * TILE, *neg = act + (2 + n) * TILE;
    for (int64_t t = 0; t < nt; t++) {
        float *zr = z + (t0 + t) * n;
        const float *fr = fill ? fill + (t0 + t) * n : NULL;
        for (int64_t i = 0; i < n; i++) {
            float on = pos[i * TILE + t] > 0.0f ? 1.0f : 0.0f;
            if (!P->smooth && on == 0.0f && !(neg[i * TILE + t] > 0.0f))
                on = fr[i] < p[i * TILE + t] ? 1.0f : 0.0f; /* an implicit variable: its own coin */
            zr[i] = on;
        }
    }
    return 0;
}

/* log Z and, when m != NULL, the marginals (torch_passes.upward, downward and marginals_from_flows)
 * for tokens t0..t0+nt (one tile): r, m [T, n], logz [T]. Returns 0, or -1. */
static int64_t marginals_tile(const Prog *P, const float *r, float *m, float *logz, int64_t t0, int64_t nt) {
    const int64_t n = P->n, S = P->num_slots, R = P->num_rows;
    float *buf = scratch((size_t)(2 * n + 3 * S + R + 2) * TILE);
    if (!buf) return -1;
    float *rt = buf, *p = rt + n * TILE, *val = p + n * TILE, *norm = val + S * TILE, *g = norm + S * TILE;
    float *ex = g + S * TILE, *top = ex + R * TILE, *coef = top + TILE;
    load_tile(r, n, t0, nt, 0.0f, rt);
    leaves(n, rt, val, p);
    upward(P, val, ex, norm, NULL, NULL, top);
    memcpy(logz + t0, val + (S - 1) * TILE, nt * sizeof(float));
    if (!m) return 0;
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
    const float *gpos = g + 2 * TILE, *gneg = g + (2 + n) * TILE;
    for (int64_t t = 0; t < nt; t++) {
        float *o = m + (t0 + t) * n;
        for (int64_t i = 0; i < n; i++) {
            const int64_t k = i * TILE + t; /* an implicit x_i is 1 with probability p_i */
            o[i] = P->smooth ? gpos[k] : gpos[k] + p[k] * (1.0f - gpos[k] - gneg[k]);
        }
    }
    return 0;
}

/* MAP (torch_passes.max_upward and map_assignment) of one tile, tokens t0..t0+nt of r [T, n], into
 * z [T, n]; best [T]: the root's max log-value (-inf exactly when no assignment satisfies). An implicit
 * variable adds log max(p, 1 - p) to its element on the way up and takes r > 0 in the end; each
 * node takes its first maximal element. Returns 0, or -1. */
static int64_t map_tile(const Prog *P, const float *r, float *z, float *best, int64_t t0, int64_t nt) {
    const int64_t n = P->n, S = P->num_slots, R = P->num_rows;
    float *buf = scratch((size_t)(2 * n + 2 * S + R + 2) * TILE);
    if (!buf) return -1;
    float *rt = buf, *h = rt + n * TILE, *val = h + n * TILE, *act = val + S * TILE, *ex = act + S * TILE;
    float *gap = ex + R * TILE, *found = gap + TILE;
    load_tile(r, n, t0, nt, 0.0f, rt);
    leaves(n, rt, val, NULL);
    for (int64_t i = 0; i < n * TILE; i++) h[i] = max2(val[2 * TILE + i], val[(2 + n) * TILE + i]);
    for (int64_t d = 0; d < P->num_nodes; d++) { /* max-product upward */
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        float *v = val + slot * TILE;
        for (int64_t t = 0; t < TILE; t++) v[t] = -INFINITY;
        for (int64_t e = r0; e < r0 + F; e++) {
            float *x = ex + e * TILE;
            if (P->imp_off[e] == P->imp_off[e + 1]) {
                add_rows_max(x, v, val + P->prime[e] * TILE, val + P->sub[e] * TILE);
                continue;
            }
            memset(gap, 0, TILE * sizeof(float)); /* as torch: (prime + sub) + (0 + h_a + h_b ...) */
            for (int64_t k = P->imp_off[e]; k < P->imp_off[e + 1]; k++) acc_row(gap, h + P->imp_var[k] * TILE);
            add_rows(x, val + P->prime[e] * TILE, val + P->sub[e] * TILE);
            acc_row(x, gap);
            max_row(v, x);
        }
    }
    memcpy(best + t0, val + (S - 1) * TILE, nt * sizeof(float));
    root_flow(act, S, S);
    for (int64_t d = P->num_nodes - 1; d >= 0; d--) { /* argmax descent */
        const int64_t slot = P->nodes[3 * d], r0 = P->nodes[3 * d + 1], F = P->nodes[3 * d + 2];
        const float *a = act + slot * TILE, *v = val + slot * TILE;
        memset(found, 0, TILE * sizeof(float));
        for (int64_t e = r0; e < r0 + F; e++)
            argmax_row(act + P->prime[e] * TILE, act + P->sub[e] * TILE, found, ex + e * TILE, v, a);
    }
    const float *pos = act + 2 * TILE, *neg = act + (2 + n) * TILE;
    for (int64_t t = 0; t < nt; t++) {
        float *zr = z + (t0 + t) * n;
        for (int64_t i = 0; i < n; i++) {
            const int64_t k = i * TILE + t;
            zr[i] = pos[k] > 0.0f ? 1.0f : (neg[k] > 0.0f || P->smooth) ? 0.0f : (rt[k] > 0.0f ? 1.0f : 0.0f);
        }
    }
    return 0;
}

/* Cov(z) v (torch_passes.marginals_jvp) of one tile, tokens t0..t0+nt: r, v, out [T, n]. Forward-mode
 * tangents through the upward pass, then flows g and their tangents dg down. Returns 0, or -1. */
static int64_t jvp_tile(const Prog *P, const float *r, const float *v, float *out, int64_t t0, int64_t nt) {
    const int64_t n = P->n, S = P->num_slots, R = P->num_rows;
    float *buf = scratch((size_t)(3 * n + 6 * S + 2 * R + 3) * TILE);
    if (!buf) return -1;
    float *rt = buf, *vt = rt + n * TILE, *p = vt + n * TILE, *val = p + n * TILE, *dval = val + S * TILE;
    float *norm = dval + S * TILE, *g = norm + S * TILE, *dg = g + S * TILE, *ex = dg + S * TILE;
    float *de = ex + R * TILE, *top = de + R * TILE, *coef = top + TILE, *dcoef = coef + TILE;
    load_tile(r, n, t0, nt, 0.0f, rt);
    load_tile(v, n, t0, nt, 0.0f, vt);
    leaves(n, rt, val, p);
    memset(dval, 0, 2 * TILE * sizeof(float));
    float *dpos = dval + 2 * TILE, *dneg = dval + (2 + n) * TILE;
    for (int64_t i = 0; i < n * TILE; i++) { /* d log sigma(r) = (1 - p) v, d log sigma(-r) = -p v */
        const float pv = p[i] * vt[i];
        dpos[i] = vt[i] - pv;
        dneg[i] = -pv;
    }
    upward(P, val, ex, norm, dval, de, top);
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
            dcoef[t] = dgs[t] / nm[t];
        }
        for (int64_t e = 0; e < F; e++) {
            const int64_t pr = P->prime[r0 + e] * TILE, sb = P->sub[r0 + e] * TILE;
            flow_rows(g + pr, g + sb, dg + pr, dg + sb, ex + (r0 + e) * TILE, de + (r0 + e) * TILE, dv, coef, dcoef);
        }
    }
    const float *gpos = g + 2 * TILE, *gneg = g + (2 + n) * TILE;
    const float *dgpos = dg + 2 * TILE, *dgneg = dg + (2 + n) * TILE;
    for (int64_t t = 0; t < nt; t++) {
        float *o = out + (t0 + t) * n;
        for (int64_t i = 0; i < n; i++) {
            const int64_t k = i * TILE + t;
            if (P->smooth) {
                o[i] = dgpos[k];
            } else { /* an implicit x_i is 1 with probability p_i wherever neither literal is reached */
                const float pi = p[k];
                o[i] = dgpos[k] + pi * (1.0f - pi) * vt[k] * (1.0f - gpos[k] - gneg[k]) - pi * (dgpos[k] + dgneg[k]);
            }
        }
    }
    return 0;
}

/* The entry points: tiles split statically over `threads` OpenMP threads (the runtime torch
 * itself uses, so its idle workers take the tiles). Tiles are independent, so the results do not
 * depend on the thread count. Each returns 0, or -1 when some thread's scratch cannot be
 * allocated. OVER_TILES runs CALL, an expression of the tile's tokens t0..t0+nt, on every tile. */
#define OVER_TILES(T, CALL)                                                                                    \
    int64_t failed = 0;                                                                                        \
    const int64_t tiles = ((T) + TILE - 1) / TILE;                                                             \
    _Pragma("omp parallel for num_threads(threads) schedule(static) reduction(| : failed) if (tiles > 1)")   \
    for (int64_t k = 0; k < tiles; k++) {                                                                      \
        const int64_t t0 = k * TILE, nt = (T) - t0 < TILE ? (T) - t0 : TILE;                                   \
        failed |= (CALL);                                                                                      \
    }                                                                                                          \
    return failed ? -1 : 0

int64_t pm_sample(const Prog *P, const float *r, const float *U, const int64_t *uid, const float *fill,
                  float *z, float *logz, int64_t T, int64_t threads) {
    OVER_TILES(T, sample_tile(P, r, U, uid, fill, z, logz, T, t0, nt));
}

int64_t pm_jvp(const Prog *P, const float *r, const float *v, float *out, int64_t T, int64_t threads) {
    OVER_TILES(T, jvp_tile(P, r, v, out, t0, nt));
}

int64_t pm_marginals(const Prog *P, const float *r, float *m, float *logz, int64_t T, int64_t threads) {
    OVER_TILES(T, marginals_tile(P, r, m, logz, t0, nt));
}

int64_t pm_map(const Prog *P, const float *r, float *z, float *best, int64_t T, int64_t threads) {
    OVER_TILES(T, map_tile(P, r, z, best, t0, nt));
}
