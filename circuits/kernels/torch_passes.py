"""``TorchPasses``: the passes over a level layout as plain tensor operations, a handful per group.

Buffers are [slots, T] (one row per slot, tokens contiguous), so gathering children is a row
``index_select``; element buffers are [rows, T], one row per (padded) element. Leaves hold the
normalised log-weights log sigma(x) (x_i) and log sigma(-x) (not x_i) of the tilted logits x = r - c
(``tilt``: what keeps fp32 exact at every logit scale); with these an SDD needs no smoothing for
sums (see ``circuits.layout``). Big intermediates are written into buffers
allocated once per call: fresh allocations of this size cost as much as the arithmetic.

These passes are the stated meaning of the computation: the fused C passes
(``circuits.kernels.c_passes``) are tested against them, and they are in turn tested against the
node-by-node definition in ``circuits.kernels.by_node``. They run on any device and dtype; the
selection (``circuits.kernels.select``) gives them fp64, CUDA and machines without the C passes.
No pass synchronises with the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..layout import FALSE_SLOT, TRUE_SLOT
from .interface import Passes, shifted
from .program import Group, Program
from .scratch import ScratchPool

SCRATCH = ScratchPool()


@dataclass
class Upward:
    """An upward pass: slot log-values, and per element row either exp(e - node max) ("sum")
    or the element log-value ("max"); ``norm`` holds each node's sum of ``ex`` (at least the
    smallest normal float, so dividing a dead node's zero flow by it gives 0). Fan-in-1 nodes
    have weight 1 and norm 1, which every pass assumes: their ``ex`` rows hold the element
    log-value and their ``norm`` rows are not written. A pass with tangents also holds
    d val [S, T] and the element tangents d e [R, T]."""

    val: Tensor  # [S, T] log values
    ex: Tensor  # [R, T]
    norm: Tensor | None  # [S, T]; rows of decision slots are set ("sum" mode only)
    dval: Tensor | None = None  # [S, T]
    de: Tensor | None = None  # [R, T]


def _leaf_buffer(prog: Program, T: int, like: Tensor, name: str) -> tuple[Tensor, Tensor, Tensor]:
    """An [S, T] scratch buffer with FALSE = -inf and TRUE = 0, and views of its x_i and not x_i
    rows ([n, T] each) for the caller to fill."""
    n = prog.n
    buf = SCRATCH.get(name, (prog.num_slots, T), like)
    buf[FALSE_SLOT] = -torch.inf
    buf[TRUE_SLOT] = 0.0
    return buf, buf[2 : 2 + n], buf[2 + n : 2 + 2 * n]


def log_sigmoid_leaves(prog: Program, r: Tensor) -> Tensor:
    """The leaf values log sigma(r) (x_i) and log sigma(-r) (not x_i) for r in [-inf, inf):
    r [T, n] -> the "val" buffer [S, T], written in place."""
    buf, pos, neg = _leaf_buffer(prog, r.shape[0], r, "val")
    rt = r.T.clone(memory_format=torch.contiguous_format)  # [n, T]: a copy (clamped below), read contiguously
    torch.abs(rt, out=neg).neg_().exp_().log1p_()  # soft = log(1 + e^-|r|)
    torch.clamp(rt, max=0.0, out=pos).sub_(neg)  # log sigma(r) = min(r, 0) - soft
    neg.add_(rt.clamp_(min=0.0)).neg_()  # log sigma(-r) = -max(r, 0) - soft
    return buf


@dataclass
class Tilted:
    """The logits of a tilted pass (``tilt``): x = r - c [T, n]; the element addends gap [R, T] (None
    when the tilt moves no element); what log Z adds to the root's value, offset [T] (float64);
    c [T] and g [T, n] (each variable's sp(r) - sp(x) less c when c > 0)."""

    x: Tensor
    gap: Tensor | None
    offset: Tensor
    c: Tensor
    g: Tensor


def _tilt_term(y: Tensor, d: Tensor) -> Tensor:
    """log(sigma(y) + sigma(-y) e^-d) for y [T, n] in [-inf, inf), d [T, 1] >= 0, without cancellation:
    sp(-d - y) - sp(-y) for y >= 0 (both at most log 2), else logaddexp(y, -d) - sp(y)."""
    return torch.where(y >= 0, F.softplus(-d - y) - F.softplus(-y), torch.logaddexp(y, -d) - F.softplus(y))


TILT_STEPS = 4  # Newton steps of ``_refine``: from the start of ``tilt`` 3 reach the target to ~1e-2


def _refine(r: Tensor, c: Tensor, kmin: int, kmax: int) -> Tensor:
    """c [T] moved so that the expected size under Bernoulli(sigma(r - c)), r [T, n], is
    clamp(its size at c = 0, kmin, kmax): Newton steps on log sum sigma(r - c), each at most 20.
    There the circuit's event is likely, so the root's value (log P_x(C)) and log Z's offset do not
    cancel (ties at c: all-equal rows). Rows whose mean size is already in the band keep c = 0."""
    if kmax == 0:
        return c
    want = torch.sigmoid(r).sum(1).clamp(kmin, kmax)  # [T]; 0 (no step) only where c is 0 and fine
    log_want = torch.log(want)
    for _ in range(TILT_STEPS):
        p = torch.sigmoid(r - c.unsqueeze(1))  # [T, n]
        total, slope = p.sum(1), (p * (1.0 - p)).sum(1)
        step = (torch.log(total) - log_want) * total / slope
        ok = torch.isfinite(step) & (total > 0) & (slope > 0)
        c = c + torch.where(ok, step.clamp(-20.0, 20.0), torch.zeros_like(step))
    return c


def tilt_constant(r: Tensor, kmin: int, kmax: int, refine: bool = True) -> Tensor:
    """The tilt's constant c [T] for logits r [T, n] and models of kmin..kmax true variables:
    clamp(0, kmax-th largest, kmin-th largest logit) (0 where that is not finite), then with
    ``refine`` the Newton steps of ``_refine``. Shared by ``tilt`` and the cardinality DP
    (``circuits.kernels.torch_dp.up``), and computed the same way by their C code."""
    T, n = r.shape
    inf = torch.full((T,), torch.inf, dtype=r.dtype, device=r.device)
    top = torch.topk(r, min(kmax, n), dim=1).values  # [T, min(kmax, n)]; a k-th largest past n is -inf
    kth = lambda k: top[:, k - 1] if k <= n else -inf
    r_max = kth(kmax) if kmax > 0 else inf
    r_min = kth(kmin) if kmin > 0 else inf
    c = torch.minimum(r_min, r_max.clamp(min=0.0))
    c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))  # [T]
    return _refine(r, c, kmin, kmax) if refine else c


