"""Routing constraints beyond a number of experts: any compiled circuit over the N experts.

A constraint is a ``circuits`` spec over N variables (``GroupLimited``, ``GroupCapacity``,
``SddFile``, ``CnfFile``; ``ExactlyK`` / ``RangeK`` are plain k / kmin..kmax and are turned into
those) or a compiled ``circuits.Circuit`` over N variables. The distribution is then
P(S) ∝ exp(Σ_{i∈S} r_i) over the subsets S the constraint allows; everything is computed on the
circuit (log Z, marginals, exact draws, the MAP).

    resolve(constraint, n)      -> (constraint or None, (kmin, kmax)): checked, sizes read off
    settle(...)                 -> resolve, plus the checks a config or distribution makes
    to_dict / from_dict         -> the JSON form of a spec constraint (settings files)
    compiled(constraint, device) -> the circuit on a device, input checks off (cached)
    cardinality(n, kmin, kmax, device, algorithm)
                                -> the evaluator of kmin..kmax of n (a circuit or the DP; cached)
    native_cardinality(n, kmin, kmax, algorithm, dtype, device)
                                -> whether its routing of such logits takes fused kernels
    Allowed(circuit)            -> the support, a torch.distributions constraint
"""

from __future__ import annotations

import operator
import threading

import torch
from torch import Tensor
from torch.distributions import constraints as dist_constraints

import circuits
from circuits import CARDINALITY_SPECS as CARDINALITY
from circuits import GROUP_SPECS, Spec

KINDS = "a circuits.Circuit or a spec (GroupLimited, GroupCapacity, ExactlyK, RangeK, SddFile, CnfFile or a registered circuits.Spec)"


def describe(constraint) -> str:
    """The spec's description, or ``Circuit(...)`` for a circuit without one."""
    spec = constraint.spec if isinstance(constraint, circuits.Circuit) else constraint
    return spec.describe() if spec is not None else repr(constraint)


def resolve(constraint, n: int):
    """Check ``constraint`` against N = ``n`` experts.

    Returns (constraint, sizes): a cardinality spec (ExactlyK, RangeK, or a circuit of one)
    becomes (None, (kmin, kmax)); a circuit whose spec can be rebuilt is kept as that spec (it
    compiles, from the cache, on the logits' device); anything else as given. sizes = (the
    smallest, the largest) number of experts an allowed subset has. ValueError for anything else.
    """
    if isinstance(constraint, circuits.Circuit):
        if constraint.n != n:
            raise ValueError(f"constraint is a circuit over {constraint.n} variables, but there are N = {n} experts")
        if isinstance(constraint.spec, (*CARDINALITY, *GROUP_SPECS)):
            constraint = constraint.spec
    elif not isinstance(constraint, Spec):
        raise ValueError(f"constraint must be {KINDS}, got {type(constraint).__name__}")
    if isinstance(constraint, Spec):
        size = getattr(constraint, "n", None)
        if size is None:  # a file spec: its variable count is the compiled circuit's
            size = compiled(constraint, "cpu").n
        if size != n:
            raise ValueError(
                f"constraint {constraint.describe()} is over n = {size} variables, but there are N = {n} experts"
            )
    if isinstance(constraint, CARDINALITY):
        return None, (constraint.cardinalities[0], constraint.cardinalities[-1])
    cards = getattr(constraint, "cardinalities", None) if isinstance(constraint, Spec) else None
    return constraint, (cards[0], cards[-1]) if cards else _size_range(compiled(constraint, "cpu"))


def settle(constraint, n: int, backend: str, k=None, kmin=None, kmax=None, lowest: int = 0):
    """``resolve`` for a config or a distribution: (constraint or None, kmin, kmax). k / kmin / kmax,
    where given, must agree with the constraint's sizes; every allowed subset needs at least
    ``lowest`` experts; backend "dp" takes no structured constraint but the group specs. ValueError otherwise."""
    name = describe(constraint) if isinstance(constraint, (circuits.Circuit, Spec)) else None
    constraint, sizes = resolve(constraint, n)
    lo, hi = sizes
    want = {"k": lo if lo == hi else None, "kmin": lo, "kmax": hi}
    for key, value in {"k": k, "kmin": kmin, "kmax": kmax}.items():
        if value is not None and value != want[key]:
            raise ValueError(
                f"{key} = {value!r} disagrees with constraint {name}, whose subsets have {lo}..{hi} "
                "experts; give the constraint alone"
            )
    if lo < lowest:
        raise ValueError(
            f"constraint {name} allows subsets of {lo} experts; routing needs at least {lowest} expert "
            f"per token (kmin >= {lowest})"
        )
    if constraint is not None and backend == "dp" and not isinstance(constraint, GROUP_SPECS):
        # circuits.check_algorithm's rule, in routing's words
        raise ValueError(
            f"algorithm 'dp' handles k, kmin/kmax, GroupLimited and GroupCapacity; constraint {name} needs "
            "algorithm 'circuit'"
        )
    return constraint, lo, hi


