"""Compile a constraint spec into the level layout the evaluators take, with one of three compilers.

Each kind names the compilers that build it, its default first (``spec.compilers``), and gives
each one its input (``circuits.compiler.registry``; what each kind does: ``circuits.compiler.kinds``):

- ``"direct"`` (the default for ``ExactlyK``, ``RangeK``, ``GroupLimited``, ``GroupCapacity``):
  the kind's ``build_direct``, the count tree built from its known structure
  (``circuits.compiler.count_tree``), the pruned canonical SDD, without pysdd; exactly 128 of 1,024 in well
  under a second.
- ``"d4"`` (the default for ``CnfFile``): the d-DNNF compiler d4 (``circuits.compiler.cnf``, the ``cnf``
  extra) on the kind's ``dimacs_path``, flattened and smoothed into the layout (``circuits.compiler.nnf``).
- ``"pysdd"``: the kind's ``build_sdd``, an SDD built with pysdd, then flattened
  (``circuits.layout.build_layout``): for counting specs "exactly j of this block" OR-ed bottom-up
  over a balanced vtree (the group specs over ``circuits.compiler.groups.group_vtree``); a CNF through
  ``SddManager.from_cnf_file`` on a balanced vtree; an ``SddFile`` read as it is (its only
  compiler). The cache entry then holds the SDD too (``circuit.sdd``, ``circuit.vtree``, DOT).

After compiling, the layout's model count is checked against the kind's ``model_count`` and its
log Z against the kind's ``check``.

Before compiling ``compile_circuit`` estimates the cost (the kind's ``estimate``, per compiler:
``circuits.compiler.estimate``; file specs have none): it refuses a spec past ``estimate.MAX_STEPS``
unless told ``size_limit=False``, and shows tqdm progress bars on stderr for one past
``estimate.PROGRESS_STEPS`` (about a second; tqdm is optional).

Compiling needs numpy and pysdd, not torch: ``compile_entry`` gives the layout and what happened
without loading torch (``probmoe-compile`` uses it, so its start-up is Python's and numpy's);
``compile_circuit`` wraps the same in a ``Circuit``, the evaluator.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from pysdd.sdd import SddManager, SddNode

from ..layout import Layout, build_layout
from . import cache, cnf, estimate, nnf, self_check
from .kinds.files import CnfFile, SddFile
from .registry import Progress, Spec, kind_names, registered

COMPILERS = ("direct", "d4", "pysdd")


def default_compiler(spec: Spec) -> str:
    """The compiler a spec's kind names first: "direct" for the counting specs, "d4" for a CNF,
    "pysdd" for an SDD file."""
    return spec.compilers[0]


def check_compiler(spec: Spec, compiler) -> str:
    """``compiler`` (None: the spec's default) if it can compile ``spec``, else ValueError."""
    if compiler is None:
        return default_compiler(spec)
    if compiler not in spec.compilers:
        raise ValueError(
            f"compiler must be one of {', '.join(map(repr, spec.compilers))} for {type(spec).__name__} "
            f"(or None for {default_compiler(spec)!r}), got {compiler!r}"
        )
    return compiler


def check_cache_dir(cache_dir) -> None:
    """ValueError unless ``cache_dir`` is None (the default root) or a path (a str or os.PathLike
    naming a directory, not an empty string)."""
    if cache_dir is None:
        return
    path = os.fspath(cache_dir) if isinstance(cache_dir, os.PathLike) else cache_dir
    if not isinstance(path, str) or not path:
        raise ValueError(
            f"cache_dir must be None (the default cache root) or a directory path (str or os.PathLike), got {cache_dir!r}"
        )


def compile_sdd(spec: Spec, progress: Progress | None = None) -> tuple[SddManager, SddNode]:
    """Build the SDD of ``spec`` (a kind compiled by "pysdd"); returns the manager (keep it alive)
    and the root node. ``progress`` (counting specs only) is told the compile steps done
    (``circuits.compiler.estimate``)."""
    if not registered(spec) or "pysdd" not in spec.compilers:
        raise TypeError(f"spec must be {kind_names(', ')} (a kind compiled by pysdd), got {type(spec).__name__}")
    return spec.build_sdd(progress)


def _as_spec(spec) -> Spec:
    """Accept a spec, a DIMACS path (str / PathLike), or a (sdd path, vtree path) pair."""
    if registered(spec):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        return CnfFile(os.fspath(spec))
    if isinstance(spec, tuple) and len(spec) == 2:
        return SddFile(*map(os.fspath, spec))
    raise ValueError(f"spec must be {kind_names(', ')}, a DIMACS file path or an (sdd, vtree) path pair; got {spec!r}")


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


class Entry(NamedTuple):
    """A compiled (or loaded) circuit before it is an evaluator: its layout, its spec and ``info``
    (what ``circuits.compile.compile_circuit`` documents)."""

    layout: Layout
    spec: Spec
    info: dict

    def sizes(self) -> dict:
        """The layout's sizes (``Layout.sizes``)."""
        return self.layout.sizes()


def compile_entry(
    spec,
    *,
    cache_dir=None,
    force: bool = False,
    size_limit: bool = True,
    compiler: str | None = None,
    time_limit: float | None = None,
) -> Entry:
    """Compile ``spec`` on first use; from then on load it from the disk cache: ``Entry(layout,
    spec, info)``, without the evaluator (torch is not imported). The arguments and ``info`` as
    ``circuits.compile.compile_circuit`` documents them, which wraps the entry in a ``Circuit``."""
    check_cache_dir(cache_dir)
    if not isinstance(force, bool):
        raise ValueError(f"force must be True or False, got {force!r}")
    if not isinstance(size_limit, bool):
        raise ValueError(f"size_limit must be True or False, got {size_limit!r}")
    spec = _as_spec(spec)
    compiler = check_compiler(spec, compiler)
    if time_limit is not None and compiler != "d4":
        raise ValueError(
            f"time_limit applies to a CNF compiled by d4 (in a child process it can stop), not to "
            f"compiler {compiler!r}: counting specs are bounded by size_limit; got {time_limit!r}"
        )
    variant = None if compiler == default_compiler(spec) else compiler
    t0 = time.perf_counter()
    if not force:
        hit = cache.load(spec, cache_dir, variant)
        if hit is not None:
            layout, manifest = hit
            info = {
                **manifest,
                "cache_hit": True,
                "cache_path": str(cache.entry_dir(spec, cache_dir, variant)),
                "load_seconds": time.perf_counter() - t0,
            }
            return Entry(layout, spec, info)
    insist = "pass size_limit=False to compile_circuit to compile it anyway"
    est = estimate.check(spec, insist, compiler) if size_limit else estimate.estimate(spec, compiler)
    long = est is not None and est.steps > estimate.PROGRESS_STEPS
    if compiler == "direct":
        with _progress(long, est.elements if long else 0, f"compiling {spec.describe()}", "element") as tick:
            layout = _direct(spec, tick)
        files, extra = {}, {}
    elif compiler == "d4":
        layout, files, extra = _d4(spec, time_limit)
    else:
        with _progress(long, est.state_steps if long else 0, f"compiling {spec.describe()}", "step") as tick:
            mgr, root = compile_sdd(spec, tick)
        with _progress(long, est.nodes if long else 0, "layout", "node") as tick:
            layout = build_layout(mgr, root, tick)
        files = _sdd_files(mgr, root)
        extra = {"sdd_size": root.size(), "sdd_count": root.count(), "pysdd_version": _pysdd_version()}
    seconds = time.perf_counter() - t0
    manifest = cache.make_manifest(
        spec,
        layout,
        {
            "compiler": compiler,
            "compile_seconds": seconds,
            **extra,
            "vtree": None if compiler == "d4" else spec.vtree_shape,
        },
    )
    expected = spec.model_count()
    if expected is not None and int(manifest["model_count"]) != expected:
        raise RuntimeError(f"compiled model count {manifest['model_count']} != {expected} for {spec.describe()}")
    spec.check(layout, None, compiler)  # a self-check against an independent computation
    path = cache.store(spec, layout, files, manifest, cache_dir, replace=force, variant=variant)
    info = {**manifest, "cache_hit": False, "cache_path": None if path is None else str(path)}
    return Entry(layout, spec, info)


def _direct(spec: Spec, progress: Progress | None) -> Layout:
    """Compiler "direct": the kind's own builder. Python's cyclic garbage collector is paused
    meanwhile: the builders allocate ~10^5 small acyclic objects, and its full passes over them cost
    up to half the time."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return spec.build_direct(progress)
    finally:
        if paused:
            gc.enable()


def _d4(spec: Spec, time_limit: float | None) -> tuple[Layout, dict[str, bytes], dict]:
    """Compiler "d4": the kind's DIMACS file compiled by d4, flattened and smoothed into a layout,
    checked against d4's count and the d-DNNF's own log Z; (layout, cache files, manifest facts)."""
    path = spec.dimacs_path()
    d4 = cnf.compile_d4(path, time_limit)
    parsed = nnf.parse(d4.nnf, d4.n)
    if parsed.unsatisfiable:
        raise ValueError(
            f"{path} is unsatisfiable (d4 proved it in {d4.seconds:.2f} s): there is no distribution over its models"
        )
    layout = nnf.to_layout(parsed)
    if layout.model_count() != d4.count:
        raise RuntimeError(f"the layout counts {layout.model_count()} models, d4 {d4.count}, for {spec.describe()}")
    _check_log_partition(layout, nnf.log_partition(parsed, self_check.probe_logits(layout.n)))
    extra = {"d4_version": cnf.d4_version(), "nnf_nodes": d4.nodes, "d4_seconds": d4.seconds}
    return layout, {"circuit.nnf": d4.nnf.encode()}, extra


def _check_log_partition(layout, want) -> None:
    """Raise RuntimeError if the layout's log Z at the probe logits differs from ``want``."""
    got = self_check.layout_log_partition(layout, self_check.probe_logits(layout.n))
    self_check.agree(got, want, error=RuntimeError)


def _pysdd_version() -> str:
    try:
        return importlib.metadata.version("pysdd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
