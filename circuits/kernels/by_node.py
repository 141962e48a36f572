"""The definition of the passes, node by node in Python: the oracle ``TorchPasses`` is tested against.

It walks the layout node by node in Python, exactly as the definitions read, and gets marginals
and their Jacobian from autograd. Slow, and meant only for tests on small inputs with finite
logits.

    val[x_i] = log sigma(r_i), val[not x_i] = log sigma(-r_i)
    val[node] = logsumexp over elements (prime, sub) of val[prime] + val[sub]
    log Z = val[root];  m = d log Z / d r + sigma(r)   (implicit variables: see circuits.layout)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..layout import FALSE_SLOT, TRUE_SLOT, Layout


def _node_elements(layout: Layout):
    """Yield (slot, [(row, prime, sub), ...]) for every decision node, bottom-up, padding dropped."""
    for start, nodes, fanin, off, _ in layout.groups.tolist():
        for j in range(nodes):
            rows = range(off + j * fanin, off + (j + 1) * fanin)
            yield start + j, [(r, *layout.children[r].tolist()) for r in rows if layout.children[r][0] != FALSE_SLOT]


def _leaf_values(layout: Layout, r: Tensor) -> dict[int, Tensor]:
    n = layout.n
    vals = {FALSE_SLOT: torch.full_like(r[:, 0], -torch.inf), TRUE_SLOT: torch.zeros_like(r[:, 0])}
    for i in range(n):
        vals[2 + i] = F.logsigmoid(r[:, i])
        vals[2 + n + i] = F.logsigmoid(-r[:, i])
    return vals


def log_partition(layout: Layout, r: Tensor) -> Tensor:
    """log P(constraint) under independent Bernoulli(sigmoid(r)): [T, n] -> [T]."""
    vals = _leaf_values(layout, r)
    for slot, elems in _node_elements(layout):
        vals[slot] = torch.logsumexp(torch.stack([vals[p] + vals[s] for _, p, s in elems]), dim=0)
    return vals[layout.root_slot]


def marginals(layout: Layout, r: Tensor) -> Tensor:
    """P(x_i = 1 | constraint) = d log Z / d r_i + sigma(r_i): [T, n] -> [T, n] (differentiable)."""
    r = r if r.requires_grad else r.detach().requires_grad_()
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(log_partition(layout, r).sum(), r, create_graph=True)
    return grad + torch.sigmoid(r)


def map_assignment(layout: Layout, r: Tensor) -> Tensor:
    """Max-product up, argmax down, per token: [T, n] -> [T, n] in {0, 1}."""
    n = layout.n
    implicit: dict[int, list[int]] = {}
    for row, var in layout.implicit.tolist():
        implicit.setdefault(row, []).append(var)
    out = torch.zeros_like(r)
    for t in range(r.shape[0]):
        vals = _leaf_values(layout, r[t : t + 1])
        best: dict[int, tuple[int, int, int]] = {}
        for slot, elems in _node_elements(layout):
            scores = []
            for row, p, s in elems:
                gap = sum(F.logsigmoid(r[t, v].abs()) for v in implicit.get(row, []))
                scores.append(vals[p] + vals[s] + gap)
            k = int(torch.stack(scores).argmax())
            vals[slot] = scores[k]
            best[slot] = elems[k]
        x = (r[t] > 0).to(r.dtype)  # implicit variables take their own argmax
        stack = [layout.root_slot]
        while stack:
            slot = stack.pop()
            if slot in best:
                stack.extend(best[slot][1:])
            elif 2 <= slot < 2 + n:
                x[slot - 2] = 1.0
            elif 2 + n <= slot < 2 + 2 * n:
                x[slot - 2 - n] = 0.0
        out[t] = x
    return out
