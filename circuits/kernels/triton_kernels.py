"""Triton kernels of the circuit passes: one program takes a block of B tokens through the whole circuit.

The mathematics is that of ``circuits.kernels.torch_passes`` (read it first: it is these kernels'
meaning and test oracle), in the loop structure of the fused C passes (``c/passes.c``): each
program walks every decision node of the layout bottom-up, then top-down, for its B tokens, and
each element is touched once per pass. ``circuits.kernels.triton_passes`` launches them.

Memory. A program's working rows (slot values, element weights, flows) live in global scratch
laid out [programs, rows, B]: one row holds B consecutive tokens, so every load and store is
coalesced. B = 32 x num_warps, so each token lane belongs to exactly one thread, and a lane is
only ever read back by the thread that wrote it: no barrier is needed anywhere. Tokens never
interact; the last block's lanes past T compute on logit 0 (uniform 0.5) and are not written out.
A launch has as many programs as the caller's scratch budget allows, at most one per block; program
p takes blocks p, p + programs, ... in turn, reusing its scratch, so the scratch does not grow with T.

Inputs, all on the device: logits r [T, n] fp32; the node table nodes [D, 4] int32, bottom-up:
(slot, first element row, fan-in, row of the uniforms); prime, sub [R] int32; for MAP the
implicit variables of element row e, imp_var[imp_off[e] : imp_off[e + 1]] ([R + 1], [P] int32).
Slots: 0 = FALSE, 1 = TRUE, 2 + i = x_i, 2 + n + i = not x_i, then the nodes; the root is S - 1.
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))
POS_INF = tl.constexpr(float("inf"))
LOWEST = tl.constexpr(-3.4028234663852886e38)  # -FLT_MAX: a dead node's max keeps exp(e - max) = 0
TINY = tl.constexpr(1.1754943508222875e-38)  # FLT_MIN: a dead node's zero flow / TINY = 0


@triton.jit
def _scratch(buf, rows, B: tl.constexpr):
    """This program's rows in buf [programs, rows, B], as B pointers to row 0: row s is at + s * B."""
    return buf + tl.program_id(0).to(tl.int64) * rows * B + tl.arange(0, B)


@triton.jit
def _tokens(blk, T, B: tl.constexpr):
    """(block ``blk``'s token indices [B] int64, which of them are < T [B])."""
    tok = (tl.zeros([B], tl.int64) + blk) * B + tl.arange(0, B)
    return tok, tok < T


@triton.jit
def _soft(x):
    """(log(1 + e^-|x|), sigmoid(x)) for x in [-inf, inf), without overflow or NaN: [B] -> [B], [B]."""
    a = tl.exp(-tl.abs(x))
    u = 1.0 + a
    d = u - 1.0
    soft = tl.where(d == 0.0, a, tl.log(u) * (a / tl.where(d == 0.0, 1.0, d)))  # log1p(a), accurate for small a
    return soft, tl.where(x >= 0.0, 1.0, a) / u


@triton.jit
def _leaves(r, val, dval, v, tok, live, n, B: tl.constexpr, TANGENTS: tl.constexpr):
    """The leaf rows of val: FALSE = -inf, TRUE = 0, x_i = log sigma(r_i), not x_i = log sigma(-r_i), from
    r [T, n]. TANGENTS: also those of dval, d log sigma(+-r) = (1 - p) v, -p v for the direction v [T, n]."""
    tl.store(val, tl.full([B], NEG_INF, tl.float32))
    tl.store(val + B, tl.zeros([B], tl.float32))
    if TANGENTS:
        tl.store(dval, tl.zeros([B], tl.float32))
        tl.store(dval + B, tl.zeros([B], tl.float32))
    for i in range(n):
        x = tl.load(r + tok * n + i, mask=live, other=0.0)
        soft, p = _soft(x)
        tl.store(val + (2 + i) * B, tl.minimum(x, 0.0) - soft)
        tl.store(val + (2 + n + i) * B, -(tl.maximum(x, 0.0) + soft))
        if TANGENTS:
            vi = tl.load(v + tok * n + i, mask=live, other=0.0)
            dneg = p * vi
            tl.store(dval + (2 + i) * B, vi - dneg)
            tl.store(dval + (2 + n + i) * B, -dneg)


@triton.jit
def _tilt_addend(e, tok, live, n, cp, cn, g, up, down, imp_off, imp_var, B: tl.constexpr):
    """Element row e's addend of the tilt (``torch_passes.tilt``: gap): up[e] c+ + down[e] c- plus g
    [T, n] of its implicit variables -> [B]."""
    add = tl.load(up + e) * cp + tl.load(down + e) * cn
    for j in range(tl.load(imp_off + e), tl.load(imp_off + e + 1)):
        add += tl.load(g + tok * n + tl.load(imp_var + j), mask=live, other=0.0)
    return add