def _size_range(circuit: circuits.Circuit) -> tuple[int, int]:
    """(smallest, largest) number of true variables among the circuit's models: its MAP at logits
    all -1 and all +1 (the MAP maximises the number of true variables times the logit)."""
    r = torch.tensor([[-1.0], [1.0]], dtype=torch.float64, device=circuit.device).expand(2, circuit.n)
    lo, hi = circuit.map(r).sum(-1).tolist()
    return int(lo), int(hi)


def to_dict(constraint):
    """The JSON form of a constraint (``circuits.spec_to_dict``); None stays None. ValueError for a
    compiled circuit without a rebuildable spec and for file specs (they are known by a digest only)."""
    if constraint is None:
        return None
    if isinstance(constraint, GROUP_SPECS):
        return circuits.spec_to_dict(constraint)
    raise ValueError(
        f"constraint {describe(constraint)} cannot be written to a dict: only GroupLimited and "
        "GroupCapacity specs (and k / kmin / kmax) can; pass the spec instead of a compiled circuit"
    )


def from_dict(data):
    """The constraint a ``to_dict`` value describes (None stays None), validated as if constructed."""
    if data is None:
        return None
    try:
        return circuits.spec_from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"constraint: {exc}") from None


_CIRCUITS: dict[tuple, circuits.Circuit] = {}
_CIRCUITS_LOCK = threading.Lock()


def compiled(constraint, device, algorithm: str = "circuit") -> circuits.Evaluator:
    """The circuit routing evaluates for a constraint on ``device``: a spec compiled once per process
    (from the disk cache after the first time), or a copy of a given circuit; input checks off (the
    callers check the logits). The one in-memory cache of routing circuits. A group spec with
    ``algorithm`` "dp" gets the group DP (``circuits.GroupDP``) instead, nothing compiled.

    Under torch.compile the compiling runs while tracing (``_ensure``, whose result is a constant)
    and the circuit is then a dictionary look-up that the graph guards on: no graph break, also on a
    cold cache and with ``fullgraph=True``."""
    if isinstance(constraint, GROUP_SPECS):  # by value: fields that every supported torch passes as constants
        return _CIRCUITS[_ensure_described(_description(constraint), str(device), algorithm)][1]
    return _CIRCUITS[_ensure(constraint, str(device))][1]


def _assume_constant_result(fn):
    """``torch.compiler.assume_constant_result`` without its ``import torch._dynamo`` (about 1.5 s of
    ``import probmoe``): the mark dynamo looks for when it meets a call of ``fn``, set as
    ``torch._dynamo.decorators.assume_constant_result`` sets it (a test keeps the two equal)."""
    fn._dynamo_marked_constant = True
    return fn


def cardinality(n: int, kmin: int, kmax: int, device, algorithm: str = "circuit"):
    """The evaluator of kmin <= |S| <= kmax over n experts (``ExactlyK`` when kmin = kmax) by
    ``algorithm`` (``circuits.engine``): ``compiled``'s circuit, or the ``circuits.CardinalityDP``;
    input checks off, kept like the circuits.

    Under torch.compile the sizes are made static here (``operator.index`` makes dynamo guard on
    their values): dynamo turns a size that changed between calls into a symbol, but each size is
    another circuit."""
    n, kmin, kmax = operator.index(n), operator.index(kmin), operator.index(kmax)
    return _CIRCUITS[_ensure_cardinality(n, kmin, kmax, str(device), algorithm)][1]


@_assume_constant_result
def _ensure_cardinality(n: int, kmin: int, kmax: int, device: str, algorithm: str) -> tuple:
    if (n, kmin, kmax, device, algorithm) in _CIRCUITS:  # the common case: no spec to build and check
        return n, kmin, kmax, device, algorithm
    spec = circuits.ExactlyK(n, kmin) if kmin == kmax else circuits.RangeK(n, kmin, kmax)
    return _ensure(spec, device, (n, kmin, kmax, device, algorithm), algorithm)


