"""The batched passes over a level layout: plain tensor operations, one handful per group.

Buffers are [slots, T]: one row per slot, tokens contiguous, so gathering children is a row
``index_select``. Leaves hold the normalised log-weights log sigma(r) (x_i) and log sigma(-r)
(not x_i); with these an SDD needs no smoothing for sums (see ``circuits.layout``).

Each pass here has a plain-torch reference in ``circuits.reference`` that the tests compare it to.
No pass synchronises with the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
import torch.nn.functional as F

from .layout import FALSE_SLOT, TRUE_SLOT, Layout


@dataclass
class Group:
    """One group of the layout as device tensors."""

    start: int  # first slot
    nodes: int
    fanin: int
    prime: Tensor  # long [nodes * fanin]
    sub: Tensor  # long [nodes * fanin]
    rows: slice  # this group's element rows in the layout's children array


@dataclass
class Program:
    """A layout on one device: what the passes iterate over."""

    n: int
    num_slots: int
    groups: list[Group]
    implicit_row: Tensor  # long [P]
    implicit_var: Tensor  # long [P]
    num_rows: int

    @property
    def smooth(self) -> bool:
        return self.implicit_row.numel() == 0

    @staticmethod
    def from_layout(layout: Layout, device: torch.device | str = "cpu") -> "Program":
        ch = torch.as_tensor(layout.children, dtype=torch.long, device=device)
        groups = []
        for start, nodes, fanin, off, _ in layout.groups.tolist():
            rows = slice(off, off + nodes * fanin)
            groups.append(Group(start, nodes, fanin, ch[rows, 0].contiguous(), ch[rows, 1].contiguous(), rows))
        imp = torch.as_tensor(layout.implicit, dtype=torch.long, device=device)
        return Program(layout.n, layout.num_slots, groups, imp[:, 0].contiguous(), imp[:, 1].contiguous(), len(ch))


@dataclass
class Upward:
    """The result of an upward pass: slot values and the element values of every group."""

    val: Tensor  # [S, T]
    elems: list[Tensor]  # per group [nodes, fanin, T]


def leaves(prog: Program, r: Tensor, pos: Tensor, neg: Tensor) -> Tensor:
    """A fresh [S, T] buffer with FALSE, TRUE and the literal rows filled.

    r: [T, n] (only its dtype, device and T are used); pos, neg: [T, n] leaf values.
    """
    T, n = r.shape
    buf = r.new_empty(prog.num_slots, T)
    buf[FALSE_SLOT] = -torch.inf
    buf[TRUE_SLOT] = 0.0
    buf[2 : 2 + n] = pos.T
    buf[2 + n : 2 + 2 * n] = neg.T
    return buf


def _elements(val: Tensor, g: Group) -> Tensor:
    """Element values val[prime] + val[sub]: [S, T] -> [nodes, fanin, T]."""
    e = val.index_select(0, g.prime) + val.index_select(0, g.sub)
    return e.view(g.nodes, g.fanin, -1)


def upward(prog: Program, r: Tensor, *, gap: Tensor | None = None, mode: str = "sum") -> Upward:
    """Log-partition of every node: logsumexp (mode "sum") or max ("max") over elements.

    r: [T, n] logits. gap: optional [R, T] per-element-row addend (MAP's implicit variables).
    """
    val = leaves(prog, r, F.logsigmoid(r), F.logsigmoid(-r))
    elems = []
    for g in prog.groups:
        e = _elements(val, g)
        if gap is not None:
            e = e + gap[g.rows].view(g.nodes, g.fanin, -1)
        if mode == "sum":
            val[g.start : g.start + g.nodes] = torch.logsumexp(e, dim=1)  # [nodes, F, T] -> [nodes, T]
        else:
            val[g.start : g.start + g.nodes] = e.amax(dim=1)
        elems.append(e)
    return Upward(val, elems)


def _weights(up: Upward, g: Group, e: Tensor) -> Tensor:
    """Element probabilities given their node, exp(e - node): [nodes, fanin, T]; 0 under dead nodes."""
    node = up.val[g.start : g.start + g.nodes]
    node = torch.where(torch.isfinite(node), node, torch.zeros_like(node))
    return torch.exp(e - node.unsqueeze(1))


def downward(prog: Program, up: Upward) -> Tensor:
    """Flows g[s] = d log Z / d val[s] for every slot (top-down): -> [S, T]."""
    g = torch.zeros_like(up.val)
    g[prog.num_slots - 1] = 1.0
    for grp, e in zip(reversed(prog.groups), reversed(up.elems)):
        flow = _weights(up, grp, e) * g[grp.start : grp.start + grp.nodes].unsqueeze(1)
        flow = flow.view(-1, flow.shape[-1])  # [nodes * F, T]
        g.index_add_(0, grp.prime, flow)
        g.index_add_(0, grp.sub, flow)
    return g


def marginals_from_flows(prog: Program, g: Tensor, p: Tensor) -> Tensor:
    """P(x_i = 1 | C) = flow(x_i) + p_i * P(x_i implicit): [S, T] flows, [T, n] p -> [T, n]."""
    n = prog.n
    gp, gn = g[2 : 2 + n].T, g[2 + n : 2 + 2 * n].T
    if prog.smooth:
        return gp.clone()
    return gp + p * (1.0 - gp - gn)


def marginals_jvp(prog: Program, r: Tensor, v: Tensor) -> Tensor:
    """Cov(z) v = (d m / d r) v by forward-mode tangents through the upward and downward passes.

    r, v: [T, n] -> [T, n]. Recomputes the passes; keeps nothing beyond this call.
    """
    n = prog.n
    p = torch.sigmoid(r)
    up = upward(prog, r)
    dval = leaves(prog, r, (1.0 - p) * v, -p * v)
    dval[FALSE_SLOT] = 0.0
    weights, delems = [], []
    for grp, e in zip(prog.groups, up.elems):
        w = _weights(up, grp, e)  # [nodes, F, T]
        de = _elements(dval, grp)
        dval[grp.start : grp.start + grp.nodes] = (w * de).sum(dim=1)
        weights.append(w)
        delems.append(de)
    g = torch.zeros_like(up.val)
    dg = torch.zeros_like(up.val)
    g[prog.num_slots - 1] = 1.0
    for grp, w, de in zip(reversed(prog.groups), reversed(weights), reversed(delems)):
        sl = slice(grp.start, grp.start + grp.nodes)
        gn, dgn, dnode = g[sl].unsqueeze(1), dg[sl].unsqueeze(1), dval[sl].unsqueeze(1)
        flow = (w * gn).view(-1, gn.shape[-1])
        dflow = (w * (dgn + gn * (de - dnode))).view(-1, gn.shape[-1])
        g.index_add_(0, grp.prime, flow)
        g.index_add_(0, grp.sub, flow)
        dg.index_add_(0, grp.prime, dflow)
        dg.index_add_(0, grp.sub, dflow)
    dgp = dg[2 : 2 + n].T
    if prog.smooth:
        return dgp.clone()
    gp, gneg, dgneg = g[2 : 2 + n].T, g[2 + n : 2 + 2 * n].T, dg[2 + n : 2 + 2 * n].T
    return dgp + p * (1.0 - p) * v * (1.0 - gp - gneg) - p * (dgp + dgneg)


def _choose(prog: Program, up: Upward, pick) -> Tensor:
    """Top-down selection: ``pick(group, weights_or_elems, i)`` -> chosen element [nodes, 1, T].

    Returns the active indicator of every slot, [S, T] (> 0 where active).
    """
    act = torch.zeros_like(up.val)
    act[prog.num_slots - 1] = 1.0
    for i in reversed(range(len(prog.groups))):
        grp = prog.groups[i]
        a = act[grp.start : grp.start + grp.nodes].unsqueeze(1)  # [nodes, 1, T]
        if grp.fanin == 1:
            sel = a.clone()  # index_add_ may not read the buffer it writes
        else:
            choice = pick(grp, up.elems[i], i)
            ar = torch.arange(grp.fanin, device=a.device).view(1, -1, 1)
            sel = (ar == choice).to(a.dtype) * a  # [nodes, F, T]
        sel = sel.reshape(-1, a.shape[-1])
        act.index_add_(0, grp.prime, sel)
        act.index_add_(0, grp.sub, sel)
    return act


def _assignment(prog: Program, act: Tensor, fill: Tensor | None) -> Tensor:
    """Variables from the active literals; implicit ones from ``fill`` ([T, n]); -> [T, n] in {0, 1}."""
    n = prog.n
    on = act[2 : 2 + n].T > 0
    if fill is None:
        return on.to(act.dtype)
    off = act[2 + n : 2 + 2 * n].T > 0
    return torch.where(on, 1.0, torch.where(off, 0.0, fill)).to(act.dtype)


def sample(prog: Program, r: Tensor, up: Upward, generator: torch.Generator | None = None) -> Tensor:
    """Exact ancestral sampling: each active node picks one element with probability exp(e - node).

    Inverse-CDF over the fan-in with one uniform per node and token. r: [T, n] -> [T, n].
    """

    def pick(grp: Group, e: Tensor, i: int) -> Tensor:
        w = _weights(up, grp, e)
        cum = w.cumsum(dim=1)  # [nodes, F, T]
        u = torch.rand(grp.nodes, 1, e.shape[-1], generator=generator, device=e.device, dtype=e.dtype)
        choice = (cum <= u * cum[:, -1:]).sum(dim=1, keepdim=True)
        return torch.where(choice < grp.fanin, choice, w.argmax(dim=1, keepdim=True))

    act = _choose(prog, up, pick)
    fill = None
    if not prog.smooth:
        u = torch.rand(r.shape, generator=generator, device=r.device, dtype=r.dtype)
        fill = (u < torch.sigmoid(r)).to(r.dtype)
    return _assignment(prog, act, fill)


def map_assignment(prog: Program, r: Tensor) -> Tensor:
    """Most probable satisfying assignment by max-product up, argmax down. r: [T, n] -> [T, n].

    An implicit variable contributes max(p, 1 - p) (log: logsigmoid(|r|)) to the max-product and
    takes its own argmax r > 0.
    """
    gap = None
    if not prog.smooth:
        h = F.logsigmoid(r.abs()).T  # [n, T]
        gap = r.new_zeros(prog.num_rows, r.shape[0])
        gap.index_add_(0, prog.implicit_row, h.index_select(0, prog.implicit_var))
    up = upward(prog, r, gap=gap, mode="max")
    act = _choose(prog, up, lambda grp, e, i: e.argmax(dim=1, keepdim=True))
    return _assignment(prog, act, None if prog.smooth else (r > 0).to(r.dtype))
