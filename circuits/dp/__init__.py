"""The cardinality DP: ``ExactlyK`` and ``RangeK`` evaluated without compiling a circuit, behind the
queries of ``circuits.Circuit``. The second algorithm of ``circuits`` beside the compiled circuit.

    cardinality.py  CardinalityDP: the queries (log Z, marginals + Cov(z) v, sample, MAP, log
                    counts by size) through the ``dp_`` operators of ``circuits.ops``
    map_rule.py     the MAP of a cardinality constraint in closed form (top logits)

Its sweeps (torch and fused C) are kernels: ``circuits.kernels.torch_dp`` and ``c_dp``, picked by
``circuits.kernels.select`` from a ``circuits.kernels.lattice.Lattice``.
"""

from .cardinality import SPECS, CardinalityDP
from .map_rule import map_mask, map_size

__all__ = ["SPECS", "CardinalityDP", "map_mask", "map_size"]
