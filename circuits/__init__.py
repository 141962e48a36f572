"""circuits: compile constraints into probabilistic circuits once, evaluate them batched.

    spec (ExactlyK, RangeK, SddFile, CnfFile) -> compile (pysdd SDD) -> layout (levels)
        -> cache (disk) -> Circuit (torch: log_partition, marginals, sample, map)
"""

from .cache import CacheWarning, default_cache_dir
from .compile import compile_circuit, compile_sdd
from .evaluate import Circuit
from .layout import Layout, build_layout
from .spec import CnfFile, ExactlyK, RangeK, SddFile

__all__ = [
    "CacheWarning",
    "Circuit",
    "CnfFile",
    "ExactlyK",
    "Layout",
    "RangeK",
    "SddFile",
    "build_layout",
    "compile_circuit",
    "compile_sdd",
    "default_cache_dir",
]
