"""Layer-parallel Triton kernels of the circuit passes: one launch per level, a grid of token tiles x node tiles.

The mathematics is that of ``circuits.kernels.torch_passes`` (read it first: it is these kernels'
meaning and test oracle); the structure is PyJuice's: every value lives in a token-contiguous scratch
row, a launch evaluates one level (all nodes of one height: none is a child of another) for all
tokens, program (i, j) taking tokens [j BT, (j + 1) BT) of the level's node tile i (at most BN nodes),
so the parallelism runs across the nodes of a level as well as across tokens, and every load or store
of a value row is BT consecutive floats. Node tiles come first in the grid: the programs that run
together share a token tile, so a child row that several nodes gather is read from memory once and
then from L2. ``circuits.kernels.triton_passes`` builds the tables and launches them.

Scratch (token-contiguous, [rows, TS], TS >= the chunk's Tc tokens; float32, or float64 for the passes'
float64 log Z and marginals; tokens of a chunk are numbered
0 .. Tc - 1 there and t0 .. t0 + Tc - 1 in the inputs):

    val  [S, TS]  slot log-values: 0 = FALSE (-inf), 1 = TRUE (0), 2 + i = x_i, 2 + n + i = not x_i,
                  then the nodes, the root last (S - 1)
    norm [S, TS]  a node's sum of element weights (at least TINY); "sum" passes
    ex   [R, TS]  per element row: the weight exp(e - node max) ("sum") or the value e ("max"); the
                  downward passes overwrite it with the element's flow (or 0/1 choice)
    dval [S, TS], de [R, TS]  the tangents (Cov(z) v); de is overwritten by the flows' tangents

Upward (``up_kernel``): a node gathers its elements' children (prime, sub), adds the tilt's addend
(``torch_passes.tilt``), and takes logsumexp or max. Downward (``down_kernel``) pulls rather than
scatters: a node first sums the flows of its parent elements (all of higher levels, finished by
earlier launches), then writes its own elements' flows over their weights; no atomics, no races, and
each flow row is written once and read by its two children. ``leaf_kernel`` pulls the literals' flows
and writes the outputs [T, n]. Tables (int32, built once per circuit):

    tiles  [NT, 5]  per tile: (first entry in ``order``, nodes <= BN, max fan-in, max parents,
                    max implicit variables per element); each level a contiguous range of tiles
    order  [N]      slots, tile by tile (up: slot order; down: by parent count, descending)
    row0, fanin [S] a node slot's first element row and fan-in
    par_off [S + 1], par_rows [E]  per slot, the element rows whose prime or sub it is (CSR)
    sid [S]         a node slot's row of the uniforms (``Program.scope_ids``)
    prime, sub [R]; imp_off [R + 1], imp_var [P]: an element row's implicit variables (CSR)
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))
POS_INF = tl.constexpr(float("inf"))
# float32's, in the float64 passes too: no log-value falls below -FLT_MAX, and a live node's total is >= 1
LOWEST = tl.constexpr(-3.4028234663852886e38)  # -FLT_MAX: a dead node's max keeps exp(e - max) = 0
TINY = tl.constexpr(1.1754943508222875e-38)  # FLT_MIN: a dead node's zero flow / TINY = 0

# modes of the downward pass and the leaf kernel
FLOW = tl.constexpr(0)  # marginals: flows g = d log Z / d val
JVP = tl.constexpr(1)  # flows and their tangents
SAMPLE = tl.constexpr(2)  # 0/1 activity, inverse CDF with the uniforms
MAP = tl.constexpr(3)  # 0/1 activity, the first maximal element


@triton.jit
def _soft(x):
    """(log(1 + e^-|x|), sigmoid(x)) for x in [-inf, inf), without overflow or NaN: elementwise."""
    a = tl.exp(-tl.abs(x))
    u = 1.0 + a
    d = u - 1.0
    soft = tl.where(d == 0.0, a, tl.log(u) * (a / tl.where(d == 0.0, 1.0, d)))  # log1p(a), accurate for small a
    return soft, tl.where(x >= 0.0, 1.0, a) / u


@triton.jit
def _tile(tiles, tile0, order, BN: tl.constexpr):
    """The node tile of program_id(0): (slots [BN] int64, which are real [BN], max fan-in, max parents,
    max implicit variables)."""
    t = (tile0 + tl.program_id(0)) * 5
    first, count = tl.load(tiles + t), tl.load(tiles + t + 1)
    j = tl.arange(0, BN)
    real = j < count
    slot = tl.load(order + first + j, mask=real, other=0).to(tl.int64)
    return slot, real, tl.load(tiles + t + 2), tl.load(tiles + t + 3), tl.load(tiles + t + 4)


@triton.jit
def _tokens(Tc, BT: tl.constexpr):
    """(this program's chunk-local token indices [BT] int64, which are < Tc [BT])."""
    lt = tl.program_id(1).to(tl.int64) * BT + tl.arange(0, BT)
    return lt, lt < Tc


@triton.jit
def leaves_kernel(
    x,
    v,
    val,
    dval,
    t0,
    Tc,
    TS,
    n,
    BV: tl.constexpr,
    BT: tl.constexpr,
    TANGENTS: tl.constexpr,
):
    """The leaf rows of val [S, TS] (``torch_passes.log_sigmoid_leaves``): FALSE = -inf, TRUE = 0,
    x_i = log sigma(x_i), not x_i = log sigma(-x_i) for the (tilted) logits x [T, n]; TANGENTS: also
    dval's, d log sigma(+-x) = (1 - p) v, -p v for the direction v [T, n]. Grid: (variable tiles of BV,
    token tiles)."""
    lt, tm = _tokens(Tc, BT)
    i = tl.program_id(0) * BV + tl.arange(0, BV)
    im = i < n
    m2 = im[:, None] & tm[None, :]
    at = (t0 + lt)[None, :] * n + i[:, None]  # [BV, BT] into x, v
    xi = tl.load(x + at, mask=m2, other=0.0)
    soft, p = _soft(xi)
    pos = (2 + i[:, None]).to(tl.int64) * TS + lt[None, :]  # int64: slots x tokens can pass 2^31
    neg = (2 + n + i[:, None]).to(tl.int64) * TS + lt[None, :]
    tl.store(val + pos, tl.minimum(xi, 0.0) - soft, mask=m2)
    tl.store(val + neg, -(soft + tl.maximum(xi, 0.0)), mask=m2)
    first = tm & ((tl.zeros([BT], tl.int32) + tl.program_id(0)) == 0)
    tl.store(val + lt, tl.full([BT], NEG_INF, val.dtype.element_ty), mask=first)
    tl.store(val + TS + lt, tl.zeros([BT], val.dtype.element_ty), mask=first)
    if TANGENTS:
        vi = tl.load(v + at, mask=m2, other=0.0)
        dneg = p * vi
        tl.store(dval + pos, vi - dneg, mask=m2)
        tl.store(dval + neg, -dneg, mask=m2)
        tl.store(dval + lt, tl.zeros([BT], val.dtype.element_ty), mask=first)
        tl.store(dval + TS + lt, tl.zeros([BT], val.dtype.element_ty), mask=first)


@triton.jit
def up_kernel(
    val,
    ex,
    norm,
    dval,
    de,
    tiles,
    order,
    row0,
    fanin,
    prime,
    sub,
    up,
    down,
    imp_off,
    imp_var,
    c,
    gt,
    dgt,
    tile0,
    t0,
    Tc,
    TS,
    T,
    BN: tl.constexpr,
    BT: tl.constexpr,
    MAX: tl.constexpr,
    TANGENTS: tl.constexpr,
    TILT: tl.constexpr,
    IMPLICIT: tl.constexpr,
):
    """One level upward (``torch_passes.upward``): e = (val[prime] + val[sub]) + the tilt's addend, then
    per node logsumexp (weights exp(e - max) into ex, their sum, at least TINY, into norm; a fan-in-1
    node gets weight 1 and norm 1, its value e) or, MAX, the max (ex = e). TANGENTS: de = (dval[prime]
    + dval[sub]) + the addend's tangent, d node = E_w[de] / norm. TILT: the addend up[e] c+ + down[e] c-
    (c [T]), and IMPLICIT: plus gt [n, T] (dgt [n, T] its tangent) of the element's implicit variables.
    Grid: (the level's node tiles from ``tile0``, token tiles)."""
    slot, real, fmax, _, imax = _tile(tiles, tile0, order, BN)
    lt, tm = _tokens(Tc, BT)
    r0 = tl.load(row0 + slot, mask=real, other=0).to(tl.int64)
    f = tl.load(fanin + slot, mask=real, other=0)
    m2 = real[:, None] & tm[None, :]
    col = lt[None, :]
    if TILT:
        ct = tl.load(c + t0 + lt, mask=tm, other=0.0)
        cp, cn = tl.maximum(ct, 0.0)[None, :], tl.minimum(ct, 0.0)[None, :]
    top = tl.full([BN, BT], NEG_INF if MAX else LOWEST, val.dtype.element_ty)
    for e in range(fmax):
        live = real & (e < f)
        row = r0 + e
        em = live[:, None] & tm[None, :]
        p = tl.load(prime + row, mask=live, other=0).to(tl.int64)
        s = tl.load(sub + row, mask=live, other=0).to(tl.int64)
        x = tl.load(val + p[:, None] * TS + col, mask=em, other=0.0) + tl.load(
            val + s[:, None] * TS + col, mask=em, other=0.0
        )
        if TILT:
            add = (
                tl.load(up + row, mask=live, other=0.0)[:, None] * cp
                + tl.load(down + row, mask=live, other=0.0)[:, None] * cn
            )
            if IMPLICIT:
                i0 = tl.load(imp_off + row, mask=live, other=0)
                ni = tl.load(imp_off + row + 1, mask=live, other=0) - i0
                for j in range(imax):
                    jm = live & (j < ni)
                    var = tl.load(imp_var + i0 + j, mask=jm, other=0).to(tl.int64)
                    add += tl.load(gt + var[:, None] * T + (t0 + col), mask=jm[:, None] & tm[None, :], other=0.0)
            x = x + add
        tl.store(ex + row[:, None] * TS + col, x, mask=em)
        top = tl.maximum(top, tl.where(em, x, NEG_INF))
    out = slot[:, None] * TS + col
    if MAX:
        tl.store(val + out, top, mask=m2)
    else:
        total = tl.zeros([BN, BT], val.dtype.element_ty)
        acc = tl.zeros([BN, BT], val.dtype.element_ty)
        for e in range(fmax):  # in element order, as the descent sums
            live = real & (e < f)
            row = r0 + e
            em = live[:, None] & tm[None, :]
            w = tl.exp(tl.load(ex + row[:, None] * TS + col, mask=em, other=NEG_INF) - top)
            tl.store(ex + row[:, None] * TS + col, w, mask=em)
            total += w
            if TANGENTS:
                p = tl.load(prime + row, mask=live, other=0).to(tl.int64)
                s = tl.load(sub + row, mask=live, other=0).to(tl.int64)
                d = tl.load(dval + p[:, None] * TS + col, mask=em, other=0.0) + tl.load(
                    dval + s[:, None] * TS + col, mask=em, other=0.0
                )
                if IMPLICIT:
                    i0 = tl.load(imp_off + row, mask=live, other=0)
                    ni = tl.load(imp_off + row + 1, mask=live, other=0) - i0
                    dadd = tl.zeros([BN, BT], val.dtype.element_ty)
                    for j in range(imax):
                        jm = live & (j < ni)
                        var = tl.load(imp_var + i0 + j, mask=jm, other=0).to(tl.int64)
                        dadd += tl.load(dgt + var[:, None] * T + (t0 + col), mask=jm[:, None] & tm[None, :], other=0.0)
                    d = d + dadd
                tl.store(de + row[:, None] * TS + col, d, mask=em)
                acc += w * d
        nm = tl.maximum(total, TINY)  # a live node's total is >= 1; a dead node's is 0
        tl.store(val + out, tl.log(total) + top, mask=m2)
        tl.store(norm + out, nm, mask=m2)
        if TANGENTS:
            tl.store(dval + out, acc / nm, mask=m2)


@triton.jit
def _pull(buf, slot, real, tm, col, par_off, par_rows, pmax, TS, BN: tl.constexpr, BT: tl.constexpr):
    """Each slot's sum of buf [R, TS] over its parent element rows: [BN, BT]."""
    o0 = tl.load(par_off + slot, mask=real, other=0)
    np_ = tl.load(par_off + slot + 1, mask=real, other=0) - o0
    acc = tl.zeros([BN, BT], buf.dtype.element_ty)
    for j in range(pmax):
        jm = real & (j < np_)
        row = tl.load(par_rows + o0 + j, mask=jm, other=0).to(tl.int64)
        acc += tl.load(buf + row[:, None] * TS + col, mask=jm[:, None] & tm[None, :], other=0.0)
    return acc


@triton.jit
def down_kernel(
    val,
    ex,
    norm,
    dval,
    de,
    tiles,
    order,
    row0,
    fanin,
    par_off,
    par_rows,
    sid,
    uniforms,
    tile0,
    t0,
    Tc,
    TS,
    T,
    S,
    BN: tl.constexpr,
    BT: tl.constexpr,
    MODE: tl.constexpr,
):
    """One level downward: a node's g = the sum of its parent elements' flows in ex (1 more at the root),
    then its elements' flows written over their weights in ex. MODE FLOW (``torch_passes.downward``):
    flow = w g / norm. JVP (``torch_passes.marginals_jvp``): also dg from de, d flow = w ((de - d node)
    coef + d coef) over de, coef = g / norm, d coef = dg / norm. SAMPLE (``torch_passes.sample``): g is
    the node's activity a, and the first element whose running sum of weights passes u norm / a (u =
    uniforms [count, T] at the node's row ``sid``) gets flow 1. MAP (``torch_passes.map_assignment``):
    the first element whose value (ex) equals the node's (val) gets flow a. Grid: (the level's node tiles
    from ``tile0``, token tiles)."""
    slot, real, fmax, pmax, _ = _tile(tiles, tile0, order, BN)
    lt, tm = _tokens(Tc, BT)
    col = lt[None, :]
    m2 = real[:, None] & tm[None, :]
    r0 = tl.load(row0 + slot, mask=real, other=0).to(tl.int64)
    f = tl.load(fanin + slot, mask=real, other=0)
    root = tl.where(slot == S - 1, 1.0, 0.0)[:, None]
    g = _pull(ex, slot, real, tm, col, par_off, par_rows, pmax, TS, BN, BT) + root
    at = slot[:, None] * TS + col
    if MODE == SAMPLE:
        u = tl.load(uniforms + tl.load(sid + slot, mask=real, other=0).to(tl.int64)[:, None] * T + (t0 + col), mask=m2)
        # A live node's largest weight is 1, so u * total < total: some element passes. Inactive nodes
        # (a = 0) get x = inf or NaN, which nothing passes.
        x = u * tl.load(norm + at, mask=m2, other=1.0) / g
        cum = tl.zeros([BN, BT], ex.dtype.element_ty)
        prev = tl.zeros([BN, BT], ex.dtype.element_ty)
    elif MODE == MAP:
        top = tl.load(val + at, mask=m2, other=0.0)
        found = tl.zeros([BN, BT], ex.dtype.element_ty)
    else:
        nm = tl.load(norm + at, mask=m2, other=1.0)
        coef = g / nm
        if MODE == JVP:
            dcoef = (_pull(de, slot, real, tm, col, par_off, par_rows, pmax, TS, BN, BT)) / nm
            dnode = tl.load(dval + at, mask=m2, other=0.0)
    for e in range(fmax):
        live = real & (e < f)
        em = live[:, None] & tm[None, :]
        here = (r0 + e)[:, None] * TS + col
        w = tl.load(ex + here, mask=em, other=0.0)
        if MODE == SAMPLE:
            cum += w
            passed = tl.where(cum > x, 1.0, 0.0)
            tl.store(ex + here, passed - prev, mask=em)
            prev = passed
        elif MODE == MAP:
            hit = tl.where((found == 0.0) & (w == top), 1.0, 0.0)
            found += hit
            tl.store(ex + here, hit * g, mask=em)
        else:
            if MODE == JVP:
                d = tl.load(de + here, mask=em, other=0.0)
                tl.store(de + here, ((d - dnode) * coef + dcoef) * w, mask=em)
            tl.store(ex + here, coef * w, mask=em)


@triton.jit
def leaf_kernel(
    ex,
    de,
    par_off,
    par_rows,
    r,
    v,
    fill,
    out,
    tiles,
    tile0,
    t0,
    Tc,
    TS,
    n,
    BV: tl.constexpr,
    BT: tl.constexpr,
    MODE: tl.constexpr,
    SMOOTH: tl.constexpr,
):
    """The outputs out [T, n] from the literals' pulled flows gp (x_i), gn (not x_i) (``_pull``; MODE as
    ``down_kernel``): FLOW the marginals gp (+ p (1 - gp - gn) where x_i may be implicit, p = sigmoid(r),
    ``torch_passes.marginals_from_flows``); JVP Cov(z) v (``torch_passes.marginals_jvp``); SAMPLE the
    draw gp > 0 (or, neither literal reached, fill [T, n] < p); MAP gp > 0 (or, neither reached, r > 0).
    r, v [T, n]: the logits (shifted, not tilted) and the direction. tiles [., 5]: per tile of BV
    variables, the max parents (column 3). Grid: (variable tiles, token tiles)."""
    lt, tm = _tokens(Tc, BT)
    i = tl.program_id(0) * BV + tl.arange(0, BV)
    im = i < n
    m2 = im[:, None] & tm[None, :]
    col = lt[None, :]
    pmax = tl.load(tiles + (tile0 + tl.program_id(0)) * 5 + 3)
    pos, neg = (2 + i).to(tl.int64), (2 + n + i).to(tl.int64)
    gp = _pull(ex, pos, im, tm, col, par_off, par_rows, pmax, TS, BV, BT)
    at = (t0 + lt)[None, :] * n + i[:, None]  # [BV, BT] into the [T, n] arrays
    if MODE == FLOW:
        res = gp
        if not SMOOTH:
            gn = _pull(ex, neg, im, tm, col, par_off, par_rows, pmax, TS, BV, BT)
            _, p = _soft(tl.load(r + at, mask=m2, other=0.0))
            res = gp + p * (1.0 - gp - gn)
    elif MODE == JVP:
        res = _pull(de, pos, im, tm, col, par_off, par_rows, pmax, TS, BV, BT)
        if not SMOOTH:
            gn = _pull(ex, neg, im, tm, col, par_off, par_rows, pmax, TS, BV, BT)
            dgn = _pull(de, neg, im, tm, col, par_off, par_rows, pmax, TS, BV, BT)
            _, p = _soft(tl.load(r + at, mask=m2, other=0.0))
            vi = tl.load(v + at, mask=m2, other=0.0)
            res = res + p * (1.0 - p) * vi * (1.0 - gp - gn) - p * (res + dgn)
    else:
        on = gp > 0.0
        if not SMOOTH:  # neither literal reached: an implicit variable
            off = _pull(ex, neg, im, tm, col, par_off, par_rows, pmax, TS, BV, BT) > 0.0
            ri = tl.load(r + at, mask=m2, other=0.0)
            if MODE == SAMPLE:
                _, p = _soft(ri)
                coin = tl.load(fill + at, mask=m2, other=1.0) < p
            else:
                coin = ri > 0.0
            on = on | (~off & coin)
        res = tl.where(on, 1.0, 0.0)
    tl.store(out + at, res, mask=m2)


@triton.jit
def chosen_kernel(z, p, weights, indices, mask, T, n, slots, BT: tl.constexpr, BN: tl.constexpr):
    """The drawn variables by score (``Kernels.chosen`` after the draw: ``rows.topk_chosen_reference``),
    one sort per row in registers instead of a sort of [T, n] in memory: z [T, n] in {0, 1}, p [T, n] >= 0
    -> weights [T, slots] (p at the drawn, 0 past them), indices [T, slots] int64, mask [T, slots] (drawn).
    Each entry's key packs (drawn, p's bits, 65535 - index) into an int64, so one descending sort puts
    the drawn first by p descending (ties to the lower index), then the others by index ascending; a
    non-negative float's bits order as the float does. BN: n rounded up to a power of two (n <= 65535).
    Grid: (token tiles of BT)."""
    t = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    i = tl.arange(0, BN)
    tm, im = t < T, i < n
    m2 = tm[:, None] & im[None, :]
    at = t[:, None] * n + i[None, :]
    drawn = tl.load(z + at, mask=m2, other=0.0) > 0.5
    bits = tl.load(p + at, mask=m2, other=0.0).to(tl.int32, bitcast=True).to(tl.int64)
    key = tl.where(drawn, (bits << 16) | (1 << 62), 0) | (65535 - i).to(tl.int64)[None, :]
    key = tl.where(im[None, :], key, -1)  # columns past n sort last
    key = tl.sort(key, dim=1, descending=True)
    chosen = (key >> 62) > 0
    score = ((key >> 16) & 0x7FFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    out = t[:, None] * slots + i[None, :]
    om = tm[:, None] & (i[None, :] < slots)
    tl.store(weights + out, tl.where(chosen, score, 0.0), mask=om)
    tl.store(indices + out, 65535 - (key & 65535), mask=om)
    tl.store(mask + out, chosen, mask=om)


@triton.jit
def kth_largest_kernel(x, out, T, n, k, BT: tl.constexpr, BN: tl.constexpr):
    """Each row's k-th largest entry (``rows.kth_largest_reference``; NaN counts as -inf), one sort per row
    in registers: x [T, n] -> out [T], 1 <= k <= n. BN: n rounded up to a power of two. Grid: (token
    tiles of BT)."""
    t = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    i = tl.arange(0, BN)
    tm = t < T
    v = tl.load(x + t[:, None] * n + i[None, :], mask=tm[:, None] & (i < n)[None, :], other=NEG_INF)
    v = tl.sort(tl.where(v != v, NEG_INF, v), dim=1, descending=True)
    tl.store(out + t, tl.max(tl.where((i == k - 1)[None, :], v, NEG_INF), axis=1), mask=tm)
