"""``compile_circuit``: where the two halves of ``circuits`` meet, a spec compiled (or loaded from the
disk cache) by the compile side (``circuits.compiler``, no torch) and wrapped in the evaluator of
the other half (``Circuit``, on a device)."""

from __future__ import annotations

from .circuit import Circuit
from .compiler.compile import compile_entry


def compile_circuit(
    spec,
    *,
    cache_dir=None,
    force: bool = False,
    device="cpu",
    size_limit: bool = True,
    compiler: str | None = None,
    time_limit: float | None = None,
) -> Circuit:
    """Compile ``spec`` on first use; from then on load it from the disk cache (``compile_entry``),
    and evaluate it on ``device``.

    spec: ``ExactlyK``, ``RangeK``, ``GroupLimited``, ``GroupCapacity``, ``SddFile``, ``CnfFile``, a
        DIMACS path, or (sdd, vtree) paths.
    cache_dir: cache root, a str or os.PathLike (None, the default: ``circuits.cache.default_cache_dir()``).
    force: True recompiles and overwrites the cache entry; False (the default) loads it if cached.
        Either of a wrong type raises a one-line ValueError naming the argument.
    size_limit: refuse, before compiling, a counting spec whose estimated compile cost passes
        ``circuits.compiler.estimate.MAX_STEPS`` (about 20 s on a 2-core AMD EPYC), with a
        ``circuits.compiler.estimate.CircuitTooLarge`` (a ValueError) naming the estimate; False compiles
        anyway. A spec already in the cache loads whatever its size. File specs are never refused.
    compiler: None (the default: "direct" for counting specs, "d4" for a CNF, "pysdd" for an SDD
        file), "direct", "d4" or "pysdd" (see the module docstring). An entry compiled by a
        non-default compiler is cached beside the default one's. A CNF without d4 installed raises
        ``circuits.compiler.cnf.MissingExtra`` (an ImportError) naming the ``cnf`` extra; an unsatisfiable
        CNF raises ValueError.
    time_limit: seconds d4 may take on a CNF (None: no limit), the bound the size estimate cannot
        give for a CNF; past it the compile stops with ``circuits.compiler.cnf.TimeLimit`` (a RuntimeError).
        d4 runs in a child process, so Ctrl-C (KeyboardInterrupt) stops it at once, too. Only
        for compiler "d4": counting specs are bounded by ``size_limit``, pysdd runs in this process.

    ``circuit.info`` says what happened: ``cache_hit``, ``cache_path`` (None if compiled in
    memory), ``compile_seconds`` (this compile; on a hit the stored one), ``load_seconds`` (a hit's
    load and verification), ``compiler``, ``model_count``, and per compiler ``sdd_size`` /
    ``sdd_count`` / ``pysdd_version`` (pysdd) or ``d4_version`` / ``nnf_nodes`` (d4).
    """
    return Circuit(
        *compile_entry(
            spec, cache_dir=cache_dir, force=force, size_limit=size_limit, compiler=compiler, time_limit=time_limit
        ),
        device,
    )