def tilt(prog: Program, r: Tensor, elements: bool = True, refine: bool = True) -> Tilted:
    """The tilt that keeps fp32 exact at every logit scale: the leaves take x = r - c, c [T] per row,
    and each element adds back what that takes from its models, so every pass computes the same
    distribution as on r, with log-values near 0 where the likely models are.

    A model S of r weighs exp(r . z_S), of x exp(r . z_S - |S| c): models of one size move together,
    so a slot of the circuit stores its models' log-weight in x less (its largest size) c when c > 0
    ((its smallest size) c when c < 0). An element adds ``Tilt.up`` c (``down`` c) for the sizes its
    node and children store, and sp(r_i) - sp(x_i) - c (c > 0; c < 0: sp(r_i) - sp(x_i)) for each
    implicit variable (r: [T, n] -> ``Tilted``). c = clamp(0, kmax-th largest, kmin-th largest logit)
    (the k-th largest for exactly-k; 0 where the logits already sit in the band, or a row has no
    model): past it, more (fewer) true variables win by e^|c| at every node, so the likely models of
    each slot have its stored size and stored values stay near 0. Rounding of r - c aside, exact.
    ``elements`` False: no ``gap`` (the fused passes add the element addends themselves). ``refine``
    False: no Newton steps (MAP compares values and needs no cancellation-free log Z).
    """
    T, n = r.shape
    t = prog.tilt
    c = tilt_constant(r, t.kmin, t.kmax, refine)  # [T]
    x = r - c.unsqueeze(1)
    cc = c.unsqueeze(1)
    g = torch.where(cc > 0, _tilt_term(x, cc.clamp(min=0.0)), _tilt_term(-x, (-cc).clamp(min=0.0)))
    g = torch.where(cc == 0, torch.zeros_like(g), g)  # [T, n]
    cp, cn = c.clamp(min=0.0).double(), c.clamp(max=0.0).double()
    # sum_i sp(x_i) - sp(r_i) in float64: equal logits round alike, and n alike roundings add up;
    sp = lambda z: F.softplus(z.double(), threshold=40.0)
    # x in float64, not the rounded fp32 x: a leaf far from c hardly feels that rounding (log sigma is
    # flat there), the offset would take all of it (2e-3 at logits 2e4 from c)
    offset = t.kmax * cp + t.kmin * cn + (sp(r.double() - c.double().unsqueeze(1)) - sp(r)).sum(1)  # [T]
    gap = None
    if elements and not t.uniform:
        gap = SCRATCH.get("tgap", (prog.num_rows, T), r)
        torch.mul(t.up.to(r.dtype).unsqueeze(1), c.clamp(min=0.0), out=gap)  # [R, T]
        gap.add_(t.down.to(r.dtype).unsqueeze(1) * c.clamp(max=0.0))
        gap.index_add_(0, prog.implicit_row, g.T.index_select(0, prog.implicit_var))
    return Tilted(x, gap, offset, c, g)