def _description(spec) -> tuple:
    """A group spec as a tuple of python constants: ((field, value), ...), groups as a tuple. torch
    2.11's dynamo passes only such constants to an assume-constant function (a spec with its own
    ``__init__`` is not one there)."""
    return tuple(
        (name, tuple(value) if isinstance(value, list) else value)
        for name, value in circuits.spec_to_dict(spec).items()
    )


@_assume_constant_result
def _ensure_described(description: tuple, device: str, algorithm: str = "circuit") -> tuple:
    """``_ensure`` for the group spec ``description`` gives (``_description``), under a key of constants."""
    spec = circuits.spec_from_dict({name: list(v) if isinstance(v, tuple) else v for name, v in description})
    return _ensure(spec, device, ("described", description, device, algorithm), algorithm)


def native_cardinality(
    n: int, kmin: int, kmax: int, algorithm: str, dtype: torch.dtype = torch.float32, device="cpu"
) -> bool:
    """Whether routing logits of ``dtype`` on ``device`` over kmin..kmax of n by ``algorithm`` has fused
    kernels (``circuits.native_kernels`` of ``cardinality``'s evaluator: the C kernels for float32 on
    the CPU, the DP's Triton lattice kernels and the circuit's Triton passes for float32 on CUDA), a
    constant under torch.compile."""
    n, kmin, kmax = operator.index(n), operator.index(kmin), operator.index(kmax)
    return _native_cardinality(n, kmin, kmax, algorithm, str(dtype).removeprefix("torch."), str(device))


@_assume_constant_result
def _native_cardinality(n: int, kmin: int, kmax: int, algorithm: str, dtype: str, device: str) -> bool:
    """``native_cardinality`` on python constants (the dtype's and device's names)."""
    evaluator = cardinality(n, kmin, kmax, device, algorithm)
    return circuits.native_kernels(evaluator, getattr(torch, dtype))


def native_constraint(constraint, algorithm: str, dtype: torch.dtype = torch.float32, device="cpu") -> bool:
    """Whether routing logits of ``dtype`` on ``device`` under ``constraint`` by ``algorithm`` has fused
    kernels: for a group spec, ``circuits.native_kernels`` of ``compiled``'s evaluator (its circuit's C
    passes for float32 on the CPU; the circuit's Triton passes, or the group DP's Triton kernels, for
    float32 on CUDA); False for any other constraint (its route composes the operators). A constant
    under torch.compile."""
    if not isinstance(constraint, GROUP_SPECS):
        return False
    return _native_described(_description(constraint), algorithm, str(dtype).removeprefix("torch."), str(device))


@_assume_constant_result
def _native_described(description: tuple, algorithm: str, dtype: str, device: str) -> bool:
    """``native_constraint`` for the group spec ``description`` (``_description``), on python constants."""
    evaluator = _CIRCUITS[_ensure_described(description, device, algorithm)][1]
    return circuits.native_kernels(evaluator, getattr(torch, dtype))


@_assume_constant_result
def _ensure(constraint, device: str, key: tuple | None = None, algorithm: str = "circuit") -> tuple:
    """The key of ``constraint``'s evaluator on ``device`` in ``_CIRCUITS`` (a spec compares by value, a
    circuit by identity), compiling (or copying) it there first if needed: (constraint, evaluator)."""
    key = (constraint, device) if key is None else key
    if key not in _CIRCUITS:
        with _CIRCUITS_LOCK:
            if key not in _CIRCUITS:
                if isinstance(constraint, circuits.Circuit):
                    c = circuits.Circuit(constraint.layout, constraint.spec, constraint.info, device)
                else:  # compiled (from the disk cache), or the DP
                    c = circuits.engine(constraint, device, algorithm)
                c.validate = False
                _CIRCUITS[key] = (constraint, c)
    return key


class Allowed(dist_constraints.Constraint):
    """Binary vectors that satisfy a compiled constraint (the support of a constrained
    ``SubsetDistribution``). ``check``: [..., N] -> [...] bool, by one pass of the circuit in
    float64 at logits ±1e6 (log Z is 0 for an allowed vector and below -1e6 + N log 2 otherwise)."""

    is_discrete = True
    event_dim = 1
    SCALE = 1e6

    def __init__(self, circuit: circuits.Circuit, name: str):
        self.circuit, self.name = circuit, name
        super().__init__()

    def check(self, value: Tensor) -> Tensor:
        binary = ((value == 0) | (value == 1)).all(dim=-1)
        r = torch.where(value > 0, self.SCALE, -self.SCALE).to(torch.float64)
        with torch.no_grad():
            log_z = self.circuit.log_partition(r)
        return binary & (log_z > -self.SCALE / 2)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"
