"""Counting constraints built structurally, as count states over a vtree (never through CNF).

- ``exactly_counts``: Eq(block, j) = "exactly j of this block's variables", bottom-up over the
  block's vtree as OR_a Eq(left, a) AND Eq(right, j - a), counts capped. ``ExactlyK`` / ``RangeK``
  use it on a balanced vtree over all n variables; the group specs on each group.
- ``group_vtree``: balanced inside each group, then balanced over the groups, so that every group
  is one vtree node.
- ``build_grouped``: the SDD of a ``GroupLimited`` / ``GroupCapacity`` spec. Inside a group the
  states are Eq(group, j), j <= min(capacity, kmax). Above the groups a vtree node's state is
  (c true variables, g nonempty groups) below it, and
  State(v, c, g) = OR over c1 + c2 = c, g1 + g2 = g of State(left, c1, g1) AND State(right, c2, g2),
  with c <= kmax and g <= max_groups (g is not tracked without a group limit). The root is the OR
  of the states with kmin <= c <= kmax. At most (kmax + 1)(max_groups + 1) states per vtree node.
- ``log_partition_reference``: log Z of a group spec by an independent dynamic program over the
  groups (float64), for the compile-time self-check and the tests.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Callable

import numpy as np
from pysdd.sdd import SddManager, SddNode, Vtree

from ..layout import Layout
from . import self_check as _self_check

Progress = Callable[[int], None]  # told the compile steps done (circuits.compiler.estimate: f^2 per state of f terms)


def exactly_counts(mgr: SddManager, vtree: Vtree, cap: int, progress: Progress | None = None) -> list[SddNode]:
    """[Eq(vars(vtree), j) for j in 0..min(cap, |vars|)] as SDD nodes; ``progress(f * f)`` after each
    state OR-ing f terms."""
    if vtree.is_leaf():
        x = mgr.literal(vtree.var())
        return [~x, x][: cap + 1]
    left = exactly_counts(mgr, vtree.left(), cap, progress)
    right = exactly_counts(mgr, vtree.right(), cap, progress)
    out = []
    for j in range(min(cap, len(left) + len(right) - 2) + 1):
        node = mgr.false()
        terms = range(max(0, j - len(right) + 1), min(j, len(left) - 1) + 1)
        for a in terms:
            node = node | (left[a] & right[j - a])
        out.append(node)
        if progress is not None:
            progress(len(terms) ** 2)
    return out


def _halves(items: list) -> tuple[list, list]:
    """The split of a balanced vtree: the left half gets the smaller part."""
    mid = len(items) // 2
    return items[:mid], items[mid:]


def group_vtree(sizes: tuple[int, ...]) -> Vtree:
    """A vtree over variables 1..n: balanced within each group of ``sizes`` (contiguous, in order),
    then balanced over the groups. Written as a libsdd vtree file (node ids are in-order positions,
    children listed before parents) and read back."""
    lines: list[str] = []
    position = iter(range(2 * sum(sizes)))

    def tree(items: list) -> int:  # items: variables (ints) or groups (lists of variables)
        if len(items) == 1:
            return tree(items[0]) if isinstance(items[0], list) else leaf(items[0])
        left, right = _halves(items)
        a = tree(left)
        me = next(position)
        b = tree(right)
        lines.append(f"I {me} {a} {b}")
        return me

    def leaf(var: int) -> int:
        me = next(position)
        lines.append(f"L {me} {var}")
        return me

    starts = np.cumsum((0,) + tuple(sizes))
    tree([list(range(int(s) + 1, int(e) + 1)) for s, e in itertools.pairwise(starts)])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "groups.vtree")
        with open(path, "w") as f:
            f.write(f"vtree {len(lines)}\n" + "\n".join(lines) + "\n")
        return Vtree.from_file(path.encode())


def build_grouped(spec, progress: Progress | None = None) -> tuple[SddManager, SddNode]:
    """The SDD of a group spec on ``group_vtree(spec.groups)``: (manager (keep it alive), root).
    ``progress`` as in ``exactly_counts``; above the groups it is told, per vtree node, the sum over
    its states of f^2 (f: the conjunctions OR-ed into the state)."""
    mgr = SddManager.from_vtree(group_vtree(spec.groups))
    mgr.auto_gc_and_minimize_off()
    cap, track = min(spec.capacity, spec.kmax), spec.limits_groups

    def states(v: Vtree, groups: int) -> dict[tuple[int, int], SddNode]:
        """(true variables c, nonempty groups g) -> the SDD of that state over v's variables; v
        covers ``groups`` whole groups (g is always 0 when there is no group limit)."""
        if groups == 1:
            return {(j, int(track and j > 0)): node for j, node in enumerate(exactly_counts(mgr, v, cap, progress))}
        nl, nr = _halves(range(groups))
        left, right = states(v.left(), len(nl)), states(v.right(), len(nr))
        out: dict[tuple[int, int], SddNode] = {}
        terms: dict[tuple[int, int], int] = {}
        for (c1, g1), a in left.items():
            for (c2, g2), b in right.items():
                key = (c1 + c2, g1 + g2)
                if key[0] <= spec.kmax and key[1] <= spec.max_groups:
                    term = a & b
                    out[key] = out[key] | term if key in out else term
                    terms[key] = terms.get(key, 0) + 1
        if progress is not None:
            progress(sum(f * f for f in terms.values()))
        return out

    root = mgr.false()
    for (c, _), node in states(mgr.vtree(), len(spec.groups)).items():
        if spec.kmin <= c:
            root = root | node
    return mgr, root


def log_partition_reference(spec, r) -> np.ndarray:
    """log P(spec) under independent Bernoulli(sigmoid(r)): [T, n] -> [T] (float64, numpy).

    Per group a Poisson-binomial table P(exactly j of the group), then a table over the groups
    indexed by (true variables so far, nonempty groups so far): independent of the SDD.
    """
    r = _self_check.as_logits(r)
    T = r.shape[0]
    logp, log1mp = _self_check.log_sigmoid(r), _self_check.log_sigmoid(-r)
    K, M, cap = spec.kmax, spec.max_groups, min(spec.capacity, spec.kmax)
    acc = np.full((T, K + 1, M + 1), -np.inf)  # log P(c true, g nonempty groups so far)
    acc[:, 0, 0] = 0.0
    start = 0
    for size in spec.groups:
        grp = np.full((T, cap + 2), -np.inf)  # log P(exactly j of this group), j <= cap (+1 spill)
        grp[:, 0] = 0.0
        for i in range(start, start + size):
            grp[:, 1:] = np.logaddexp(grp[:, 1:] + log1mp[:, i : i + 1], grp[:, :-1] + logp[:, i : i + 1])
            grp[:, 0] += log1mp[:, i]
        start += size
        nxt = np.full_like(acc, -np.inf)
        for j in range(cap + 1):
            g = int(j > 0)
            moved = acc[:, : K + 1 - j, : M + 1 - g] + grp[:, j : j + 1, None]
            nxt[:, j:, g:] = np.logaddexp(nxt[:, j:, g:], moved)
        acc = nxt
    band = acc[:, spec.kmin : K + 1, :].reshape(T, -1)
    return np.logaddexp.reduce(band, axis=1)


def self_check(layout: Layout, spec) -> None:
    """Raise ValueError if the layout's log Z at the fixed probe logits differs from the reference."""
    r = _self_check.probe_logits(layout.n)
    _self_check.agree(_self_check.layout_log_partition(layout, r), log_partition_reference(spec, r))