def _tilt_tangent(prog: Program, r: Tensor, tl: Tilted, v: Tensor) -> Tensor | None:
    """The tangent of ``tl.gap`` along v [T, n]: d g_i = (sigma(r_i) - sigma(x_i)) v_i per implicit
    variable -> [R, T] (None when the circuit is smooth)."""
    if prog.smooth:
        return None
    dg = ((torch.sigmoid(r) - torch.sigmoid(tl.x)) * v).T  # [n, T]
    out = SCRATCH.get("tdgap", (prog.num_rows, r.shape[0]), r).zero_()
    return out.index_add_(0, prog.implicit_row, dg.index_select(0, prog.implicit_var))


def _log_z(up: Upward, tl: Tilted) -> Tensor:
    """log Z [T] of r from the root's value in x: the two added in float64."""
    return (up.val[-1].double() + tl.offset).to(up.val.dtype)


def accurate_log_z(prog: Program, r: Tensor) -> Tensor:
    """log Z [T] of r [T, n] (already shifted) with the tilt and the upward pass in float64, returned
    in r's dtype. A float32 pass rounds every stored value, and on rows whose values repeat (equal
    logits) the roundings go the same way through the circuit's levels: log Z off by up to about
    1e-5 where it is about 1 (range 4..32 of 256), against the last bit here."""
    tl = tilt(prog, r.double())
    return _log_z(upward(prog, tl.x, gap=tl.gap), tl).clamp(max=0.0).to(r.dtype)  # a log-probability


def _gather_elements(val: Tensor, g: Group, out: Tensor, tmp: Tensor) -> Tensor:
    """out[rows] = val[prime] + val[sub]: [S, T] -> [nodes, fanin, T] (a view of ``out``)."""
    e = out[g.rows]
    torch.index_select(val, 0, g.prime, out=e)
    t = tmp[: e.shape[0]]
    torch.index_select(val, 0, g.sub, out=t)
    e.add_(t)
    return e.view(g.nodes, g.fanin, -1)


