"""The numerics of a fused kernel for the group DP, checked on the CPU before the kernel is written:
the two-level lattice of ``circuits.kernels.torch_groups`` in float32 "top-relative" form, against
float64 references on the accuracy grid of ``tools/accuracy_fp32.py`` and on rows whose limits force
a group far below the others to contribute.

    PYTHONPATH=$PWD python tools/group_numerics.py [--rows 64] [--quick]

Why a form of its own: the cardinality kernels keep probabilities of partial counts under one tilt
(``circuits.kernels.triton_lattice``), which works because one tilt puts every likely count near
probability 1. With groups it cannot: a capacity or a group limit may force a group whose logits sit
hundreds below the tilt to contribute, and its counts' probabilities underflow float32. Log-space
states do not underflow, but hold values of the logits' magnitude, where float32 loses 1e-3 at 1e4.

The top-relative form keeps each state relative to its best subset:

- inside a group, after its first i variables, ``Q[j] = Σ_{|A| = j} exp(x·z_A - top_j)``, top_j the
  sum of the j largest logits so far: Q[j] >= 1 where j is reachable (the best subset gives 1), 0
  where not, at most C(i, j). A step over logit x with h the j-th largest so far is
  ``Q'[j] = Q[j] exp(-max(0, x - h)) + Q[j - 1] exp(-max(0, h - x))``: two positive terms, one
  of the factors exactly 1, one exp of a difference of two logits (exact in float32 up to one
  rounding) a state, no cancellation, no underflow; the j largest so far by an insertion network.
- over the groups, ``Qo[c, u]`` relative to the best path's log-weight ``M[c, u]`` (a max-plus
  lattice of sums of logits, kept in float64, where those sums are exact):
  ``Qo'[c, u] = Σ_j Qo[c - j, u - [j > 0]] Q_g[j] exp(M[c - j, u - [j > 0]] + top_{g,j} - M'[c, u])``,
  the exponent a float64 difference <= 0 rounded once to float32.
- log Z = logsumexp over the band of log Qo + M (float64, once a token).
- the adjoints, in float32, need no logarithm: the shares of a state's sum, W = Q[j - 1] (take
  factor) / Q'[j] and 1 - W = Q[j] (skip factor) / Q'[j] (both from positive terms: no
  cancellation near 1), and each group count's share of an outer state, seed the sweeps of
  ``torch_groups`` (its ``_down``); a draw walks the same shares.

So a kernel needs float64 only for M (about (K + 1)(U + 1)(C + 1) adds and maxes a group) and the
last logsumexp; everything per variable is float32 with one exp a state. This script is that
computation in torch, vectorised over tokens (``top_relative``), and the table of its worst errors.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accuracy_fp32 as acc

NEG = -1e30  # a -inf logit in float32: never taken (its take factor underflows to 0)
MARGINAL_BOUND, LOG_Z_BOUND = 1e-6, 1e-6  # issue 45's accuracy goals


def _inner(x: Tensor, C: int) -> tuple[list[Tensor], list[Tensor], list[Tensor], Tensor]:
    """The groups' top-relative lattices for x [T, G, S] float32 (NEG for -inf and padding): (rows
    Q_0..Q_S [T, G, C + 1], the take and skip factors of each step [T, G, C], the sums of the j
    largest top [T, G, C + 1] float64, -inf for j past the group's size)."""
    T, G, S = x.shape
    Q = x.new_zeros(T, G, C + 1)
    Q[..., 0] = 1.0
    h = x.new_full((T, G, C), NEG)  # the j largest so far, descending
    filled = torch.zeros(T, G, C, dtype=torch.bool)
    rows, takes, skips = [Q], [], []
    for i in range(S):
        xi = x[..., i : i + 1]
        d = torch.where(filled, xi - h, torch.full_like(h, torch.inf))  # an empty place: x enters the top
        skip, take = torch.exp(-torch.relu(d)), torch.exp(-torch.relu(-d))
        Q = torch.cat([Q[..., :1], Q[..., 1:] * skip + Q[..., :-1] * take], dim=-1)
        rows.append(Q)
        takes.append(take)
        skips.append(skip)
        y, y_filled, hs, fs = xi[..., 0], torch.ones(T, G, dtype=torch.bool), [], []
        for j in range(C):  # insertion of x into the j largest
            here = ~filled[..., j] | (y_filled & (y > h[..., j]))
            hs.append(torch.where(here, y, h[..., j]))
            fs.append(filled[..., j] | y_filled)
            y, y_filled = torch.where(here, h[..., j], y), torch.where(here, filled[..., j], y_filled)
        h, filled = torch.stack(hs, -1), torch.stack(fs, -1)
    top = torch.cat([torch.zeros(T, G, 1, dtype=torch.float64), h.double().cumsum(-1)], -1)
    reach = torch.cat([torch.ones(T, G, 1, dtype=torch.bool), filled], -1)
    return rows, takes, skips, torch.where(reach, top, -torch.inf)


