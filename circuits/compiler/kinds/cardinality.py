"""``ExactlyK(n, k)``: exactly k of the n variables are true; ``RangeK(n, kmin, kmax)``: between kmin
and kmax (inclusive).

- compile: "direct" (the default) builds the count tree (``circuits.compiler.count_tree``); "pysdd" ORs
  "exactly j of this block" bottom-up over a balanced vtree (``circuits.compiler.groups.exactly_counts``,
  counts capped at kmax), a range being the OR over the band.
- estimate: the count tree's sizes (``circuits.compiler.estimate``). For ``ExactlyK`` the layout's nodes,
  elements and levels exactly (the states reachable from the root: j >= k - (n - m)); for
  ``RangeK`` the tree capped at kmax, whose elements and levels bound the layout's, which has at
  most 2x its nodes (the band's OR adds interval nodes; a band that is almost TRUE leaves far fewer).
- check: log Z against the Poisson-binomial dynamic program (``circuits.compiler.self_check``).
- describe: ``C(n, k)`` models (``math.comb``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pysdd.sdd import SddManager, SddNode, Vtree

from ... import checks
from ...layout import Layout
from .. import count_tree, groups, self_check
from ..estimate import Estimate, count_tree_sizes, depth, pysdd_estimate
from ..registry import Progress, Spec, register


def balanced_vtree(n: int) -> Vtree:
    """A balanced vtree over variables 1..n in natural order (depth ceil(log2 n))."""
    return Vtree(var_count=n, var_order=list(range(1, n + 1)), vtree_type="balanced")


class _Counting(Spec):
    """What ExactlyK and RangeK share: the count of true variables lies in ``cardinalities``."""

    compilers = ("direct", "pysdd")

    def model_count(self) -> int:
        return sum(math.comb(self.n, j) for j in self.cardinalities)

    def count_formula(self) -> str:
        lo, hi = self.cardinalities[0], self.cardinalities[-1]
        return f"C({self.n}, {lo})" if lo == hi else f"sum of C({self.n}, j) for j in {lo}..{hi}"

    def build_sdd(self, progress: Progress | None = None) -> tuple[SddManager, SddNode]:
        lo, hi = self.cardinalities[0], self.cardinalities[-1]
        mgr = SddManager.from_vtree(balanced_vtree(self.n))
        mgr.auto_gc_and_minimize_off()
        counts = groups.exactly_counts(mgr, mgr.vtree(), hi, progress)
        root = mgr.false()
        for j in range(lo, hi + 1):
            root = root | counts[j]
        return mgr, root

    def check(self, layout: Layout, entry: Path | None, compiler: str) -> None:
        r = self_check.probe_logits(layout.n)
        want = self_check.cardinality_log_partition(r, self.cardinalities[0], self.cardinalities[-1])
        self_check.agree(self_check.layout_log_partition(layout, r), want)


@register
@dataclass(frozen=True)
class ExactlyK(_Counting):
    """Exactly ``k`` of ``n`` Boolean variables are true (1 <= n, 0 <= k <= n)."""

    n: int
    k: int

    dict_fields = ("n", "k")
    fixed_cardinality = True  # every model has k true variables (so the distribution is shift invariant)

    def __post_init__(self):
        object.__setattr__(self, "n", checks.integer("n", self.n, 1, None))
        object.__setattr__(self, "k", checks.integer("k", self.k, 0, self.n, hi_name="n"))

    @property
    def key(self) -> str:
        return f"exactly-n{self.n}-k{self.k}"

    @property
    def cardinalities(self) -> range:
        return range(self.k, self.k + 1)

    def describe(self) -> str:
        return f"ExactlyK(n={self.n}, k={self.k})"

    def build_direct(self, progress: Progress | None = None) -> Layout:
        return count_tree.exactly_layout(self.n, self.k, progress)

    def estimate(self) -> Estimate:
        t = count_tree_sizes(self.n, self.k, self.k)
        levels = depth(self.n) + 1
        return pysdd_estimate(t.nodes + 1, t.elements + 1, levels, t.built_elements, t.state_steps, True)


@register
@dataclass(frozen=True)
class RangeK(_Counting):
    """Between ``kmin`` and ``kmax`` (inclusive) of ``n`` variables are true (0 <= kmin <= kmax <= n)."""

    n: int
    kmin: int
    kmax: int

    dict_fields = ("n", "kmin", "kmax")

    def __post_init__(self):
        object.__setattr__(self, "n", checks.integer("n", self.n, 1, None))
        object.__setattr__(self, "kmax", checks.integer("kmax", self.kmax, 0, self.n, hi_name="n"))
        object.__setattr__(self, "kmin", checks.integer("kmin", self.kmin, 0, self.kmax, hi_name="kmax"))

    @property
    def key(self) -> str:
        return f"range-n{self.n}-k{self.kmin}-{self.kmax}"

    @property
    def fixed_cardinality(self) -> bool:
        return self.kmin == self.kmax

    @property
    def cardinalities(self) -> range:
        return range(self.kmin, self.kmax + 1)

    def describe(self) -> str:
        return f"RangeK(n={self.n}, kmin={self.kmin}, kmax={self.kmax})"

    def build_direct(self, progress: Progress | None = None) -> Layout:
        return count_tree.interval_layout(self.n, self.kmin, self.kmax, progress)

    def estimate(self) -> Estimate:
        t = count_tree_sizes(self.n, self.kmax)
        levels = depth(self.n) + 1
        return pysdd_estimate(t.built_nodes + 1, t.built_elements + 1, levels, t.built_elements, t.state_steps, False)