def upward(
    prog: Program,
    r: Tensor,
    *,
    mode: str = "sum",
    gap: Tensor | None = None,
    v: Tensor | None = None,
    dgap: Tensor | None = None,
) -> Upward:
    """Every node's log-value: logsumexp ("sum") or max ("max") over its elements.

    r: [T, n] the leaves' logits (the tilted ones x of ``tilt`` in the sum passes). gap: optional
    [R, T] addend per element row (the tilt's, or MAP's implicit variables). v: optional [T, n]
    direction ("sum" mode): also carry the tangents d val = (d val / d r) v, group by group while
    the group's weights are in cache (d node = E_w[d e]); dgap [R, T]: the tangent of ``gap``.
    """
    val = log_sigmoid_leaves(prog, r)
    T = r.shape[0]
    ex = SCRATCH.get("ex", (prog.num_rows, T), r)
    tmp = SCRATCH.get("tmp", (prog.max_rows, T), r)
    norm = SCRATCH.get("norm", (prog.num_slots, T), r) if mode == "sum" else None
    dval = de_all = None
    if v is not None:
        dval, dpos, dneg = _leaf_buffer(prog, T, r, "dval")  # d log sigma(+-r) = (1 - p) v, -p v
        dval[FALSE_SLOT] = 0.0
        vt = v.T.contiguous()  # [n, T]
        torch.sigmoid(r.T, out=dneg).mul_(vt)
        torch.sub(vt, dneg, out=dpos)
        dneg.neg_()
        de_all = SCRATCH.get("de", (prog.num_rows, T), r)
    lowest, tiny = torch.finfo(r.dtype).min, torch.finfo(r.dtype).tiny
    for g in prog.groups:
        e = _gather_elements(val, g, ex, tmp)  # [nodes, F, T]
        if gap is not None:
            e.add_(gap[g.rows].view(g.nodes, g.fanin, T))
        de = None if v is None else _gather_elements(dval, g, de_all, tmp)
        if de is not None and dgap is not None:
            de.add_(dgap[g.rows].view(g.nodes, g.fanin, T))
        if g.fanin == 1:  # a product: value e, element weight 1 (a dead node gets no flow from its parents)
            val[g.slots] = e.view(g.nodes, T)
            if de is not None:
                dval[g.slots] = de.view(g.nodes, T)
            continue
        top = e.amax(dim=1)  # [nodes, F, T] -> [nodes, T]
        if mode == "max":
            val[g.slots] = top
            continue
        top.clamp_(min=lowest)  # a dead node (all -inf) keeps exp(e - top) = 0, not NaN
        e.sub_(top.unsqueeze(1)).exp_()
        s = torch.sum(e, dim=1, out=norm[g.slots])  # [nodes, T]; 0 exactly when the node is dead
        torch.log(s, out=val[g.slots]).add_(top)
        s.clamp_(min=tiny)  # dead nodes get no flow: 0 / tiny = 0
        if de is not None:
            w = tmp[: g.nodes * g.fanin].view(g.nodes, g.fanin, T)
            torch.mul(e, de, out=w)
            torch.sum(w, dim=1, out=dval[g.slots]).div_(s)  # E_w[de]: [nodes, T]
    return Upward(val, ex, norm, dval, de_all)


def downward(prog: Program, up: Upward) -> Tensor:
    """Flows g[s] = d log Z / d val[s] for every slot, top-down: -> [S, T]."""
    g = SCRATCH.get("g", up.val.shape, up.val).zero_()
    g[prog.num_slots - 1] = 1.0
    tmp = SCRATCH.get("tmp", (prog.max_rows, up.val.shape[1]), up.val)
    for grp in reversed(prog.groups):
        flow = tmp[: grp.nodes * grp.fanin]
        if grp.fanin == 1:  # weight 1, norm 1: the flow passes through
            flow.copy_(g[grp.slots])
        else:
            coef = g[grp.slots] / up.norm[grp.slots]  # [nodes, T]
            torch.mul(
                up.ex[grp.rows].view(grp.nodes, grp.fanin, -1),
                coef.unsqueeze(1),
                out=flow.view(grp.nodes, grp.fanin, -1),
            )
        g.index_add_(0, grp.prime, flow)
        g.index_add_(0, grp.sub, flow)
    return g


