"""``engine``: the evaluator of a constraint by one of the two algorithms, behind one set of queries
(``circuits.evaluator.Evaluator``: log_partition, marginals with their Cov(z) v backward, sample,
map, marginals_and_sample).

    "circuit"  the compiled circuit (``compile_circuit``: any spec, from the disk cache)
    "dp"       a dynamic program, nothing compiled: the cardinality DP (``CardinalityDP``) for
               ExactlyK and RangeK, the group DP (``GroupDP``) for GroupLimited and GroupCapacity

Each then runs the implementation ``circuits.kernels.select`` picks for the logits' device and
dtype (torch, fused C, Triton). ``ALGORITHMS`` is the one list of the algorithms' names.
"""

from __future__ import annotations

import torch

from .circuit import Circuit
from .compile import compile_circuit
from .dp import SPECS as DP_SPECS
from .dp import CardinalityDP, GroupDP
from .evaluator import Evaluator
from .spec import GROUP_SPECS, Spec

ALGORITHMS = ("circuit", "dp")


def check_algorithm(algorithm, constraint=None) -> str:
    """``algorithm`` if it is one of ``ALGORITHMS`` and evaluates ``constraint`` (a spec or a
    ``Circuit``; None: a cardinality constraint), else ValueError naming it."""
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if algorithm == "dp" and constraint is not None and not isinstance(constraint, DP_SPECS):
        raise ValueError(
            f"the DPs evaluate only ExactlyK, RangeK, GroupLimited and GroupCapacity; {_name(constraint)} "
            "needs algorithm 'circuit'"
        )
    return algorithm


def engine(constraint: Spec | Circuit, device="cpu", algorithm: str = "circuit", **compile_args) -> Evaluator:
    """The evaluator of ``constraint`` (a spec, or a compiled ``Circuit``, then moved to ``device``)
    on ``device`` by ``algorithm``; ``compile_args`` go to ``compile_circuit`` (cache_dir,
    size_limit, ...)."""
    device = check_device(device)
    check_algorithm(algorithm, constraint.spec if isinstance(constraint, Circuit) else constraint)
    if algorithm == "dp":
        spec = constraint.spec if isinstance(constraint, Circuit) else constraint
        return GroupDP(spec, device) if isinstance(spec, GROUP_SPECS) else CardinalityDP(spec, device)
    if isinstance(constraint, Circuit):
        return constraint if str(constraint.device) == str(device) else constraint.to(device)
    return compile_circuit(constraint, device=device, **compile_args)


def check_device(device) -> torch.device:
    """``device`` (a ``torch.device``, or what it takes: "cpu", "cuda:0", an index) as a
    ``torch.device``, else ValueError naming it (an algorithm's name in its place says so)."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str) and device in ALGORITHMS:
        raise ValueError(f"device must be a torch device, got {device!r}, an algorithm: pass algorithm={device!r}")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda:0', got {device!r}") from None


def _name(constraint) -> str:
    describe = getattr(constraint, "describe", None)
    return describe() if describe is not None else type(constraint).__name__


def native_kernels(evaluator: Evaluator, dtype: torch.dtype) -> bool:
    """Whether the kernels ``select`` gives ``evaluator`` for logits of ``dtype`` on its device fuse the
    fused queries (``Kernels.fused``: the C DP's sweeps or the Triton lattice kernels for a
    ``circuits.CardinalityDP``, the C passes or the Triton passes for a ``circuits.Circuit``): there
    ``circuits::chosen_scores`` and its backward are one pass each."""
    return evaluator.kernels(dtype).fused


# Under torch.compile the answer is a constant of the graph (the mark of
# torch.compiler.assume_constant_result, set without importing torch._dynamo, as
# probmoe.constraints does): dynamo calls it while tracing instead of tracing through ``select``.
native_kernels._dynamo_marked_constant = True
