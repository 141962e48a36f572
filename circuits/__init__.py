"""circuits: compile constraints into probabilistic circuits once, evaluate them batched. Two halves:

the compile side (``circuits.compiler``: numpy and pysdd, no torch)
    spec (ExactlyK, RangeK, GroupLimited, GroupCapacity, SddFile, CnfFile) -> compile (count tree built
        directly for the cardinality and group specs; d4 d-DNNF for CNF; pysdd SDD on request)
        -> layout (levels) -> cache (disk)
the evaluation side (torch), joined to it by ``compile_circuit``
    -> Circuit (log_partition, marginals, sample, map)
        reached through registered torch operators (``circuits.ops``: torch.compile traces them)
        -> kernels (torch, fused C, Triton passes; ``circuits.kernels.select`` picks per device and dtype)

    ExactlyK / RangeK -> CardinalityDP (the same queries by the cardinality DP, nothing compiled;
        its torch, fused C or Triton sweeps picked by the same ``select``)
    GroupLimited / GroupCapacity -> GroupDP (the same queries by the group DP's two-level lattice,
        nothing compiled; torch sweeps)

Each evaluator is an ``Evaluator`` (``circuits.evaluator``: the shapes, checks and queries they
share); ``engine(constraint, device, algorithm)`` gives either ("circuit" or "dp", ``ALGORITHMS``).
Public modules shared with other packages: ``circuits.checks`` (the checks on logits and
generators, and their messages), ``circuits.ops`` (the registered operators, among them the row
operations ``topk``, ``topk_chosen``, ``kth_largest``), ``circuits.kernels.select`` (``select``,
the one place that picks an implementation, and ``describe``), ``circuits.kernels.build`` (the C
build machinery), ``circuits.kernels.straight_through`` (Eq. 7's weights and their gradient, in
torch) and ``ScratchPool`` (reused scratch buffers for batched passes).

The names load on first use (PEP 562), so that compiling (``circuits.compiler.compile.compile_entry``,
``probmoe-compile``) runs without importing torch. The operators are registered when
``circuits.ops`` is imported, which every evaluator does (``Circuit``, ``CardinalityDP``, ``GroupDP``,
``engine``); code that calls ``torch.ops.circuits.*`` directly imports ``circuits.ops`` first.
"""

import importlib

_HOMES = {  # public name -> the module that defines it (None: a public module of that name)
    "checks": None,
    "ops": None,
    "CacheWarning": "compiler.cache",
    "default_cache_dir": "cache_dir",
    "Circuit": "circuit",
    "compile_circuit": "compile",
    "compile_sdd": "compiler.compile",
    "compile_entry": "compiler.compile",
    "CardinalityDP": "dp",
    "GroupDP": "dp",
    "Evaluator": "evaluator",
    "map_mask": "dp",
    "map_size": "dp",
    "ALGORITHMS": "algorithm",
    "check_algorithm": "algorithm",
    "engine": "algorithm",
    "native_kernels": "algorithm",
    "Layout": "layout",
    "build_layout": "layout",
    "ScratchPool": "kernels.scratch",
    "IMPLEMENTATIONS": "kernels.select",
    "implementation": "kernels.select",
    **{
        name: "spec"
        for name in (
            "CARDINALITY_SPECS",
            "GROUP_SPECS",
            "SPECS",
            "CnfFile",
            "ExactlyK",
            "GroupCapacity",
            "GroupLimited",
            "RangeK",
            "SddFile",
            "Spec",
            "register",
            "spec_from_dict",
            "spec_to_dict",
        )
    },
}


def __getattr__(name: str):
    """Load a public name's module on first use (PEP 562) and keep the name here."""
    if name not in _HOMES:
        raise AttributeError(f"module 'circuits' has no attribute {name!r}")
    home = _HOMES[name]
    module = importlib.import_module(f".{home or name}", __name__)
    value = module if home is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


__all__ = [
    "ALGORITHMS",
    "CARDINALITY_SPECS",
    "GROUP_SPECS",
    "IMPLEMENTATIONS",
    "SPECS",
    "CacheWarning",
    "CardinalityDP",
    "Circuit",
    "CnfFile",
    "Evaluator",
    "ExactlyK",
    "GroupCapacity",
    "GroupDP",
    "GroupLimited",
    "Layout",
    "RangeK",
    "ScratchPool",
    "SddFile",
    "Spec",
    "build_layout",
    "check_algorithm",
    "checks",
    "compile_circuit",
    "compile_entry",
    "compile_sdd",
    "default_cache_dir",
    "engine",
    "implementation",
    "map_mask",
    "map_size",
    "native_kernels",
    "ops",
    "register",
    "spec_from_dict",
    "spec_to_dict",
]
