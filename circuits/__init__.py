"""circuits: compile constraints into probabilistic circuits once, evaluate them batched.

    spec (ExactlyK, RangeK, GroupLimited, GroupCapacity, SddFile, CnfFile) -> compile (pysdd SDD)
        -> layout (levels)
        -> cache (disk) -> Circuit (log_partition, marginals, sample, map)
        -> passes (torch, fused C, Triton; ``circuits.passes.select`` picks per device and dtype)
        reached through registered torch operators (``circuits.ops``: torch.compile traces them)

Shared with other packages: ``circuits.native`` (the C build machinery, row top-k, counter-based
uniforms) and ``ScratchPool`` (reused scratch buffers for batched passes).
"""

from . import ops  # registers torch.ops.circuits
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