@triton.jit
def _tilt_tangent(e, tok, live, n, dg, imp_off, imp_var, B: tl.constexpr):
    """The tangent of element row e's tilt addend: dg [T, n] summed over its implicit variables -> [B]."""
    add = tl.zeros([B], tl.float32)
    for j in range(tl.load(imp_off + e), tl.load(imp_off + e + 1)):
        add += tl.load(dg + tok * n + tl.load(imp_var + j), mask=live, other=0.0)
    return add


@triton.jit
def _upward(
    val,
    ex,
    norm,
    dval,
    de,
    nodes,
    prime,
    sub,
    D,
    B: tl.constexpr,
    TANGENTS: tl.constexpr,
    tok,
    live,
    n,
    cp,
    cn,
    g,
    dg,
    up,
    down,
    imp_off,
    imp_var,
    TILT: tl.constexpr,
    SMOOTH: tl.constexpr,
):
    """The "sum" upward pass (``torch_passes.upward``): node log-values into val; for fan-in > 1 the
    element weights exp(e - node max) into ex and their sum (at least TINY) into norm. TANGENTS: also
    dval (d node = E_w[d e]) and the element tangents de. A product (fan-in 1) is its element's value,
    with weight 1 and norm 1 (written, so the passes down need no case for it). TILT: each element
    adds its tilt addend (``_tilt_addend``; c+ and c- [B]) and, with TANGENTS, its tangent."""
    for d in range(D):
        slot = tl.load(nodes + 4 * d)
        r0 = tl.load(nodes + 4 * d + 1)
        fanin = tl.load(nodes + 4 * d + 2)
        if fanin == 1:
            p, s = tl.load(prime + r0) * B, tl.load(sub + r0) * B
            x = tl.load(val + p) + tl.load(val + s)
            if TILT:
                x = x + _tilt_addend(r0, tok, live, n, cp, cn, g, up, down, imp_off, imp_var, B)
            tl.store(val + slot * B, x)
            tl.store(ex + r0 * B, tl.full([B], 1.0, tl.float32))
            tl.store(norm + slot * B, tl.full([B], 1.0, tl.float32))
            if TANGENTS:
                de_e = tl.load(dval + p) + tl.load(dval + s)
                if TILT and not SMOOTH:
                    de_e = de_e + _tilt_tangent(r0, tok, live, n, dg, imp_off, imp_var, B)
                tl.store(de + r0 * B, de_e)
                tl.store(dval + slot * B, de_e)
        else:
            top = tl.full([B], LOWEST, tl.float32)
            for e in range(r0, r0 + fanin):
                x = tl.load(val + tl.load(prime + e) * B) + tl.load(val + tl.load(sub + e) * B)
                if TILT:
                    x = x + _tilt_addend(e, tok, live, n, cp, cn, g, up, down, imp_off, imp_var, B)
                tl.store(ex + e * B, x)
                top = tl.maximum(top, x)
            total = tl.zeros([B], tl.float32)
            acc = tl.zeros([B], tl.float32)
            for e in range(r0, r0 + fanin):  # in element order, as the descent sums
                w = tl.exp(tl.load(ex + e * B) - top)
                tl.store(ex + e * B, w)
                total += w
                if TANGENTS:
                    de_e = tl.load(dval + tl.load(prime + e) * B) + tl.load(dval + tl.load(sub + e) * B)
                    if TILT and not SMOOTH:
                        de_e = de_e + _tilt_tangent(e, tok, live, n, dg, imp_off, imp_var, B)
                    tl.store(de + e * B, de_e)
                    acc += w * de_e
            nm = tl.maximum(total, TINY)  # a live node's total is >= 1; a dead node's is 0
            tl.store(val + slot * B, tl.where(total > 0.0, tl.log(nm) + top, NEG_INF))
            tl.store(norm + slot * B, nm)
            if TANGENTS:
                tl.store(dval + slot * B, acc / nm)


@triton.jit
def _root_rows(buf, S, root: tl.constexpr, B: tl.constexpr):
    """Rows 0 .. S - 1 of buf = 0 but the root row (S - 1) = ``root``: the start of a top-down pass."""
    for s in range(S - 1):
        tl.store(buf + s * B, tl.zeros([B], tl.float32))
    tl.store(buf + (S - 1) * B, tl.full([B], root, tl.float32))


