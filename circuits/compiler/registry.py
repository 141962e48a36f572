"""The interface of a constraint kind, and the registry of kinds: the one place that knows them all.

A kind is a frozen dataclass that subclasses ``Spec`` and is registered with ``@register``. Its
module says everything about it, and nothing else in ``circuits`` asks for its type:

- what it is: its fields, ``key`` (the name of its cache entry), ``dict_fields`` (its JSON form in
  the cache manifest: ``spec_to_dict``; ``spec_from_dict`` rebuilds it when ``rebuildable``),
  ``describe()``, ``model_count()`` and ``count_formula()`` (``probmoe-compile``'s report);
- how it compiles: ``compilers`` (its default first) and a builder per compiler: ``build_direct``
  (a ``Layout`` built from the known structure), ``build_sdd`` (pysdd), ``dimacs_path`` (the CNF
  file that d4 reads);
- how it estimates: ``estimate()``, the pysdd compiler's cost (``circuits.compiler.estimate``), or None;
- how a layout is checked: ``check(layout, entry, compiler)`` against an independent computation,
  after compiling and on every cache read.

``circuits.compiler.compile``, ``circuits.compiler.estimate``, ``circuits.compiler.cache`` and ``circuits.inspect`` call these.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pysdd.sdd import SddManager, SddNode

from ..layout import Layout

Progress = Callable[[int], None]  # told the compile steps done (circuits.compiler.estimate)
KINDS: dict[str, type[Spec]] = {}  # class name -> kind, in registration order


class Spec:
    """A constraint: an immutable, hashable value that says how it compiles, estimates, caches and
    describes itself (the module docstring). Subclasses are frozen dataclasses that define at least
    ``key``, ``describe``, ``check`` and the builders of their ``compilers``. A plain class, without
    a metaclass: routing checks specs with ``isinstance`` inside torch.compile'd code."""

    compilers: tuple[str, ...] = ()  # the compilers that build it ("direct", "d4", "pysdd"), its default first
    dict_fields: tuple[str, ...] = ()  # the fields of its JSON form (tuples are written as lists)
    rebuildable = True  # spec_from_dict can rebuild it from its JSON form
    vtree_shape: str | None = "balanced"  # the manifest's "vtree" for its SDD (a d4 d-DNNF has None)
    fixed_cardinality = False  # every model has the same number of true variables
    cardinalities: range | None = None  # the numbers of true variables its models may have, if known

    @property
    def key(self) -> str:
        """The name of its cache entry: equal specs, equal keys; a new key for anything else."""
        raise NotImplementedError(f"{type(self).__name__} has no cache key")

    def describe(self) -> str:
        """One line naming the kind and its fields, e.g. ``ExactlyK(n=64, k=8)``."""
        raise NotImplementedError(f"{type(self).__name__} cannot describe itself")

    def check(self, layout: Layout, entry: Path | None, compiler: str) -> None:
        """Raise ValueError if ``layout`` does not compute this constraint: its log Z at the probe
        logits (``circuits.compiler.self_check``) against an independent computation. ``entry``: the cache
        entry it was read from (None right after compiling); ``compiler``: the one that built it."""
        raise NotImplementedError(f"{type(self).__name__} has no check of its layouts")

    def model_count(self) -> int | None:
        """The number of models, exactly, or None when only compiling can tell."""
        return None

    def count_formula(self) -> str | None:
        """The closed form of ``model_count``, e.g. ``C(64, 8)``, or None."""
        return None

    def estimate(self):
        """The ``circuits.compiler.estimate.Estimate`` of compiling it with pysdd, or None (no arithmetic
        estimate: it is never refused for its size)."""
        return None

    def build_direct(self, progress: Progress | None = None) -> Layout:
        """Compiler "direct": the layout built from the known structure (``progress`` told the
        elements built)."""
        raise NotImplementedError(f"{type(self).__name__} has no direct compiler")

    def build_sdd(self, progress: Progress | None = None) -> tuple[SddManager, SddNode]:
        """Compiler "pysdd": the SDD as (manager (keep it alive), root); ``progress`` told the compile
        steps (``circuits.compiler.estimate``)."""
        raise NotImplementedError(f"{type(self).__name__} has no pysdd compiler")

    def dimacs_path(self) -> str:
        """Compiler "d4": the path of the DIMACS CNF file that d4 compiles."""
        raise NotImplementedError(f"{type(self).__name__} has no d4 compiler")

    @classmethod
    def from_fields(cls, fields: dict) -> Spec:
        """The spec whose ``dict_fields`` have these values, validated as if constructed."""
        return cls(**fields)


def register(cls: type[Spec]) -> type[Spec]:
    """Class decorator: make ``cls`` (a frozen dataclass subclassing ``Spec``) a constraint kind,
    known by its class name. Registering the same class twice is a no-op; another class of the same
    name is a ValueError."""
    if not (isinstance(cls, type) and issubclass(cls, Spec)):
        raise TypeError(f"a constraint kind must be a subclass of circuits.spec.Spec, got {cls!r}")
    known = KINDS.setdefault(cls.__name__, cls)
    if known is not cls:
        raise ValueError(f"a constraint kind named {cls.__name__} is already registered (from {known.__module__})")
    return cls


def registered(spec) -> bool:
    """``spec`` is an instance of a registered kind."""
    return KINDS.get(type(spec).__name__) is type(spec)


def kind_names(last: str = " or ") -> str:
    """The registered kinds, e.g. "ExactlyK, RangeK or CnfFile" (``last`` joins the last two)."""
    names = list(KINDS)
    return last.join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def require(spec) -> Spec:
    """``spec`` if it is an instance of a registered kind, else TypeError naming the kinds."""
    if not registered(spec):
        raise TypeError(f"spec must be {kind_names()}, got {type(spec).__name__}")
    return spec


def spec_to_dict(spec: Spec) -> dict:
    """A JSON-able description of the spec, stored in the cache manifest: its type and its
    ``dict_fields``."""
    require(spec)
    fields = {name: getattr(spec, name) for name in spec.dict_fields}
    return {"type": type(spec).__name__, **{k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}}


def spec_from_dict(data) -> Spec:
    """The spec a ``spec_to_dict`` dict describes, validated as if constructed; ValueError for anything
    else, and for a kind that is not ``rebuildable`` (the file specs hold only a digest)."""
    if not isinstance(data, dict):
        raise ValueError(f"a constraint spec must be a dict, got {type(data).__name__}")
    kinds = [name for name, cls in KINDS.items() if cls.rebuildable]
    kind = data.get("type")
    if kind not in kinds:
        raise ValueError(f"a constraint spec's type must be one of {kinds}, got {kind!r}")
    fields = KINDS[kind].dict_fields
    if sorted(data) != sorted(("type", *fields)):
        raise ValueError(f"a {kind} spec must have exactly the keys {['type', *fields]}, got {sorted(data)}")
    return KINDS[kind].from_fields({name: data[name] for name in fields})
