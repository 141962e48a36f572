"""Compile a constraint spec into a pysdd SDD.

Cardinality constraints are built bottom-up over a balanced vtree as "exactly j of this block"
(Eq(block, j) = OR_a Eq(left, a) AND Eq(right, j - a)), counts capped at kmax; a range is the
OR over the band. Group constraints are built the same way on a vtree that follows the groups,
with (count, nonempty groups) states above them (``circuits.groups``). This takes milliseconds
where compiling the equivalent CNF takes seconds.

Before any pysdd work ``compile_circuit`` estimates the size (``circuits.estimate``): it refuses a
spec past ``estimate.MAX_STEPS`` unless told ``size_limit=False``, and shows tqdm progress bars on
stderr for one past ``estimate.PROGRESS_STEPS`` (about a second; tqdm is optional).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import sys
import tempfile
import time
from pathlib import Path

from pysdd.sdd import SddManager, SddNode, Vtree

from . import cache, estimate, file_checks, groups, self_check
from .circuit import Circuit
from .groups import Progress
from .layout import build_layout
from .spec import GROUP_SPECS, CnfFile, ExactlyK, RangeK, SddFile, Spec

SPECS = (ExactlyK, RangeK, SddFile, CnfFile, *GROUP_SPECS)
SPEC_NAMES = "ExactlyK, RangeK, SddFile, CnfFile, GroupLimited, GroupCapacity"


def balanced_vtree(n: int) -> Vtree:
    """A balanced vtree over variables 1..n in natural order (depth ceil(log2 n))."""
    return Vtree(var_count=n, var_order=list(range(1, n + 1)), vtree_type="balanced")


def compile_sdd(spec: Spec, progress: Progress | None = None) -> tuple[SddManager, SddNode]:
    """Build the SDD of ``spec``; returns the manager (keep it alive) and the root node.
    ``progress`` (counting specs only) is told the compile steps done (``circuits.estimate``)."""
    if isinstance(spec, (ExactlyK, RangeK)):
        lo, hi = (spec.k, spec.k) if isinstance(spec, ExactlyK) else (spec.kmin, spec.kmax)
        mgr = SddManager.from_vtree(balanced_vtree(spec.n))
        mgr.auto_gc_and_minimize_off()
        counts = groups.exactly_counts(mgr, mgr.vtree(), hi, progress)
        root = mgr.false()
        for j in range(lo, hi + 1):
            root = root | counts[j]
        return mgr, root
    if isinstance(spec, SddFile):
        file_checks.check_sdd_pair(spec.sdd, spec.vtree)
        mgr = SddManager.from_vtree(Vtree.from_file(spec.vtree.encode()))
        root = mgr.read_sdd_file(spec.sdd.encode())
        return mgr, root
    if isinstance(spec, CnfFile):
        file_checks.check_dimacs(spec.path)
        vtree_type = b"balanced"
        mgr, root = SddManager.from_cnf_file(spec.path.encode(), vtree_type)
        return mgr, root
    if isinstance(spec, GROUP_SPECS):
        return groups.build_grouped(spec, progress)
    raise TypeError(f"spec must be {SPEC_NAMES}, got {type(spec).__name__}")


def _as_spec(spec) -> Spec:
    """Accept a spec, a DIMACS path (str / PathLike), or a (sdd path, vtree path) pair."""
    if isinstance(spec, SPECS):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        return CnfFile(os.fspath(spec))
    if isinstance(spec, tuple) and len(spec) == 2:
        return SddFile(*map(os.fspath, spec))
    raise ValueError(
        f"spec must be {SPEC_NAMES}, a DIMACS file path or an (sdd, vtree) path pair; got {spec!r}"
    )


def _sdd_files(mgr: SddManager, root: SddNode) -> dict[str, bytes]:
    """The SDD in libsdd's .sdd / .vtree formats and as DOT, as bytes."""
    with tempfile.TemporaryDirectory() as d:
        sdd, vtree = os.path.join(d, "c.sdd"), os.path.join(d, "c.vtree")
        mgr.save(sdd.encode(), root)
        mgr.vtree().save(vtree.encode())
        out = {"circuit.sdd": Path(sdd).read_bytes(), "circuit.vtree": Path(vtree).read_bytes()}
    out["circuit.dot"] = root.dot().encode() if not (root.is_true() or root.is_false()) else b"digraph sdd {}\n"
    return out


