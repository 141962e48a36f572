"""Constraint specs: what a circuit encodes.

A spec is an immutable, hashable value. Its ``key`` names its cache entry; ``build`` (in
``circuits.compile``) turns it into a pysdd SDD.

- ``ExactlyK(n, k)``: exactly k of the n variables are true.
- ``RangeK(n, kmin, kmax)``: between kmin and kmax (inclusive) are true.
- ``SddFile(sdd, vtree)``: any SDD saved by pysdd / libsdd (``.sdd`` + ``.vtree``).
- ``CnfFile(path)``: any CNF in DIMACS format, compiled by pysdd on a balanced vtree.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
from dataclasses import dataclass, field


def _check_int(name: str, value, lo: int, hi: int | None, hi_name: str | None = None) -> int:
    """``value`` as an int in [lo, hi], else ValueError naming ``name`` and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    upper = f"{hi_name} = {hi}" if hi_name else (str(hi) if hi is not None else "inf")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name} must be in [{lo}, {upper}], got {value}")
    return value


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
    """A CNF formula in DIMACS format, compiled by pysdd on a balanced vtree."""

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


Spec = ExactlyK | RangeK | SddFile | CnfFile


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
    raise TypeError(f"spec must be ExactlyK, RangeK, SddFile or CnfFile, got {type(spec).__name__}")