def marginals_from_flows(prog: Program, g: Tensor, p: Tensor) -> Tensor:
    """P(x_i = 1 | C) = flow(x_i) + p_i * P(x_i implicit): flows [S, T], p [T, n] -> [T, n]."""
    n = prog.n
    gp = g[2 : 2 + n].T
    if prog.smooth:
        return gp.clone(memory_format=torch.contiguous_format)
    gn = g[2 + n : 2 + 2 * n].T
    return gp + p * (1.0 - gp - gn)


def marginals_jvp(prog: Program, r: Tensor, v: Tensor) -> Tensor:
    """Cov(z) v = (dm/dr) v, by forward-mode tangents through the upward and downward passes.

    r, v: [T, n] -> [T, n]. Recomputes the passes; keeps nothing beyond this call. The flows g
    and their tangents dg travel together as G [S, 2, T], so each group moves both in one op.
    """
    n, T = prog.n, r.shape[0]
    tl = tilt(prog, r)
    up = upward(prog, tl.x, v=v, gap=tl.gap, dgap=None if tl.gap is None else _tilt_tangent(prog, r, tl, v))
    G = SCRATCH.get("G", (prog.num_slots, 2, T), r).zero_()
    G[prog.num_slots - 1, 0] = 1.0
    pair = SCRATCH.get("pair", (prog.max_rows, 2, T), r)
    for grp in reversed(prog.groups):
        sl, nodes, fanin = grp.slots, grp.nodes, grp.fanin
        flow = pair[: nodes * fanin]  # [rows, 2, T]
        if fanin == 1:  # weight 1, norm 1, d e = d node: both flows pass through
            flow.copy_(G[sl])
        else:
            coef = G[sl] / up.norm[sl].unsqueeze(1)  # (g, dg) / norm: [nodes, 2, T]
            f = flow.view(nodes, fanin, 2, T)
            # flow = ex * coef;  d flow = ex * (dcoef + coef * (de - dnode))
            f[:, :, 0] = coef[:, :1]
            df = torch.sub(up.de[grp.rows].view(nodes, fanin, T), up.dval[sl].unsqueeze(1), out=f[:, :, 1])
            df.mul_(coef[:, :1]).add_(coef[:, 1:])
            f.mul_(up.ex[grp.rows].view(nodes, fanin, 1, T))
        G.index_add_(0, grp.prime, flow)
        G.index_add_(0, grp.sub, flow)
    g, dg = G[:, 0], G[:, 1]
    dgp = dg[2 : 2 + n].T
    if prog.smooth:
        return dgp.clone(memory_format=torch.contiguous_format)
    p = torch.sigmoid(r)
    gp, gneg, dgneg = g[2 : 2 + n].T, g[2 + n : 2 + 2 * n].T, dg[2 + n : 2 + 2 * n].T
    return dgp + p * (1.0 - p) * v * (1.0 - gp - gneg) - p * (dgp + dgneg)


def _descend(prog: Program, up: Upward, pick) -> Tensor:
    """Top-down selection, a downward pass whose flows are 0/1.

    ``pick(group, a)`` -> [nodes, F, T] flows: 1 at the chosen element of each node whose
    activity ``a`` [nodes, T] is 1, else 0. An active node passes its activity to the prime and
    sub of its chosen element. Returns the activity of every slot, [S, T] (> 0 where active).
    """
    act = SCRATCH.get("act", up.val.shape, up.val).zero_()
    act[prog.num_slots - 1] = 1.0
    for grp in reversed(prog.groups):
        a = act[grp.slots]  # [nodes, T]
        flow = a.clone() if grp.fanin == 1 else pick(grp, a)  # a copy: index_add_ may not read what it writes
        flow = flow.view(grp.nodes * grp.fanin, -1)
        act.index_add_(0, grp.prime, flow)
        act.index_add_(0, grp.sub, flow)
    return act