@triton.jit
def marginals_kernel(
    r,
    pr,
    c,
    tg,
    m,
    logz,
    val,
    ex,
    norm,
    g,
    nodes,
    prime,
    sub,
    up,
    down,
    imp_off,
    imp_var,
    T,
    n,
    S,
    R,
    D,
    B: tl.constexpr,
    SMOOTH: tl.constexpr,
    MARGINALS: tl.constexpr,
    TILT: tl.constexpr,
):
    """log Z [T] (of the tilted pass: the caller adds the tilt's offset) and, when MARGINALS, m [T, n] =
    P(x_i = 1 | C) (``torch_passes.upward``, ``downward``, ``marginals_from_flows``). r: the tilted
    logits x [T, n], pr: the logits [T, n], c [T] the tilt, tg [T, n] its implicit terms (see
    ``_upward``). Scratch: val, norm, g [programs, S, B], ex [programs, R, B]."""
    val, norm, g, ex = _scratch(val, S, B), _scratch(norm, S, B), _scratch(g, S, B), _scratch(ex, R, B)
    for blk in range(tl.program_id(0), tl.cdiv(T, B), tl.num_programs(0)):  # blocks of B tokens
        tok, live = _tokens(blk, T, B)
        _leaves(r, val, val, r, tok, live, n, B, False)
        ct = tl.load(c + tok, mask=live, other=0.0)
        _upward(
            val,
            ex,
            norm,
            val,
            ex,
            nodes,
            prime,
            sub,
            D,
            B,
            False,
            tok,
            live,
            n,
            tl.maximum(ct, 0.0),
            tl.minimum(ct, 0.0),
            tg,
            tg,
            up,
            down,
            imp_off,
            imp_var,
            TILT,
            SMOOTH,
        )
        tl.store(logz + tok, tl.load(val + (S - 1) * B), mask=live)
        if MARGINALS:
            _root_rows(g, S, 1.0, B)
            for k in range(D):  # top-down: flows g = d log Z / d val, passed to each element's prime and sub
                d = D - 1 - k
                slot = tl.load(nodes + 4 * d)
                r0 = tl.load(nodes + 4 * d + 1)
                fanin = tl.load(nodes + 4 * d + 2)
                coef = tl.load(g + slot * B) / tl.load(norm + slot * B)
                for e in range(r0, r0 + fanin):
                    f = tl.load(ex + e * B) * coef
                    p, s = g + tl.load(prime + e) * B, g + tl.load(sub + e) * B
                    tl.store(p, tl.load(p) + f)
                    tl.store(s, tl.load(s) + f)
            for i in range(n):  # an implicit x_i is 1 with probability p_i
                gp = tl.load(g + (2 + i) * B)
                if not SMOOTH:
                    _, p = _soft(tl.load(pr + tok * n + i, mask=live, other=0.0))
                    gp = gp + p * (1.0 - gp - tl.load(g + (2 + n + i) * B))
                tl.store(m + tok * n + i, gp, mask=live)