def top_relative(r32: Tensor, spec) -> tuple[Tensor, Tensor]:
    """(log Σ_{S ⊨ spec} exp(r·z_S) [T] float64, the marginals [T, n] float32) for float32 logits
    r32 [T, n] and a ``circuits.GroupLimited`` / ``GroupCapacity`` spec, in the top-relative form."""
    T, n = r32.shape
    sizes, G = spec.groups, len(spec.groups)
    S, K = max(sizes), spec.kmax
    C, U = min(spec.capacity, K, S), (spec.max_groups if spec.max_groups < G else 0)
    index, start = [], 0
    for size in sizes:  # the groups padded to S with never-taken variables (column n)
        index += [*range(start, start + size)] + [n] * (S - size)
        start += size
    padded = torch.cat([torch.where(r32 > -torch.inf, r32, NEG), r32.new_full((T, 1), NEG)], 1)
    x = padded[:, index].view(T, G, S)
    rows, takes, skips, top = _inner(x, C)
    Qg = rows[-1]

    def moved(t: Tensor, j: int, fill: float) -> Tensor:
        du = int(j > 0 and U > 0)
        out = torch.full_like(t, fill)
        out[:, j:, du:] = t[:, : K + 1 - j, : U + 1 - du]
        return out

    M = torch.full((T, K + 1, U + 1), -torch.inf, dtype=torch.float64)
    M[:, 0, 0] = 0.0
    Qo = torch.zeros(T, K + 1, U + 1)
    Qo[:, 0, 0] = 1.0
    shares = []  # each group count's share of each outer state, [C + 1, T, K + 1, U + 1]
    for g in range(G):
        best = torch.stack([moved(M, j, -torch.inf) + top[:, g, j, None, None] for j in range(C + 1)])
        M = best.max(0).values
        gap = torch.where(torch.isfinite(M), best - M, -torch.inf).float()  # <= 0, rounded once
        terms = torch.stack([moved(Qo, j, 0.0) * Qg[:, g, j, None, None] for j in range(C + 1)]) * torch.exp(gap)
        Qo = terms.sum(0)
        shares.append(torch.where(Qo > 0, terms / Qo.clamp(min=1e-38), 0.0))
    q = Qo[:, spec.kmin :].double()
    band = torch.where(q > 0, torch.log(q.clamp(min=1e-300)) + M[:, spec.kmin :], -torch.inf)
    log_z = torch.logsumexp(band.reshape(T, -1), 1)
    A = torch.zeros(T, K + 1, U + 1)
    A[:, spec.kmin :] = torch.exp(band - log_z[:, None, None]).float()  # P(the final state)
    counts = x.new_zeros(T, G, C + 1)  # P(group g holds j)
    for g in reversed(range(G)):
        flow = A * shares[g]
        counts[:, g] = flow.flatten(2).sum(2).T
        A = flow[0].clone()
        du = int(U > 0)
        for j in range(1, C + 1):
            A[:, : K + 1 - j, : U + 1 - du] += flow[j, :, j:, du:]
    B, cols = counts, []
    for i in reversed(range(S)):
        before, after = rows[i], rows[i + 1][..., 1:]
        live = after > 0
        W = torch.where(live, before[..., :-1] * takes[i] / after.clamp(min=1e-38), 0.0)  # took i
        Wc = torch.where(live, before[..., 1:] * skips[i] / after.clamp(min=1e-38), 0.0)  # left it
        took = B[..., 1:] * W
        cols.append(took.sum(-1))
        B = torch.cat([B[..., :1], B[..., 1:] * Wc], -1)
        B[..., :-1] += took
    m = torch.stack(cols[::-1], -1).reshape(T, G * S)
    return log_z, m[:, [index.index(i) for i in range(n)]]