def _assignment(prog: Program, act: Tensor, fill: Tensor | None) -> Tensor:
    """Variables from the active literals; implicit ones from ``fill`` ([T, n]) -> [T, n] in {0, 1}."""
    n = prog.n
    on = act[2 : 2 + n].T > 0
    if fill is None:
        return on.to(act.dtype)
    off = act[2 + n : 2 + 2 * n].T > 0
    return torch.where(on, 1.0, torch.where(off, 0.0, fill)).to(act.dtype)


def sample(prog: Program, r: Tensor, up: Upward, uniforms: Tensor, fill: Tensor | None) -> Tensor:
    """Exact ancestral sampling: each active node picks one element with probability exp(e - node).

    Inverse CDF over the fan-in with the uniforms of ``program.draw_uniforms``. r: [T, n], up: a "sum"
    pass -> [T, n]. Exact: the nodes a token reaches draw from distinct uniforms, so their choices
    are independent given the pass; an implicit variable is 1 when its fill uniform < sigmoid(r).
    """
    T = r.shape[0]
    tmp = SCRATCH.get("tmp", (prog.max_rows, T), r)
    cums = SCRATCH.get("cum", (prog.max_rows, T), r)
    ids, _ = prog.scope_ids

    def pick(grp: Group, a: Tensor) -> Tensor:
        ex = up.ex[grp.rows].view(grp.nodes, grp.fanin, T)
        cum = cums[: grp.nodes * grp.fanin].view(grp.nodes, grp.fanin, T)  # non-decreasing in F
        cum[:, 0] = ex[:, 0]
        for e in range(1, grp.fanin):  # F small adds beat cumsum over a middle dimension
            torch.add(cum[:, e - 1], ex[:, e], out=cum[:, e])
        u = uniforms.index_select(0, ids[grp.start]).unsqueeze(1)  # [nodes, 1, T]
        # A live node's largest weight is exp(0) = 1, so its total is >= 1 and u * total < total
        # exactly (u <= 1 - 2^-24 in fp32, 1 - 2^-53 in fp64): the first element with cum > x
        # exists and has weight > 0. Inactive nodes (a = 0, dead ones among them) get x = inf or
        # NaN, which no cum exceeds: no flow.
        x = u.mul_(cum[:, -1:]).div_(a.unsqueeze(1))
        passed = tmp[: grp.nodes * grp.fanin].view(grp.nodes, grp.fanin, T)
        torch.gt(cum, x, out=passed)  # [cum_e > x] as floats, monotone in e
        flow = cum  # the first passed element: passed_e - passed_{e-1}
        flow[:, 0] = passed[:, 0]
        torch.sub(passed[:, 1:], passed[:, :-1], out=flow[:, 1:])
        return flow

    act = _descend(prog, up, pick)
    return _assignment(prog, act, None if fill is None else (fill < torch.sigmoid(r)).to(r.dtype))


def max_terms(x: Tensor, c: Tensor) -> Tensor:
    """What an implicit variable adds to its element in the tilted max-product pass: max(r, 0) less
    sp(x) and (c > 0) c, = max(x, -c) - sp(x) + min(c, 0), written without cancellation
    (log sigma(|x|) at c = 0: log max(p, 1 - p)). x [T, n], c [T] -> [T, n]."""
    cc = c.unsqueeze(1)
    a = torch.maximum(x, -cc)
    pos = (a - x) - F.softplus(-x)  # x >= 0: sp(x) = x + sp(-x)
    return torch.where(x >= 0, pos, a - F.softplus(x)) + cc.clamp(max=0.0)


