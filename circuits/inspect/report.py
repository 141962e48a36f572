"""What ``probmoe-compile`` reports about a circuit: the facts as a dict, and as text.

The model count is an exact Python integer (``Layout.model_count``), never pysdd's
``global_model_count``, which is an unsigned 64-bit integer and wraps silently. It is checked
against the count the spec's kind knows (``model_count``, with its closed form ``count_formula``):
``math.comb`` for ``ExactlyK`` / ``RangeK``, a dynamic program over the groups in ``math.comb``
terms for the group specs (``circuits.spec.group_model_count``); file specs have none.
"""

from __future__ import annotations

from ..compiler.registry import spec_to_dict
from ..kernels import build
from ..kernels.library import LIBRARY
from .text import level_table


def evaluator() -> str:
    """Which passes fp32 CPU calls will take, without loading or building the C library (a compile
    must not pay for that, nor load torch): "fused C passes (avx2, prebuilt in the installed
    package: ...)" when a wheel ships the library for this CPU's ISA and these sources, else "fused
    C passes (avx2, built on first use into ...)" when a compiler is there to build it, else "torch
    passes (why not C)"."""
    isa, why = build.chosen_isa()
    if isa is None:
        return f"torch passes (C passes {why})"
    shipped = LIBRARY.prebuilt_path(isa)
    if shipped is not None:
        return f"fused C passes ({isa}, prebuilt in the installed package: {shipped.parent})"
    _, isa, why = build.choice()
    if isa is None:
        return f"torch passes (C passes {why})"
    where = build.build_dir()
    if not build.writable(where):
        return (
            f"fused C passes ({isa}, built on first use into a temporary folder for each process: {where} is "
            "not writable)"
        )
    return f"fused C passes ({isa}, built on first use into {where})"


def compile_facts(circuit, warnings: list[str] = ()) -> dict:
    """The JSON-able facts about a compiled ``circuit`` (a ``Circuit`` or the ``compile_entry`` it
    wraps: its ``layout``, ``spec``, ``info`` and ``sizes()``).

    ``model_count`` is a decimal string (exact; JSON readers may not hold big integers);
    ``model_count_checked`` says whether it was compared with ``math.comb`` (and matched:
    a mismatch raises RuntimeError). Timings are in seconds and say what this run did:
    ``seconds`` is this run's (the load on a cache hit, the compile otherwise); ``compile_seconds``
    is this run's compile (None on a hit), ``load_seconds`` its load (None unless a hit), and
    ``stored_compile_seconds`` the compile time the entry recorded (None unless a hit).
    """
    info, spec = circuit.info, circuit.spec
    count = int(info["model_count"])
    expected = spec.model_count()
    if expected is not None and expected != count:
        raise RuntimeError(f"model count {count} of {spec.describe()} != {expected} from math.comb")
    return {
        "spec": {**spec_to_dict(spec), "describe": spec.describe()},
        "status": "cache hit" if info["cache_hit"] else "compiled",
        "cache_hit": bool(info["cache_hit"]),
        "cache_path": info.get("cache_path"),
        "seconds": info["load_seconds"] if info["cache_hit"] else info["compile_seconds"],
        "compile_seconds": None if info["cache_hit"] else info["compile_seconds"],
        "load_seconds": info.get("load_seconds") if info["cache_hit"] else None,
        "stored_compile_seconds": info["compile_seconds"] if info["cache_hit"] else None,
        "compiler": info.get("compiler", "pysdd"),
        "sdd_size": info.get("sdd_size"),
        "sdd_count": info.get("sdd_count"),
        "nnf_nodes": info.get("nnf_nodes"),
        "vtree": info.get("vtree", "balanced"),
        "sizes": circuit.sizes(),
        "levels": circuit.layout.levels(),
        "model_count": str(count),
        "log_model_count": info["log_model_count"],
        "model_count_checked": expected is not None,
        "model_count_formula": spec.count_formula(),
        "pysdd_version": info.get("pysdd_version"),
        "d4_version": info.get("d4_version"),
        "evaluator": evaluator(),  # fp32 on the CPU; fp64 and CUDA use the torch passes
        "warnings": list(warnings),
    }


def _seconds(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def _compiler_name(f: dict) -> str:
    if f["compiler"] == "pysdd":
        return f"pysdd {f['pysdd_version']}"
    if f["compiler"] == "d4":
        return f"d4 {f['d4_version']}"
    return "count tree, built directly"


def _compiler_line(f: dict) -> str:
    """What the compiler built: the SDD (pysdd), the d-DNNF (d4) or the count tree (direct)."""
    if f["compiler"] == "pysdd":
        return f"  SDD          size {f['sdd_size']:,}, {f['sdd_count']:,} decision nodes ({f['vtree']} vtree)"
    if f["compiler"] == "d4":
        return f"  d-DNNF       {f['nnf_nodes']:,} nodes from d4, smoothed into the layout"
    return (
        f"  SDD          the pruned SDD of the count tree ({f['vtree']} vtree), built directly "
        "(--compiler pysdd keeps the whole SDD)"
    )


def render_compile(facts: dict) -> str:
    """The text ``probmoe-compile`` prints: what was built, its sizes, count, timings, cache path."""
    f, s = facts, facts["sizes"]
    if f["cache_hit"]:
        head = (
            f"cache hit: loaded {f['spec']['describe']} in {_seconds(f['load_seconds'])} "
            f"(compiling it took {_seconds(f['stored_compile_seconds'])})"
        )
    else:
        head = f"compiled {f['spec']['describe']} in {_seconds(f['compile_seconds'])} ({_compiler_name(f)})"
    if f["model_count_checked"]:
        count = f"{f['model_count']} = {f['model_count_formula']}, checked against math.comb"
    else:
        count = f"{f['model_count']} (exact; no closed form to check against)"
    cache = f["cache_path"] or "not written (see the warning above)"
    lines = [
        head,
        _compiler_line(f),
        f"  layout       {s['levels']} levels ({s['groups']} groups), {s['nodes']:,} nodes, "
        f"{s['elements']:,} elements, {s['padded_elements']:,} padded: padding {s['padding']:.2f}x",
        f"  model count  {count}",
        f"  cache        {cache}{'' if f['cache_hit'] or not f['cache_path'] else ' (written)'}",
        f"  evaluator    fp32 on the CPU: {f['evaluator']}",
        "",
        level_table(f["levels"]),
    ]
    return "\n".join(lines) + "\n"
