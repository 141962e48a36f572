"""The cardinality DP: ``ExactlyK`` and ``RangeK`` evaluated without compiling a circuit, behind the
queries of ``circuits.Circuit``. The second algorithm of ``circuits`` beside the compiled circuit;
``circuits.passes.select`` picks the implementation of both.

    cardinality.py  CardinalityDP (the queries: log Z, marginals + Cov(z) v, sample, MAP, log counts
                    by size) and Lattice (what ``select`` picks the DP's kernels from)
    torch_dp.py     the sweeps in plain torch (the meaning, and the oracle of the C sweeps); TorchDP
    c_dp.py         CDP: the sweeps fused in C for float32 on the CPU (``native/c/cardinality.c``)
    map_rule.py     the MAP of a cardinality constraint in closed form (top logits)

The kernels run inside the operators ``circuits::dp_marginals`` and ``circuits::dp_cov_vec``
(``circuits.ops``), so torch.compile traces them without a graph break.
"""

from .c_dp import CDP
from .cardinality import SPECS, CardinalityDP, Lattice
from .map_rule import map_mask, map_size
from .torch_dp import TorchDP

__all__ = ["CDP", "SPECS", "CardinalityDP", "Lattice", "TorchDP", "map_mask", "map_size"]
