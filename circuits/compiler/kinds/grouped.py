"""``GroupLimited`` and ``GroupCapacity``: exactly k (or kmin..kmax) of n variables true, the n
split into contiguous groups, with at most ``max_groups`` nonempty groups and / or at most
``capacity`` true per group.

- compile: "direct" (the default) builds the (count, nonempty groups) states over the group vtree
  (``circuits.compiler.count_tree.grouped_layout``); "pysdd" ORs them through pysdd on
  ``circuits.compiler.groups.group_vtree`` (``circuits.compiler.groups.build_grouped``). The manifest's vtree is
  "grouped".
- estimate: the count trees inside the groups plus the (count, nonempty groups) states above them,
  bounded as if the two counts were independent: upper bounds of the layout's elements and levels,
  at most 2x the nodes, on every spec of the test grids but three with a band (kmin < kmax) and a
  capacity, whose interval nodes pass the element figure by up to 12% (GroupCapacity(48, groups
  [8, 16, 4, 20], capacity 3, kmin 2, kmax 9): 393 against 350). Within ~3x in elements for groups
  of 8 or more variables; loose (100x and more) for groups of one or two variables with a group
  limit, where the count and the number of nonempty groups move together.
- check: log Z against a dynamic program over the groups (``circuits.compiler.groups.self_check``).
- describe: the model count by a dynamic program over the groups in ``math.comb`` terms
  (``group_model_count``).
"""

from __future__ import annotations

import hashlib
import math
import numbers
from dataclasses import dataclass, replace
from pathlib import Path

from pysdd.sdd import SddManager, SddNode

from ... import checks
from ...layout import Layout
from ..count_tree import grouped_layout
from ..estimate import Estimate, count_tree_sizes, depth, pairs, pysdd_estimate, terms_squared
from ..groups import build_grouped
from ..groups import self_check as group_self_check
from ..registry import Progress, Spec, register