def forced_rows(spec, count: int, seed: int) -> Tensor:
    """float32 rows [count, n] whose first group lies far below the rest (by 300 to 1e4): the limits
    force it to contribute where every group must (a capacity of k / G)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(count, spec.n, generator=g) * 3
    first = spec.groups[0]
    r[: count // 2, :first] -= 1e4
    r[count // 2 :, :first] = -300.0 + torch.randn(count - count // 2, first, generator=g)
    return r


def worst(spec, r32: Tensor) -> tuple[float, float]:
    """(worst |marginal error|, worst log Z error relative to max(1, |log Z|)) of ``top_relative``
    against the float64 reference of ``tools/accuracy_fp32.py`` on rows r32 [T, n]."""
    want_z, want_m = acc.reference(lambda r: acc.group_log_norm(r, spec), r32)
    nat, m = top_relative(r32, spec)
    log_z = nat - F.softplus(r32.double()).sum(1)
    return (m.double() - want_m).abs().max().item(), ((log_z - want_z).abs() / want_z.abs().clamp(min=1)).max().item()


def specs(quick: bool = False) -> list:
    from circuits import GroupCapacity, GroupLimited

    out = [
        GroupLimited(64, 8, 8, 2),
        GroupCapacity(64, None, 8, 2, kmin=0, kmax=8),
        GroupCapacity(64, 8, 8, 1),  # one from every group: each group is forced
        GroupLimited(64, None, [8, 16, 8, 32], 2, capacity=6, kmin=4, kmax=8),  # unequal groups
    ]
    if not quick:
        out += [GroupLimited(256, 8, 8, 4), GroupLimited(256, 8, 8, 4, capacity=2)]  # DeepSeek-V3's gate
    return out


def table(count: int, quick: bool) -> list[tuple]:
    """One row per spec: its worst errors over the grid (scales x kinds) and over the forced rows."""
    import circuits

    out = []
    scales = acc.SCALES[::2] if quick else acc.SCALES
    for spec in specs(quick):
        dp = circuits.GroupDP(spec)
        grid_m = grid_z = 0.0
        for s in scales:
            for kind in acc.KINDS:
                r32 = acc.rows(spec.n, s, kind, count, seed=int(s * 7) + len(kind))
                r32 = r32[dp.reach(r32) >= spec.kmin]  # rows the spec allows something on
                em, ez = worst(spec, r32)
                grid_m, grid_z = max(grid_m, em), max(grid_z, ez)
        em, ez = worst(spec, forced_rows(spec, count, seed=spec.n))
        out.append((spec.describe(), f"{grid_m:.1e}", f"{grid_z:.1e}", f"{em:.1e}", f"{ez:.1e}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64, help="rows of each kind and scale")
    ap.add_argument("--quick", action="store_true", help="no 256-expert specs, every other scale")
    args = ap.parse_args()
    if args.rows < 2:
        raise SystemExit(f"--rows must be at least 2, got {args.rows}")
    print(
        f"worst errors of the top-relative float32 form against float64, {args.rows} rows per kind and scale "
        f"(goals: marginals {MARGINAL_BOUND:g}, log Z {LOG_Z_BOUND:g} relative)\n"
    )
    header = ("constraint", "grid: marginals", "grid: log Z", "forced: marginals", "forced: log Z")
    rows = table(args.rows, args.quick)
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    print("\n".join("| " + " | ".join(row) + " |" for row in rows))


if __name__ == "__main__":
    main()
