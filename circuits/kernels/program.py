"""``Program``: a level layout as device tensors, what every implementation of the passes reads,
and ``draw_uniforms``, the random numbers one exact draw consumes (the same for every
implementation, so the same generator gives the same draws on each)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..layout import FALSE_SLOT, Layout
from .rows import REFERENCES, RowOps
from .uniforms import as_seed


@dataclass
class Group:
    """One group of the layout as device tensors."""

    start: int  # first slot
    nodes: int
    fanin: int
    prime: Tensor  # long [nodes * fanin]
    sub: Tensor  # long [nodes * fanin]
    rows: slice  # this group's element rows

    @property
    def slots(self) -> slice:
        return slice(self.start, self.start + self.nodes)


@dataclass(frozen=True)
class Tilt:
    """Model sizes for the tilted passes (``torch_passes.tilt``): ``kmin``, ``kmax`` the fewest and most
    true variables of a model; per element row, ``up`` = (most true variables of the element's models,
    its implicit variables counted true) less the most of its node's (<= 0), ``down`` = (fewest of the
    element's, implicit counted false) less the fewest of its node's (>= 0), both float64 [R] (0 on
    padding rows); ``uniform``: every element row has 0 in both and the circuit is smooth (every node's
    models have one size: exactly-k), so the tilt moves no element."""

    kmin: int
    kmax: int
    up: Tensor
    down: Tensor
    uniform: bool


@dataclass
class Program:
    """A layout on one device: what the passes iterate over."""

    n: int
    num_slots: int
    num_rows: int
    groups: list[Group]
    prime: Tensor  # long [R], all element rows
    sub: Tensor  # long [R]
    implicit_row: Tensor  # long [P]
    implicit_var: Tensor  # long [P]
    #: Whether the passes recompute in float64 the float32 marginals that a float32 pass on logarithms
    #: cannot hold (``Passes.log_partition``'s ``refine``). A cardinality constraint does not need it:
    #: its likely subsets differ by single logits, which float32 keeps exact after the exactly-k shift
    #: and the tilt. In other circuits (groups, CNF, any SDD) two likely assignments can differ by whole
    #: sums of logits, which a float32 pass on logarithms rounds at the magnitude of the sums
    #: (GroupLimited(256, groups of 32, at most 4) at logits 1e4 + N(0, 3^2): 1.8e-5; two-level rows
    #: 31.9 apart: 1.6e-4). ``Circuit`` sets it from its spec (a layout alone: True).
    float64_rows: bool = True
    #: k for an exactly-k circuit, whose passes take logits shifted by each row's k-th largest
    #: (``Circuit._shift``), else 0: the shift the fused queries make themselves (``Kernels.chosen``).
    #: ``Circuit`` sets it from its spec.
    shift_k: int = 0

    @property
    def device(self) -> torch.device:
        return self.prime.device

    @property
    def smooth(self) -> bool:
        return self.implicit_row.numel() == 0

    @property
    def max_rows(self) -> int:
        return max(g.nodes * g.fanin for g in self.groups)

    @functools.cached_property
    def scope_ids(self) -> tuple[dict[int, Tensor], int]:
        """({group's first slot: long [nodes]}, count): an id per distinct variable set (vtree node).

        A node's variables are those of its prime, its sub and its implicit ones, the same for
        every element. The nodes one token's sampled choices pass through have distinct sets
        (a child's set lies strictly inside its parent's, siblings' sets are disjoint), so
        they may share one uniform per id. Computed on first use: one walk over the elements.
        """
        prime, sub = self.prime.tolist(), self.sub.tolist()
        extra: dict[int, int] = {}
        for row, var in zip(self.implicit_row.tolist(), self.implicit_var.tolist()):
            extra[row] = extra.get(row, 0) | (1 << var)
        scope = [0] * self.num_slots  # bit sets
        for i in range(self.n):
            scope[2 + i] = scope[2 + self.n + i] = 1 << i
        ids: dict[int, int] = {}
        out = {}
        for g in self.groups:
            mine = []
            for j in range(g.nodes):
                row = g.rows.start + j * g.fanin  # the first element is never padding
                scope[g.start + j] = scope[prime[row]] | scope[sub[row]] | extra.get(row, 0)
                mine.append(ids.setdefault(scope[g.start + j], len(ids)))
            out[g.start] = torch.tensor(mine, dtype=torch.long, device=self.prime.device)
        return out, len(ids)

    @functools.cached_property
    def tilt(self) -> Tilt:
        """The model sizes the tilted passes need (``Tilt``). Computed on first use: one walk over
        the elements, bottom-up."""
        prime, sub = self.prime.cpu().numpy(), self.sub.cpu().numpy()
        extra = np.bincount(self.implicit_row.cpu().numpy(), minlength=self.num_rows)  # [R]
        lo = np.zeros(self.num_slots, dtype=np.int64)  # [S]: fewest / most true variables of a slot's models
        hi = np.zeros(self.num_slots, dtype=np.int64)
        lo[2 : 2 + self.n] = hi[2 : 2 + self.n] = 1
        up = np.zeros(self.num_rows, dtype=np.int64)
        down = np.zeros(self.num_rows, dtype=np.int64)
        for g in self.groups:
            rows = np.arange(g.rows.start, g.rows.stop)
            live = (prime[rows] != FALSE_SLOT).reshape(g.nodes, g.fanin)
            e_lo = (lo[prime[rows]] + lo[sub[rows]]).reshape(g.nodes, g.fanin)
            e_hi = (hi[prime[rows]] + hi[sub[rows]] + extra[rows]).reshape(g.nodes, g.fanin)
            n_lo = np.where(live, e_lo, np.iinfo(np.int64).max).min(axis=1)  # [nodes]
            n_hi = np.where(live, e_hi, -1).max(axis=1)
            lo[g.slots], hi[g.slots] = n_lo, n_hi
            up[rows] = np.where(live, e_hi - n_hi[:, None], 0).ravel()
            down[rows] = np.where(live, e_lo - n_lo[:, None], 0).ravel()
        dev = self.prime.device
        return Tilt(
            int(lo[-1]),
            int(hi[-1]),
            torch.as_tensor(up, dtype=torch.float64, device=dev),
            torch.as_tensor(down, dtype=torch.float64, device=dev),
            bool(not up.any() and not down.any() and self.smooth),
        )

    @staticmethod
    def from_layout(layout: Layout, device: torch.device | str = "cpu") -> Program:
        ch = torch.as_tensor(layout.children, dtype=torch.long, device=device)
        groups = []
        for start, nodes, fanin, off, _ in layout.groups.tolist():
            rows = slice(off, off + nodes * fanin)
            groups.append(Group(start, nodes, fanin, ch[rows, 0].contiguous(), ch[rows, 1].contiguous(), rows))
        imp = torch.as_tensor(layout.implicit, dtype=torch.long, device=device)
        return Program(
            layout.n,
            layout.num_slots,
            len(ch),
            groups,
            ch[:, 0].contiguous(),
            ch[:, 1].contiguous(),
            imp[:, 0].contiguous(),
            imp[:, 1].contiguous(),
        )


def draw_uniforms(
    prog: Program, r: Tensor, seed: Tensor | torch.Generator | None = None, rows: RowOps = REFERENCES
) -> tuple[Tensor, Tensor | None]:
    """The uniforms one draw per token uses, in this order: [count, T], one per vtree node and token
    (``Program.scope_ids``), then [T, n] for the implicit variables (None for a smooth circuit); all
    from one seed (``circuits.kernels.uniforms``): a 0-dim int64 tensor, or a generator (None: the
    default one) to draw it from. ``rows``: the row operations that make them (``select`` gives the
    kernels theirs; the reference otherwise, the same bits)."""
    _, count = prog.scope_ids
    T, n = r.shape
    fill = 0 if prog.smooth else T * n
    u = rows.uniforms(as_seed(seed, r.device), count * T + fill, r.device, r.dtype)
    return u[: count * T].view(count, T), None if prog.smooth else u[count * T :].view(T, n)
