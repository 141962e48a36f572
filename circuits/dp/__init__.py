"""The dynamic programs: constraints evaluated without compiling a circuit, behind the queries of
``circuits.Circuit``. The second algorithm of ``circuits`` beside the compiled circuit.

    cardinality.py  CardinalityDP: ExactlyK and RangeK (log Z, marginals + Cov(z) v, sample, MAP, log
                    counts by size) through the ``dp_`` operators of ``circuits.ops``
    grouped.py      GroupDP: GroupLimited and GroupCapacity by a two-level lattice, through the
                    circuit operators of ``circuits.ops``
    map_rule.py     the MAP of a cardinality constraint in closed form (top logits)

Their sweeps are kernels: ``circuits.kernels.torch_dp``, ``c_dp``, ``triton_dp`` and
``torch_groups``, picked by ``circuits.kernels.select`` from a ``circuits.kernels.lattice.Lattice``
or ``GroupLattice``.
"""

from ..spec import CARDINALITY_SPECS, GROUP_SPECS
from .cardinality import CardinalityDP
from .grouped import GroupDP
from .map_rule import map_mask, map_size

SPECS = (*CARDINALITY_SPECS, *GROUP_SPECS)  # the constraints a DP evaluates

__all__ = ["SPECS", "CardinalityDP", "GroupDP", "map_mask", "map_size"]