def max_upward(prog: Program, r: Tensor) -> Upward:
    """The max-product upward pass, tilted (``tilt``, without its Newton steps) where the tilt moves
    elements: r [T, n] -> node log-values of the best completions in x, but the root's: the best
    log-value for r (the tilt's offset added). Exactly-k (the tilt moves no element) is not tilted:
    its caller's shift already centres it, and the MAP pass has no other work to hide a tilt in.

    An implicit variable contributes its best value (``max_terms``) to its element.
    """
    if prog.tilt.uniform:
        return upward(prog, r, mode="max")
    tl = tilt(prog, r, elements=False, refine=False)
    c = tl.c
    gap = SCRATCH.get("gap", (prog.num_rows, r.shape[0]), r)
    torch.mul(prog.tilt.up.to(r.dtype).unsqueeze(1), c.clamp(min=0.0), out=gap)  # [R, T]
    gap.add_(prog.tilt.down.to(r.dtype).unsqueeze(1) * c.clamp(max=0.0))
    gap.index_add_(0, prog.implicit_row, max_terms(tl.x, c).T.index_select(0, prog.implicit_var))
    up = upward(prog, tl.x, mode="max", gap=gap)
    up.val[-1] = _log_z(up, tl)
    return up


def map_assignment(prog: Program, r: Tensor, up: Upward) -> Tensor:
    """Most probable satisfying assignment: argmax down a ``max_upward`` pass. r: [T, n] -> [T, n].

    Implicit variables take their own argmax, r > 0.
    """
    T = r.shape[0]

    tmp = SCRATCH.get("tmp", (prog.max_rows, T), r)

    def pick(grp: Group, a: Tensor) -> Tensor:
        best = up.ex[grp.rows].view(grp.nodes, grp.fanin, T).max(dim=1, keepdim=True).indices  # the first max
        flow = tmp[: grp.nodes * grp.fanin].view(grp.nodes, grp.fanin, T)
        torch.eq(torch.arange(grp.fanin, device=r.device).view(1, -1, 1), best, out=flow)
        return flow.mul_(a.unsqueeze(1))

    act = _descend(prog, up, pick)
    return _assignment(prog, act, None if prog.smooth else (r > 0).to(r.dtype))


class TorchPasses(Passes):
    """The passes above behind the ``Passes`` interface: any device, any float dtype."""

    name = "torch"

    def log_partition(
        self, r: Tensor, marginals: bool, shift: Tensor | None = None, *, accurate: bool = True, refine: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        if marginals and refine and self.program.float64_rows and r.dtype == torch.float32:
            log_z, m = self.log_partition(shifted(r, shift, torch.float64), True)  # every row is on logarithms here
            return log_z.float(), m.float()
        r = shifted(r, shift)
        again = accurate and r.dtype != torch.float64  # log Z from a float64 pass (accurate_log_z)
        if again and not marginals:
            return accurate_log_z(self.program, r), None
        tl = tilt(self.program, r)
        up = upward(self.program, tl.x, gap=tl.gap)
        m = marginals_from_flows(self.program, downward(self.program, up), torch.sigmoid(r)) if marginals else None
        return accurate_log_z(self.program, r) if again else _log_z(up, tl), m

    def sample(
        self, r: Tensor, uniforms: Tensor, fill: Tensor | None, shift: Tensor | None = None, log_z: bool = True
    ) -> tuple[Tensor, Tensor]:
        r = shifted(r, shift)
        tl = tilt(self.program, r)
        up = upward(self.program, tl.x, gap=tl.gap)
        return sample(self.program, r, up, uniforms, fill), _log_z(up, tl)

    def map(self, r: Tensor, shift: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r = shifted(r, shift)
        up = max_upward(self.program, r)
        return map_assignment(self.program, r, up), up.val[-1].clone()

    def marginals_jvp(self, r: Tensor, v: Tensor, shift: Tensor | None = None) -> Tensor:
        return marginals_jvp(self.program, shifted(r, shift), v)
