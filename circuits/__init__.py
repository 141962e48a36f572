"""circuits: compile constraints into probabilistic circuits once, evaluate them batched.

    spec (ExactlyK, RangeK, GroupLimited, GroupCapacity, SddFile, CnfFile) -> compile (pysdd SDD)
        -> layout (levels)
        -> cache (disk) -> Circuit (log_partition, marginals, sample, map)
        -> passes (torch, fused C; ``circuits.passes.select`` picks per device and dtype)

Building blocks for other exact models of distributions over binary vectors: ``ExactMarginals``
(the autograd contract: marginals and a draw, backward Cov(x) v, keeps O(T n)) and
``ScratchPool`` (reused scratch buffers for batched passes).
"""

from .autograd import ExactMarginals
from .cache import CacheWarning
from .cache_dir import default_cache_dir
from .circuit import Circuit
from .compile import compile_circuit, compile_sdd
from .layout import Layout, build_layout
from .passes.scratch import ScratchPool
from .spec import CnfFile, ExactlyK, GroupCapacity, GroupLimited, RangeK, SddFile, spec_from_dict, spec_to_dict

__all__ = [
    "CacheWarning",
    "Circuit",
    "CnfFile",
    "ExactMarginals",
    "ExactlyK",
    "GroupCapacity",
    "GroupLimited",
    "Layout",
    "RangeK",
    "ScratchPool",
    "SddFile",
    "build_layout",
    "compile_circuit",
    "compile_sdd",
    "default_cache_dir",
    "spec_from_dict",
    "spec_to_dict",
]