def _group_sizes(n: int, groups) -> tuple[int, ...]:
    """``groups`` (an int: that many equal groups; or a sequence of sizes summing to n) as sizes."""
    if isinstance(groups, numbers.Integral) and not isinstance(groups, bool):
        g = checks.integer("groups", groups, 1, n, hi_name="n")
        if n % g:
            raise ValueError(
                f"groups = {g} must divide n = {n} into equal groups (or give a list of group sizes summing to n)"
            )
        return (n // g,) * g
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
        raise ValueError(
            f"groups must be an integer (that many equal groups) or a list of group sizes summing to "
            f"n = {n}, got {groups!r}"
        )
    sizes = tuple(groups)
    if not sizes:
        raise ValueError(f"groups must list at least one group size (sizes >= 1 summing to n = {n})")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise ValueError(f"groups must list integer group sizes >= 1 summing to n = {n}, got {list(sizes)}")
    sizes = tuple(int(size) for size in sizes)
    if sum(sizes) != n:
        raise ValueError(f"groups must sum to n = {n}, got sizes {list(sizes)} summing to {sum(sizes)}")
    return sizes


def group_model_count(sizes: tuple[int, ...], kmin: int, kmax: int, max_groups: int, capacity: int) -> int:
    """The number of assignments with kmin..kmax true, at most ``capacity`` per group, in at most
    ``max_groups`` nonempty groups: a dynamic program over the groups in Python integers.

    count[(c, g)] = number of ways to choose c true variables in the groups so far, g of them nonempty.
    """
    count = {(0, 0): 1}
    for size in sizes:
        nxt: dict[tuple[int, int], int] = {}
        for (c, g), ways in count.items():
            for j in range(min(size, capacity, kmax - c) + 1):
                key = (c + j, g + (j > 0))
                if key[1] <= max_groups:
                    nxt[key] = nxt.get(key, 0) + ways * math.comb(size, j)
        count = nxt
    return sum(ways for (c, _), ways in count.items() if kmin <= c <= kmax)


def _sizes_text(sizes: tuple[int, ...]) -> str:
    """``8x32`` for equal groups, else the list of sizes."""
    return f"{len(sizes)}x{sizes[0]}" if len(set(sizes)) == 1 else str(list(sizes))


def _check_reach(name: str, value, reach: int, sizes, max_groups: int, capacity: int) -> int:
    """``value`` as an int in [0, reach], the most true variables the group limits allow, else a
    ValueError naming ``name``, the range and the limits that bound it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not 0 <= value <= reach:
        raise ValueError(
            f"{name} must be in [0, {reach}], got {value}: groups {_sizes_text(sizes)} with "
            f"max_groups = {max_groups} and capacity = {capacity} hold at most {reach} true variables"
        )
    return int(value)


@dataclass(frozen=True, init=False)
class _Grouped(Spec):
    """kmin..kmax of n variables true, split into contiguous groups of sizes ``groups``, with at most
    ``capacity`` true per group and all true variables in at most ``max_groups`` groups.

    After construction ``groups`` is the tuple of group sizes and ``max_groups`` / ``capacity`` are
    ints (no limit: the number of groups / the largest group); ``limits`` says which were given.
    """

    n: int
    kmin: int
    kmax: int
    groups: tuple[int, ...]
    max_groups: int
    capacity: int

    compilers = ("direct", "pysdd")
    dict_fields = ("n", "kmin", "kmax", "groups", "max_groups", "capacity")
    vtree_shape = "grouped"

    def _setup(self, n, k, groups, max_groups, capacity, kmin, kmax) -> None:
        n = checks.integer("n", n, 1, None)
        sizes = _group_sizes(n, groups)
        G, largest = len(sizes), max(sizes)
        max_groups = (
            G if max_groups is None else checks.integer("max_groups", max_groups, 1, G, hi_name="the number of groups")
        )
        capacity = (
            largest
            if capacity is None
            else checks.integer("capacity", capacity, 1, largest, hi_name="the largest group")
        )
        reach = sum(sorted((min(s, capacity) for s in sizes), reverse=True)[:max_groups])  # most true variables
        if k is not None:
            if kmin is not None or kmax is not None:
                raise ValueError("pass either k (exactly k) or kmin/kmax (a range), not both")
            k = _check_reach("k", k, reach, sizes, max_groups, capacity)
            kmin = kmax = k
        else:
            kmax = _check_reach("kmax", reach if kmax is None else kmax, reach, sizes, max_groups, capacity)
            kmin = checks.integer("kmin", 0 if kmin is None else kmin, 0, kmax, hi_name="kmax")
        for name, value in (
            ("n", n),
            ("kmin", kmin),
            ("kmax", kmax),
            ("groups", sizes),
            ("max_groups", max_groups),
            ("capacity", capacity),
        ):
            object.__setattr__(self, name, value)

    @property
    def k(self) -> int | None:
        """k of an exactly-k spec, else None."""
        return self.kmin if self.kmin == self.kmax else None

    @property
    def limits_groups(self) -> bool:
        """The number of nonempty groups is limited (max_groups < number of groups)."""
        return self.max_groups < len(self.groups)

    @property
    def limits_capacity(self) -> bool:
        """The number of true variables per group is limited (below some group's size)."""
        return self.capacity < max(self.groups)

    @property
    def key(self) -> str:
        sizes = self.groups
        if len(set(sizes)) == 1:
            code = f"{len(sizes)}x{sizes[0]}"
        elif len(sizes) <= 16:
            code = ".".join(map(str, sizes))
        else:
            code = hashlib.sha256(",".join(map(str, sizes)).encode()).hexdigest()[:16]
        return (
            f"{type(self).__name__.lower()}-n{self.n}-k{self.kmin}-{self.kmax}-g{code}-m{self.max_groups}"
            f"-c{self.capacity}"
        )

    @property
    def fixed_cardinality(self) -> bool:
        return self.kmin == self.kmax

    @property
    def cardinalities(self) -> range:
        return range(self.kmin, self.kmax + 1)

    def with_cardinality(self, kmin: int, kmax: int):
        """The same groups and limits with kmin..kmax true (e.g. one size of a range)."""
        return type(self)(self.n, None, self.groups, **self._limits(), kmin=kmin, kmax=kmax)

    def model_count(self) -> int:
        return group_model_count(self.groups, self.kmin, self.kmax, self.max_groups, self.capacity)

    def count_formula(self) -> str:
        return "a sum over the groups' counts of products of C(group size, j)"

    def build_direct(self, progress: Progress | None = None) -> Layout:
        return grouped_layout(self, progress)

    def build_sdd(self, progress: Progress | None = None) -> tuple[SddManager, SddNode]:
        return build_grouped(self, progress)

    def estimate(self) -> Estimate:
        return _estimate(self)

    def check(self, layout: Layout, entry: Path | None, compiler: str) -> None:
        group_self_check(layout, self)

    @classmethod
    def from_fields(cls, fields: dict) -> _Grouped:
        if not isinstance(fields["groups"], list):
            raise ValueError(f"a {cls.__name__} spec's groups must be a list of group sizes, got {fields['groups']!r}")
        rest = {name: value for name, value in fields.items() if name not in ("n", "groups")}
        return cls(fields["n"], None, fields["groups"], **rest)

    def _limits(self) -> dict:
        raise NotImplementedError

    def describe(self) -> str:
        groups = _sizes_text(self.groups)
        size = f"k={self.k}" if self.k is not None else f"kmin={self.kmin}, kmax={self.kmax}"
        limits = [f"max_groups={self.max_groups}"] if self.limits_groups else []
        limits += [f"capacity={self.capacity}"] if self.limits_capacity else []
        return f"{type(self).__name__}(n={self.n}, {size}, groups={groups}{''.join(', ' + x for x in limits)})"


@register
@dataclass(frozen=True, init=False)
class GroupLimited(_Grouped):
    """Exactly ``k`` of ``n`` variables (or ``kmin``..``kmax``), taken from at most ``max_groups`` of
    the contiguous groups; optionally also at most ``capacity`` per group.

    groups: an int (that many equal groups; it must divide n) or a list of group sizes summing to n.
    Ranges: 1 <= max_groups <= number of groups, 1 <= capacity <= largest group, and 0 <= kmin <=
    kmax <= the most the limits allow (the ``max_groups`` largest groups, each holding at most
    ``capacity``). A missing kmin is 0, a missing kmax that most.
    """

    def __init__(
        self,
        n: int,
        k: int | None = None,
        groups=None,
        max_groups: int | None = None,
        *,
        kmin: int | None = None,
        kmax: int | None = None,
        capacity: int | None = None,
    ):
        if max_groups is None:
            raise ValueError(
                "max_groups must be given: GroupLimited(n, k, groups, max_groups) with "
                "1 <= max_groups <= the number of groups"
            )
        self._setup(n, k, groups, max_groups, capacity, kmin, kmax)

    def _limits(self) -> dict:
        return {"max_groups": self.max_groups, "capacity": self.capacity}


@register
@dataclass(frozen=True, init=False)
class GroupCapacity(_Grouped):
    """Exactly ``k`` of ``n`` variables (or ``kmin``..``kmax``), at most ``capacity`` in each of the
    contiguous groups; optionally also from at most ``max_groups`` groups. Ranges as ``GroupLimited``."""

    def __init__(
        self,
        n: int,
        k: int | None = None,
        groups=None,
        capacity: int | None = None,
        *,
        kmin: int | None = None,
        kmax: int | None = None,
        max_groups: int | None = None,
    ):
        if capacity is None:
            raise ValueError(
                "capacity must be given: GroupCapacity(n, k, groups, capacity) with 1 <= capacity <= the largest group"
            )
        self._setup(n, k, groups, max_groups, capacity, kmin, kmax)

    def _limits(self) -> dict:
        return {"capacity": self.capacity, "max_groups": self.max_groups}


def _estimate(spec: _Grouped) -> Estimate:
    """Count trees per group, (c, g) states above (the module docstring)."""
    K, cap = spec.kmax, min(spec.capacity, spec.kmax)
    M = min(spec.max_groups, K) if spec.limits_groups else 0  # g <= c <= K; 0: g not tracked
    inside = {s: count_tree_sizes(s, cap) for s in set(spec.groups)}
    memo: dict[tuple, tuple] = {}

    def above(sizes: tuple) -> tuple:
        """(most true variables, groups, built nodes, built elements, state steps, scan) under the
        vtree node over these groups; memoised on the sizes, so equal groups cost O(log groups)."""
        if sizes in memo:
            return memo[sizes]
        if len(sizes) == 1:
            t = inside[sizes[0]]
            out = (min(sizes[0], cap), 1, t.built_nodes, t.built_elements, t.state_steps, t.scan)
        else:
            mid = len(sizes) // 2  # circuits.compiler.groups._halves
            cl, gl, *left = above(sizes[:mid])
            cr, gr, *right = above(sizes[mid:])
            A, B, C = min(cl, K), min(cr, K), min(cl + cr, K)
            Ag, Bg, Gm = min(gl, M), min(gr, M), min(gl + gr, M)
            here = (
                (C + 1) * (Gm + 1),
                pairs(A, B, 0, C) * pairs(Ag, Bg, 0, Gm),
                terms_squared(A, B, C) * terms_squared(Ag, Bg, Gm),
                (C + 1) * (Gm + 1) * (A + 1) * (Ag + 1),
            )
            out = (cl + cr, gl + gr, *(x + y + z for x, y, z in zip(left, right, here)))
        memo[sizes] = out
        return out

    _, _, nodes, elements, steps, scan = above(tuple(spec.groups))
    levels = depth(len(spec.groups)) + depth(max(spec.groups)) + 1
    return replace(pysdd_estimate(nodes + 1, elements + 1, levels, elements, steps, exact=False), scan=scan)