@triton.jit
def sample_kernel(
    r,
    pr,
    c,
    tg,
    uniforms,
    fill,
    z,
    logz,
    val,
    ex,
    norm,
    act,
    nodes,
    prime,
    sub,
    up,
    down,
    imp_off,
    imp_var,
    T,
    n,
    S,
    R,
    D,
    B: tl.constexpr,
    SMOOTH: tl.constexpr,
    TILT: tl.constexpr,
):
    """One exact draw z [T, n] and log Z [T] (tilted, as ``marginals_kernel``) (``torch_passes.sample``):
    each active node picks its element by inverse CDF with the uniform of its row of uniforms [count, T];
    an implicit variable is 1 when its fill [T, n] < sigmoid(pr). r, pr, c, tg as ``marginals_kernel``.
    Scratch: val, norm, act [programs, S, B], ex [programs, R, B]."""
    val, norm, act, ex = _scratch(val, S, B), _scratch(norm, S, B), _scratch(act, S, B), _scratch(ex, R, B)
    for blk in range(tl.program_id(0), tl.cdiv(T, B), tl.num_programs(0)):  # blocks of B tokens
        tok, live = _tokens(blk, T, B)
        _leaves(r, val, val, r, tok, live, n, B, False)
        ct = tl.load(c + tok, mask=live, other=0.0)
        _upward(
            val,
            ex,
            norm,
            val,
            ex,
            nodes,
            prime,
            sub,
            D,
            B,
            False,
            tok,
            live,
            n,
            tl.maximum(ct, 0.0),
            tl.minimum(ct, 0.0),
            tg,
            tg,
            up,
            down,
            imp_off,
            imp_var,
            TILT,
            SMOOTH,
        )
        tl.store(logz + tok, tl.load(val + (S - 1) * B), mask=live)
        _root_rows(act, S, 1.0, B)
        for k in range(D):  # top-down: an active node (activity 1) passes 1 to its chosen element's prime and sub
            d = D - 1 - k
            slot = tl.load(nodes + 4 * d)
            r0 = tl.load(nodes + 4 * d + 1)
            fanin = tl.load(nodes + 4 * d + 2)
            u = tl.load(uniforms + tl.load(nodes + 4 * d + 3).to(tl.int64) * T + tok, mask=live, other=0.5)
            # A live node's largest weight is 1, so u * total < total: some element passes. Inactive
            # nodes get x = inf, which nothing passes.
            x = tl.where(tl.load(act + slot * B) > 0.0, u * tl.load(norm + slot * B), POS_INF)
            cum = tl.zeros([B], tl.float32)
            prev = tl.zeros([B], tl.float32)
            for e in range(r0, r0 + fanin):
                cum += tl.load(ex + e * B)
                passed = tl.where(cum > x, 1.0, 0.0)
                p, s = act + tl.load(prime + e) * B, act + tl.load(sub + e) * B
                tl.store(p, tl.load(p) + (passed - prev))  # the first element passed
                tl.store(s, tl.load(s) + (passed - prev))
                prev = passed
        for i in range(n):
            on = tl.load(act + (2 + i) * B) > 0.0
            if not SMOOTH:  # neither literal reached: an implicit variable, its own coin
                _, p = _soft(tl.load(pr + tok * n + i, mask=live, other=0.0))
                coin = tl.load(fill + tok * n + i, mask=live, other=1.0) < p
                on = on | (~(tl.load(act + (2 + n + i) * B) > 0.0) & coin)
            tl.store(z + tok * n + i, tl.where(on, 1.0, 0.0), mask=live)


@triton.jit
def map_kernel(
    r,
    pr,
    c,
    hm,
    z,
    best,
    val,
    ex,
    act,
    nodes,
    prime,
    sub,
    up,
    down,
    imp_off,
    imp_var,
    T,
    n,
    S,
    R,
    D,
    B: tl.constexpr,
    SMOOTH: tl.constexpr,
    TILT: tl.constexpr,
):
    """The most probable assignment z [T, n] and its log-value best [T] (of the tilted pass: the caller
    adds the tilt's offset) (``torch_passes.max_upward``, ``map_assignment``): max-product upward, an
    implicit variable adding its best value hm [T, n] (``torch_passes.max_terms``) to its element
    (``_tilt_addend``) and taking pr > 0; each node takes its first maximal element. r, pr, c as
    ``marginals_kernel``. Scratch: val, act [programs, S, B], ex [programs, R, B] (element log-values)."""
    val, act, ex = _scratch(val, S, B), _scratch(act, S, B), _scratch(ex, R, B)
    for blk in range(tl.program_id(0), tl.cdiv(T, B), tl.num_programs(0)):  # blocks of B tokens
        tok, live = _tokens(blk, T, B)
        _leaves(r, val, val, r, tok, live, n, B, False)
        ct = tl.load(c + tok, mask=live, other=0.0)
        cp, cn = tl.maximum(ct, 0.0), tl.minimum(ct, 0.0)
        for d in range(D):
            slot = tl.load(nodes + 4 * d)
            r0 = tl.load(nodes + 4 * d + 1)
            fanin = tl.load(nodes + 4 * d + 2)
            top = tl.full([B], NEG_INF, tl.float32)
            for e in range(r0, r0 + fanin):
                x = tl.load(val + tl.load(prime + e) * B) + tl.load(val + tl.load(sub + e) * B)
                if TILT:  # as torch: (prime + sub) + gap
                    x = x + _tilt_addend(e, tok, live, n, cp, cn, hm, up, down, imp_off, imp_var, B)
                tl.store(ex + e * B, x)
                top = tl.maximum(top, x)
            tl.store(val + slot * B, top)
        tl.store(best + tok, tl.load(val + (S - 1) * B), mask=live)
        _root_rows(act, S, 1.0, B)
        for k in range(D):  # argmax descent: the first element whose value is the node's
            d = D - 1 - k
            slot = tl.load(nodes + 4 * d)
            r0 = tl.load(nodes + 4 * d + 1)
            fanin = tl.load(nodes + 4 * d + 2)
            a = tl.load(act + slot * B)
            top = tl.load(val + slot * B)
            found = tl.zeros([B], tl.float32)
            for e in range(r0, r0 + fanin):
                hit = tl.where((found == 0.0) & (tl.load(ex + e * B) == top), 1.0, 0.0)
                found += hit
                p, s = act + tl.load(prime + e) * B, act + tl.load(sub + e) * B
                tl.store(p, tl.load(p) + hit * a)
                tl.store(s, tl.load(s) + hit * a)
        for i in range(n):
            on = tl.load(act + (2 + i) * B) > 0.0
            if not SMOOTH:  # neither literal reached: the variable's own argmax
                x = tl.load(pr + tok * n + i, mask=live, other=0.0)
                on = on | (~(tl.load(act + (2 + n + i) * B) > 0.0) & (x > 0.0))
            tl.store(z + tok * n + i, tl.where(on, 1.0, 0.0), mask=live)