@contextlib.contextmanager
def _progress(show: bool, total: int, desc: str, unit: str):
    """A tqdm bar's ``update`` on stderr while the block runs; None when not ``show`` or without tqdm."""
    if not show:
        yield None
        return
    try:
        from tqdm import tqdm  # an optional extra: imported only for a long compile
    except ImportError:
        yield None
        return
    with tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr, leave=False) as bar:
        yield bar.update


def compile_circuit(spec, *, cache_dir=None, force: bool = False, device="cpu", size_limit: bool = True) -> Circuit:
    """Compile ``spec`` on first use with pysdd; from then on load it from the disk cache.

    spec: ``ExactlyK``, ``RangeK``, ``GroupLimited``, ``GroupCapacity``, ``SddFile``, ``CnfFile``, a
        DIMACS path, or (sdd, vtree) paths.
    cache_dir: cache root (default: ``circuits.cache.default_cache_dir()``).
    force: recompile and overwrite the cache entry.
    size_limit: refuse, before any pysdd work, a spec whose estimated compile cost passes
        ``circuits.estimate.MAX_STEPS`` (about 20 s on a 2-core AMD EPYC), with a
        ``circuits.estimate.CircuitTooLarge`` (a ValueError) naming the estimate; False compiles
        anyway. A spec already in the cache loads whatever its size. File specs are never refused.

    ``circuit.info`` says what happened: ``cache_hit``, ``cache_path`` (None if compiled in
    memory), ``compile_seconds``, ``sdd_size``, ``sdd_count``, ``model_count``, ``pysdd_version``.
    """
    if not isinstance(size_limit, bool):
        raise ValueError(f"size_limit must be True or False, got {size_limit!r}")
    spec = _as_spec(spec)
    t0 = time.perf_counter()
    if not force:
        hit = cache.load(spec, cache_dir)
        if hit is not None:
            layout, manifest = hit
            info = {**manifest, "cache_hit": True, "cache_path": str(cache.entry_dir(spec, cache_dir)),
                    "load_seconds": time.perf_counter() - t0}
            return Circuit(layout, spec, info, device)
    insist = "pass size_limit=False to compile_circuit to compile it anyway"
    est = estimate.check(spec, insist) if size_limit else estimate.estimate(spec)
    long = est is not None and est.steps > estimate.PROGRESS_STEPS
    with _progress(long, est.state_steps if long else 0, f"compiling {spec.describe()}", "step") as tick:
        mgr, root = compile_sdd(spec, tick)
    with _progress(long, est.nodes if long else 0, "layout", "node") as tick:
        layout = build_layout(mgr, root, tick)
    seconds = time.perf_counter() - t0
    manifest = cache.make_manifest(spec, layout, {
        "compile_seconds": seconds,
        "sdd_size": root.size(),
        "sdd_count": root.count(),
        "pysdd_version": _pysdd_version(),
        **({"vtree": "grouped"} if isinstance(spec, GROUP_SPECS) else {}),
    })
    expected = spec.model_count()
    if expected is not None and int(manifest["model_count"]) != expected:
        raise RuntimeError(f"compiled model count {manifest['model_count']} != {expected} for {spec.describe()}")
    self_check.check(layout, spec)  # a self-check against an independent computation
    if isinstance(spec, GROUP_SPECS):
        groups.self_check(layout, spec)
    path = cache.store(spec, layout, _sdd_files(mgr, root), manifest, cache_dir, replace=force)
    info = {**manifest, "cache_hit": False, "cache_path": None if path is None else str(path)}
    return Circuit(layout, spec, info, device)


def _pysdd_version() -> str:
    try:
        return importlib.metadata.version("pysdd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
