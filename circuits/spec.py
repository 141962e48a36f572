"""Constraint specs: what a circuit encodes.

A spec is an immutable, hashable value. Its ``key`` names its cache entry; ``circuits.compile``
turns it into a level layout.

- ``ExactlyK(n, k)``: exactly k of the n variables are true.
- ``RangeK(n, kmin, kmax)``: between kmin and kmax (inclusive) are true.
- ``SddFile(sdd, vtree)``: any SDD saved by pysdd / libsdd (``.sdd`` + ``.vtree``).
- ``CnfFile(path)``: any CNF in DIMACS format, compiled by d4 (or pysdd on a balanced vtree).
- ``GroupLimited(n, k, groups, max_groups)``: exactly k (or kmin..kmax) true, all of them in at
  most ``max_groups`` of the contiguous groups (optionally also at most ``capacity`` per group).
- ``GroupCapacity(n, k, groups, capacity)``: exactly k (or kmin..kmax) true, at most ``capacity``
  in each group (optionally also in at most ``max_groups`` groups).

``spec_to_dict`` describes a spec as JSON; ``spec_from_dict`` rebuilds (and re-validates) the
counting specs from such a dict.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
from dataclasses import dataclass, field

from . import checks


def _check_int(name: str, value, lo: int, hi: int | None, hi_name: str | None = None) -> int:
    """``value`` as an int in [lo, hi], else ValueError naming ``name`` and the allowed range."""
    return checks.integer(name, value, lo, hi, hi_name=hi_name)


@dataclass(frozen=True)
class ExactlyK:
    """Exactly ``k`` of ``n`` Boolean variables are true (1 <= n, 0 <= k <= n)."""

    n: int
    k: int

    def __post_init__(self):
        object.__setattr__(self, "n", _check_int("n", self.n, 1, None))
        object.__setattr__(self, "k", _check_int("k", self.k, 0, self.n, "n"))

    @property
    def key(self) -> str:
        return f"exactly-n{self.n}-k{self.k}"

    @property
    def fixed_cardinality(self) -> bool:
        """Every model has the same number of true variables (so the distribution is shift invariant)."""
        return True

    @property
    def cardinalities(self) -> range:
        return range(self.k, self.k + 1)

    def model_count(self) -> int:
        return math.comb(self.n, self.k)

    def describe(self) -> str:
        return f"ExactlyK(n={self.n}, k={self.k})"


@dataclass(frozen=True)
class RangeK:
    """Between ``kmin`` and ``kmax`` (inclusive) of ``n`` variables are true (0 <= kmin <= kmax <= n)."""

    n: int
    kmin: int
    kmax: int

    def __post_init__(self):
        object.__setattr__(self, "n", _check_int("n", self.n, 1, None))
        object.__setattr__(self, "kmax", _check_int("kmax", self.kmax, 0, self.n, "n"))
        object.__setattr__(self, "kmin", _check_int("kmin", self.kmin, 0, self.kmax, "kmax"))

    @property
    def key(self) -> str:
        return f"range-n{self.n}-k{self.kmin}-{self.kmax}"

    @property
    def fixed_cardinality(self) -> bool:
        return self.kmin == self.kmax

    @property
    def cardinalities(self) -> range:
        return range(self.kmin, self.kmax + 1)

    def model_count(self) -> int:
        return sum(math.comb(self.n, j) for j in self.cardinalities)

    def describe(self) -> str:
        return f"RangeK(n={self.n}, kmin={self.kmin}, kmax={self.kmax})"


def _digest(*paths: str) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            h.update(f.read())
        h.update(b"\0")
    return h.hexdigest()[:20]


@dataclass(frozen=True)
class SddFile:
    """An SDD saved by pysdd/libsdd: ``sdd`` file plus the ``vtree`` file it was saved with.

    The cache key is the hash of both files' contents, so editing a file gives a new entry.
    """

    sdd: str
    vtree: str
    digest: str = field(default="", compare=True)

    def __post_init__(self):
        for name in ("sdd", "vtree"):
            path = os.fspath(getattr(self, name))
            if not os.path.isfile(path):
                raise ValueError(f"{name} must be an existing file, got {path!r}")
            object.__setattr__(self, name, os.path.abspath(path))
        if not self.digest:
            object.__setattr__(self, "digest", _digest(self.sdd, self.vtree))

    @property
    def key(self) -> str:
        return f"sdd-{self.digest}"

    fixed_cardinality = False
    cardinalities = None

    def model_count(self) -> int | None:
        return None

    def describe(self) -> str:
        return f"SddFile({os.path.basename(self.sdd)}, {os.path.basename(self.vtree)})"


@dataclass(frozen=True)
class CnfFile:
    """A CNF formula in DIMACS format, compiled by d4 (``circuits.cnf``; or by pysdd on a balanced
    vtree, ``compile_circuit(..., compiler="pysdd")``)."""

    path: str
    digest: str = field(default="", compare=True)

    def __post_init__(self):
        path = os.fspath(self.path)
        if not os.path.isfile(path):
            raise ValueError(f"path must be an existing DIMACS CNF file, got {path!r}")
        object.__setattr__(self, "path", os.path.abspath(path))
        if not self.digest:
            object.__setattr__(self, "digest", _digest(self.path))

    @property
    def key(self) -> str:
        return f"cnf-{self.digest}"

    fixed_cardinality = False
    cardinalities = None

    def model_count(self) -> int | None:
        return None

    def describe(self) -> str:
        return f"CnfFile({os.path.basename(self.path)})"


def _group_sizes(n: int, groups) -> tuple[int, ...]:
    """``groups`` (an int: that many equal groups; or a sequence of sizes summing to n) as sizes."""
    if isinstance(groups, numbers.Integral) and not isinstance(groups, bool):
        g = _check_int("groups", groups, 1, n, "n")
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
class _Grouped:
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

    def _setup(self, n, k, groups, max_groups, capacity, kmin, kmax) -> None:
        n = _check_int("n", n, 1, None)
        sizes = _group_sizes(n, groups)
        G, largest = len(sizes), max(sizes)
        max_groups = G if max_groups is None else _check_int("max_groups", max_groups, 1, G, "the number of groups")
        capacity = largest if capacity is None else _check_int("capacity", capacity, 1, largest, "the largest group")
        reach = sum(sorted((min(s, capacity) for s in sizes), reverse=True)[:max_groups])  # most true variables
        if k is not None:
            if kmin is not None or kmax is not None:
                raise ValueError("pass either k (exactly k) or kmin/kmax (a range), not both")
            k = _check_reach("k", k, reach, sizes, max_groups, capacity)
            kmin = kmax = k
        else:
            kmax = _check_reach("kmax", reach if kmax is None else kmax, reach, sizes, max_groups, capacity)
            kmin = _check_int("kmin", 0 if kmin is None else kmin, 0, kmax, "kmax")
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

    def _limits(self) -> dict:
        raise NotImplementedError

    def describe(self) -> str:
        groups = _sizes_text(self.groups)
        size = f"k={self.k}" if self.k is not None else f"kmin={self.kmin}, kmax={self.kmax}"
        limits = [f"max_groups={self.max_groups}"] if self.limits_groups else []
        limits += [f"capacity={self.capacity}"] if self.limits_capacity else []
        return f"{type(self).__name__}(n={self.n}, {size}, groups={groups}{''.join(', ' + x for x in limits)})"


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


GROUP_SPECS = (GroupLimited, GroupCapacity)
CARDINALITY_SPECS = (ExactlyK, RangeK)  # what the cardinality DP (circuits.CardinalityDP) also evaluates
SPECS = (*CARDINALITY_SPECS, *GROUP_SPECS, SddFile, CnfFile)  # every kind of spec
Spec = ExactlyK | RangeK | SddFile | CnfFile | GroupLimited | GroupCapacity


def spec_to_dict(spec: Spec) -> dict:
    """A JSON-able description of the spec, stored in the cache manifest."""
    if isinstance(spec, ExactlyK):
        return {"type": "ExactlyK", "n": spec.n, "k": spec.k}
    if isinstance(spec, RangeK):
        return {"type": "RangeK", "n": spec.n, "kmin": spec.kmin, "kmax": spec.kmax}
    if isinstance(spec, SddFile):
        return {"type": "SddFile", "digest": spec.digest}
    if isinstance(spec, CnfFile):
        return {"type": "CnfFile", "digest": spec.digest}
    if isinstance(spec, GROUP_SPECS):
        return {
            "type": type(spec).__name__,
            "n": spec.n,
            "kmin": spec.kmin,
            "kmax": spec.kmax,
            "groups": list(spec.groups),
            "max_groups": spec.max_groups,
            "capacity": spec.capacity,
        }
    raise TypeError(
        f"spec must be ExactlyK, RangeK, SddFile, CnfFile, GroupLimited or GroupCapacity, got {type(spec).__name__}"
    )


_REBUILT = {
    "ExactlyK": ("n", "k"),
    "RangeK": ("n", "kmin", "kmax"),
    "GroupLimited": ("n", "kmin", "kmax", "groups", "max_groups", "capacity"),
    "GroupCapacity": ("n", "kmin", "kmax", "groups", "max_groups", "capacity"),
}


def spec_from_dict(data) -> Spec:
    """The counting spec a ``spec_to_dict`` dict describes (ExactlyK, RangeK, GroupLimited,
    GroupCapacity), validated as if constructed; ValueError for anything else (file specs hold only
    a digest and cannot be rebuilt)."""
    if not isinstance(data, dict):
        raise ValueError(f"a constraint spec must be a dict, got {type(data).__name__}")
    kind = data.get("type")
    if kind not in _REBUILT:
        raise ValueError(f"a constraint spec's type must be one of {list(_REBUILT)}, got {kind!r}")
    fields = _REBUILT[kind]
    if sorted(data) != sorted(("type",) + fields):
        raise ValueError(f"a {kind} spec must have exactly the keys {['type', *fields]}, got {sorted(data)}")
    args = {name: data[name] for name in fields}
    if kind == "ExactlyK":
        return ExactlyK(**args)
    if kind == "RangeK":
        return RangeK(**args)
    if not isinstance(args["groups"], list):
        raise ValueError(f"a {kind} spec's groups must be a list of group sizes, got {args['groups']!r}")
    cls = GroupLimited if kind == "GroupLimited" else GroupCapacity
    n, groups = args.pop("n"), args.pop("groups")
    return cls(n, None, groups, **args)
