"""The batched passes over a level layout: plain tensor operations, a handful per group.

Buffers are [slots, T] (one row per slot, tokens contiguous), so gathering children is a row
``index_select``; element buffers are [rows, T], one row per (padded) element. Leaves hold the
normalised log-weights log sigma(r) (x_i) and log sigma(-r) (not x_i); with these an SDD needs no
smoothing for sums (see ``circuits.layout``). Big intermediates are written into buffers
allocated once per call: fresh allocations of this size cost as much as the arithmetic.

Each pass has a plain-torch reference in ``circuits.reference`` that the tests compare it to.
No pass synchronises with the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .layout import FALSE_SLOT, TRUE_SLOT, Layout
from .workspace import Workspace

WORKSPACE = Workspace()




@dataclass
class Group:
    """One group of the layout as device tensors."""

    start: int  # first slot
    nodes: int
    fanin: int
    prime: Tensor  # long [nodes * fanin]
    sub: Tensor  # long [nodes * fanin]
    rows: slice  # this group's element rows
    first: Tensor  # long [nodes, 1]: the row of each node's first element

    @property
    def slots(self) -> slice:
        return slice(self.start, self.start + self.nodes)


@dataclass
class Program:
    """A layout on one device: what the passes iterate over."""

    n: int
    num_slots: int
    num_rows: int
    groups: list[Group]
    levels: list[tuple[slice, list[Group]]]  # per height: its slots (contiguous) and groups
    prime: Tensor  # long [R], all element rows
    sub: Tensor  # long [R]
    implicit_row: Tensor  # long [P]
    implicit_var: Tensor  # long [P]

    @property
    def smooth(self) -> bool:
        return self.implicit_row.numel() == 0

    @property
    def max_rows(self) -> int:
        return max(g.nodes * g.fanin for g in self.groups)

    @staticmethod
    def from_layout(layout: Layout, device: torch.device | str = "cpu") -> "Program":
        ch = torch.as_tensor(layout.children, dtype=torch.long, device=device)
        groups, levels = [], []
        for start, nodes, fanin, off, height in layout.groups.tolist():
            rows = slice(off, off + nodes * fanin)
            first = (off + torch.arange(nodes, device=device) * fanin).view(nodes, 1)
            grp = Group(start, nodes, fanin, ch[rows, 0].contiguous(), ch[rows, 1].contiguous(), rows, first)
            groups.append(grp)
            if levels and levels[-1][0] == height:
                levels[-1][1].append(grp)
            else:
                levels.append((height, [grp]))
        levels = [(slice(gs[0].start, gs[-1].start + gs[-1].nodes), gs) for _, gs in levels]
        imp = torch.as_tensor(layout.implicit, dtype=torch.long, device=device)
        return Program(layout.n, layout.num_slots, len(ch), groups, levels, ch[:, 0].contiguous(),
                       ch[:, 1].contiguous(), imp[:, 0].contiguous(), imp[:, 1].contiguous())


@dataclass
class Upward:
    """An upward pass: slot log-values, and per element row either exp(e - node max) ("sum")
    or the element log-value ("max"); ``norm`` holds each node's sum of ``ex`` (at least the
    smallest normal float, so dividing a dead node's zero flow by it gives 0)."""

    val: Tensor  # [S, T] log values
    ex: Tensor  # [R, T]
    norm: Tensor | None  # [S, T]; rows of decision slots are set ("sum" mode only)


def leaves(prog: Program, pos: Tensor, neg: Tensor, name: str) -> Tensor:
    """An [S, T] workspace buffer with FALSE = -inf, TRUE = 0 and the literal rows from pos, neg [T, n]."""
    T, n = pos.shape
    buf = WORKSPACE.get(name, (prog.num_slots, T), pos)
    buf[FALSE_SLOT] = -torch.inf
    buf[TRUE_SLOT] = 0.0
    buf[2 : 2 + n] = pos.T
    buf[2 + n : 2 + 2 * n] = neg.T
    return buf


def _gather_elements(val: Tensor, g: Group, out: Tensor, tmp: Tensor) -> Tensor:
    """out[rows] = val[prime] + val[sub]: [S, T] -> [nodes, fanin, T] (a view of ``out``)."""
    e = out[g.rows]
    torch.index_select(val, 0, g.prime, out=e)
    t = tmp[: e.shape[0]]
    torch.index_select(val, 0, g.sub, out=t)
    e.add_(t)
    return e.view(g.nodes, g.fanin, -1)


