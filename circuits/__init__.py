"""circuits: compile constraints into probabilistic circuits once, evaluate them batched.

    spec (ExactlyK, RangeK, GroupLimited, GroupCapacity, SddFile, CnfFile) -> compile (count tree built
        directly for the cardinality and group specs; d4 d-DNNF for CNF; pysdd SDD on request)
        -> layout (levels)
        -> cache (disk) -> Circuit (log_partition, marginals, sample, map)
        -> passes (torch, fused C, Triton; ``circuits.passes.select`` picks per device and dtype)
        reached through registered torch operators (``circuits.ops``: torch.compile traces them)

    ExactlyK / RangeK -> CardinalityDP (the same queries by the cardinality DP, nothing compiled;
        its torch or fused C sweeps picked by the same ``select``)

``engine(constraint, device, algorithm)`` gives either evaluator ("circuit" or "dp",
``ALGORITHMS``). Public modules shared with other packages: ``circuits.checks`` (the checks on
logits and generators, and their messages), ``circuits.ops`` (the registered operators, among them
the row operations ``topk``, ``topk_chosen``, ``kth_largest``), ``circuits.native`` (the C build
machinery, counter-based uniforms) and ``ScratchPool`` (reused scratch buffers for batched passes).
"""

from . import checks, ops  # ops registers torch.ops.circuits
from .cache import CacheWarning
from .cache_dir import default_cache_dir
from .circuit import Circuit
from .compile import compile_circuit, compile_sdd
from .dp import CardinalityDP, map_mask, map_size
from .algorithm import ALGORITHMS, check_algorithm, engine
from .layout import Layout, build_layout
from .passes.scratch import ScratchPool
from .spec import (
    CARDINALITY_SPECS,
    GROUP_SPECS,
    SPECS,
    CnfFile,
    ExactlyK,
    GroupCapacity,
    GroupLimited,
    RangeK,
    SddFile,
    spec_from_dict,
    spec_to_dict,
)

__all__ = [
    "ALGORITHMS",
    "CARDINALITY_SPECS",
    "CacheWarning",
    "CardinalityDP",
    "Circuit",
    "CnfFile",
    "ExactlyK",
    "GROUP_SPECS",
    "GroupCapacity",
    "GroupLimited",
    "Layout",
    "RangeK",
    "SPECS",
    "ScratchPool",
    "SddFile",
    "build_layout",
    "check_algorithm",
    "checks",
    "compile_circuit",
    "compile_sdd",
    "default_cache_dir",
    "engine",
    "map_mask",
    "map_size",
    "ops",
    "spec_from_dict",
    "spec_to_dict",
]