@triton.jit
def jvp_kernel(
    r,
    pr,
    c,
    tg,
    tdg,
    v,
    out,
    val,
    ex,
    norm,
    dval,
    de,
    g,
    dg,
    nodes,
    prime,
    sub,
    up,
    down,
    imp_off,
    imp_var,
    T,
    n,
    S,
    R,
    D,
    B: tl.constexpr,
    SMOOTH: tl.constexpr,
    TILT: tl.constexpr,
):
    """out [T, n] = Cov(z) v for pr, v [T, n] (``torch_passes.marginals_jvp``): tangents up, then the
    flows g and their tangents dg down. r, c, tg as ``marginals_kernel``; tdg [T, n] the tangents of
    the tilt's implicit terms. Scratch: val, norm, dval, g, dg [programs, S, B]; ex, de [programs, R, B]."""
    val, norm, dval, g, dg = (
        _scratch(val, S, B),
        _scratch(norm, S, B),
        _scratch(dval, S, B),
        _scratch(g, S, B),
        _scratch(dg, S, B),
    )
    ex, de = _scratch(ex, R, B), _scratch(de, R, B)
    for blk in range(tl.program_id(0), tl.cdiv(T, B), tl.num_programs(0)):  # blocks of B tokens
        tok, live = _tokens(blk, T, B)
        _leaves(r, val, dval, v, tok, live, n, B, True)
        ct = tl.load(c + tok, mask=live, other=0.0)
        _upward(
            val,
            ex,
            norm,
            dval,
            de,
            nodes,
            prime,
            sub,
            D,
            B,
            True,
            tok,
            live,
            n,
            tl.maximum(ct, 0.0),
            tl.minimum(ct, 0.0),
            tg,
            tdg,
            up,
            down,
            imp_off,
            imp_var,
            TILT,
            SMOOTH,
        )
        _root_rows(g, S, 1.0, B)
        _root_rows(dg, S, 0.0, B)
        for k in range(D):  # flow = w coef, d flow = w ((de - d node) coef + d coef), to prime and sub
            d = D - 1 - k
            slot = tl.load(nodes + 4 * d)
            r0 = tl.load(nodes + 4 * d + 1)
            fanin = tl.load(nodes + 4 * d + 2)
            nm = tl.load(norm + slot * B)
            coef = tl.load(g + slot * B) / nm
            dcoef = tl.load(dg + slot * B) / nm
            dnode = tl.load(dval + slot * B)
            for e in range(r0, r0 + fanin):
                w = tl.load(ex + e * B)
                f = w * coef
                df = w * ((tl.load(de + e * B) - dnode) * coef + dcoef)
                p, s = tl.load(prime + e) * B, tl.load(sub + e) * B
                tl.store(g + p, tl.load(g + p) + f)
                tl.store(g + s, tl.load(g + s) + f)
                tl.store(dg + p, tl.load(dg + p) + df)
                tl.store(dg + s, tl.load(dg + s) + df)
        for i in range(n):
            dgp = tl.load(dg + (2 + i) * B)
            if not SMOOTH:  # an implicit x_i is 1 with probability p_i wherever neither literal is reached
                _, p = _soft(tl.load(pr + tok * n + i, mask=live, other=0.0))
                vi = tl.load(v + tok * n + i, mask=live, other=0.0)
                gp, gn = tl.load(g + (2 + i) * B), tl.load(g + (2 + n + i) * B)
                dgp = dgp + p * (1.0 - p) * vi * (1.0 - gp - gn) - p * (dgp + tl.load(dg + (2 + n + i) * B))
            tl.store(out + tok * n + i, dgp, mask=live)