def log_sigmoids(r: Tensor) -> tuple[Tensor, Tensor]:
    """(log sigma(r), log sigma(-r)) for r in [-inf, inf): [T, n] -> 2 x [T, n]; cheaper than two logsigmoid calls."""
    soft = torch.exp(-r.abs()).log1p_()  # log(1 + e^-|r|)
    return r.clamp(max=0.0).sub_(soft), r.neg().clamp_(max=0.0).sub_(soft)


def upward(prog: Program, r: Tensor, *, mode: str = "sum", gap: Tensor | None = None) -> Upward:
    """Every node's log-value: logsumexp ("sum") or max ("max") over its elements.

    r: [T, n] logits. gap: optional [R, T] addend per element row (MAP's implicit variables).
    """
    val = leaves(prog, *log_sigmoids(r), "val")
    T = r.shape[0]
    ex = WORKSPACE.get("ex", (prog.num_rows, T), r)
    tmp = WORKSPACE.get("tmp", (prog.max_rows, T), r)
    norm = WORKSPACE.get("norm", (prog.num_slots, T), r) if mode == "sum" else None
    lowest, tiny = torch.finfo(r.dtype).min, torch.finfo(r.dtype).tiny
    for g in prog.groups:
        e = _gather_elements(val, g, ex, tmp)  # [nodes, F, T]
        if gap is not None:
            e.add_(gap[g.rows].view(g.nodes, g.fanin, T))
        top = e.amax(dim=1)  # [nodes, F, T] -> [nodes, T]
        if mode == "max":
            val[g.slots] = top
            continue
        top.clamp_(min=lowest)  # a dead node (all -inf) keeps exp(e - top) = 0, not NaN
        e.sub_(top.unsqueeze(1)).exp_()
        s = e.sum(dim=1)  # [nodes, T]; 0 exactly when the node is dead
        val[g.slots] = s.log().add_(top)
        norm[g.slots] = s.clamp_(min=tiny)  # dead nodes get no flow: 0 / tiny = 0
    return Upward(val, ex, norm)


def downward(prog: Program, up: Upward) -> Tensor:
    """Flows g[s] = d log Z / d val[s] for every slot, top-down: -> [S, T]."""
    g = WORKSPACE.get("g", up.val.shape, up.val).zero_()
    g[prog.num_slots - 1] = 1.0
    tmp = WORKSPACE.get("tmp", (prog.max_rows, up.val.shape[1]), up.val)
    for grp in reversed(prog.groups):
        coef = g[grp.slots] / up.norm[grp.slots]  # [nodes, T]
        flow = tmp[: grp.nodes * grp.fanin]
        torch.mul(up.ex[grp.rows].view(grp.nodes, grp.fanin, -1), coef.unsqueeze(1), out=flow.view(grp.nodes, grp.fanin, -1))
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

    r, v: [T, n] -> [T, n]. Recomputes the passes; keeps nothing beyond this call.
    """
    n, T = prog.n, r.shape[0]
    p = torch.sigmoid(r)
    up = upward(prog, r)
    dval = leaves(prog, (1.0 - p) * v, -p * v, "dval")
    dval[FALSE_SLOT] = 0.0
    de_all = WORKSPACE.get("de", (prog.num_rows, T), r)
    tmp = WORKSPACE.get("tmp", (prog.max_rows, T), r)
    for grp in prog.groups:
        de = _gather_elements(dval, grp, de_all, tmp)  # [nodes, F, T]
        w = tmp[: grp.nodes * grp.fanin].view(grp.nodes, grp.fanin, T)
        torch.mul(up.ex[grp.rows].view(grp.nodes, grp.fanin, T), de, out=w)
        dval[grp.slots] = w.sum(dim=1).div_(up.norm[grp.slots])  # E_w[de]: [nodes, T]
    g = WORKSPACE.get("g", up.val.shape, r).zero_()
    dg = WORKSPACE.get("dg", up.val.shape, r).zero_()
    g[prog.num_slots - 1] = 1.0
    for grp in reversed(prog.groups):
        sl, rows = grp.slots, grp.rows
        coef = (g[sl] / up.norm[sl]).unsqueeze(1)  # [nodes, 1, T]
        dcoef = (dg[sl] / up.norm[sl]).unsqueeze(1)
        ex = up.ex[rows].view(grp.nodes, grp.fanin, T)
        flow = tmp[: grp.nodes * grp.fanin]
        torch.mul(ex, coef, out=flow.view(grp.nodes, grp.fanin, T))
        g.index_add_(0, grp.prime, flow)
        g.index_add_(0, grp.sub, flow)
        # d flow = ex * (dcoef + coef * (de - dnode)), written over de
        de = de_all[rows].view(grp.nodes, grp.fanin, T)
        de.sub_(dval[sl].unsqueeze(1)).mul_(coef).add_(dcoef).mul_(ex)
        g_d = de_all[rows]
        dg.index_add_(0, grp.prime, g_d)
        dg.index_add_(0, grp.sub, g_d)
    dgp = dg[2 : 2 + n].T
    if prog.smooth:
        return dgp.clone(memory_format=torch.contiguous_format)
    gp, gneg, dgneg = g[2 : 2 + n].T, g[2 + n : 2 + 2 * n].T, dg[2 + n : 2 + 2 * n].T
    return dgp + p * (1.0 - p) * v * (1.0 - gp - gneg) - p * (dgp + dgneg)


def _descend(prog: Program, up: Upward, onehot) -> Tensor:
    """Top-down selection, a downward pass whose flows are 0/1.

    ``onehot(group)`` -> bool [nodes, F, T], True at each node's chosen element. An active
    node's activity flows to the prime and sub of its chosen element. Returns the activity of
    every slot, [S, T] (> 0 where active).
    """
    T = up.val.shape[1]
    act = WORKSPACE.get("act", up.val.shape, up.val).zero_()
    act[prog.num_slots - 1] = 1.0
    tmp = WORKSPACE.get("tmp", (prog.max_rows, T), up.val)
    for grp in reversed(prog.groups):
        a = act[grp.slots]  # [nodes, T]
        flow = tmp[: grp.nodes * grp.fanin]
        if grp.fanin == 1:
            flow.copy_(a)  # index_add_ may not read the buffer it writes
        else:
            torch.mul(onehot(grp), a.unsqueeze(1), out=flow.view(grp.nodes, grp.fanin, T))
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


def sample(prog: Program, r: Tensor, up: Upward, generator: torch.Generator | None = None) -> Tensor:
    """Exact ancestral sampling: each active node picks one element with probability exp(e - node).

    Inverse CDF over the fan-in, one uniform per node and token. r: [T, n], up: a "sum" pass -> [T, n].
    Exact: the choices of the nodes a token reaches are independent given the pass.
    """
    T = r.shape[0]

    def onehot(grp: Group) -> Tensor:
        ex = up.ex[grp.rows].view(grp.nodes, grp.fanin, T)
        cum = ex.cumsum(dim=1)  # [nodes, F, T]
        total = cum[:, -1:]
        u = torch.rand(grp.nodes, 1, T, generator=generator, device=r.device, dtype=r.dtype)
        # x < total strictly (u * total may round up to it), so the first cum > x has weight > 0
        x = torch.minimum(u.mul_(total), torch.nextafter(total, torch.zeros_like(total)))
        passed = cum > x  # monotone in F: the choice is its first True
        first = passed.clone()
        first[:, 1:] ^= passed[:, :-1]
        return first

    act = _descend(prog, up, onehot)
    fill = None
    if not prog.smooth:
        u = torch.rand(r.shape, generator=generator, device=r.device, dtype=r.dtype)
        fill = (u < torch.sigmoid(r)).to(r.dtype)
    return _assignment(prog, act, fill)


def max_upward(prog: Program, r: Tensor) -> Upward:
    """The max-product upward pass: r [T, n] -> node log-values of the best completions.

    An implicit variable contributes max(p, 1 - p) (log: logsigmoid(|r|)) to its element.
    """
    gap = None
    if not prog.smooth:
        h = F.logsigmoid(r.abs()).T  # [n, T]
        gap = WORKSPACE.get("gap", (prog.num_rows, r.shape[0]), r).zero_()
        gap.index_add_(0, prog.implicit_row, h.index_select(0, prog.implicit_var))
    return upward(prog, r, mode="max", gap=gap)


def map_assignment(prog: Program, r: Tensor, up: Upward) -> Tensor:
    """Most probable satisfying assignment: argmax down a ``max_upward`` pass. r: [T, n] -> [T, n].

    Implicit variables take their own argmax, r > 0.
    """
    T = r.shape[0]

    def onehot(grp: Group) -> Tensor:
        choice = up.ex[grp.rows].view(grp.nodes, grp.fanin, T).max(dim=1, keepdim=True).indices  # first max
        return torch.arange(grp.fanin, device=r.device).view(1, -1, 1) == choice

    act = _descend(prog, up, onehot)
    return _assignment(prog, act, None if prog.smooth else (r > 0).to(r.dtype))
