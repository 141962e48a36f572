"""The on-disk cache of compiled circuits.

One directory per spec and compiler, ``<cache root>/<spec key>/`` for the spec's default
compiler and ``<spec key>-<compiler>/`` for another (``circuits.compiler.compile``), holding

    manifest.json   format version, spec, compiler, sizes, model count, sha256 of each file, ...
    layout.npz      the level layout as plain integer arrays (loaded with allow_pickle=False)

and, by compiler (``FILES``):

    direct          nothing more (the layout is the pruned SDD of the count tree)
    d4              circuit.nnf: d4's d-DNNF in its NNF text format (``circuits.compiler.nnf``)
    pysdd           circuit.sdd, circuit.vtree (libsdd's formats: SddManager.read_sdd_file,
                    Vtree.from_file) and circuit.dot (the SDD as Graphviz DOT)

Nothing is trusted blindly: on every read the format version, the spec, each file's checksum,
the layout's structure, its exact model count and its log-partition at fixed logits (against an
independent computation, the kind's ``check``: the Poisson-binomial DP for ExactlyK / RangeK, the
group DP for the group specs, the stored d-DNNF evaluated directly for d4, pysdd's WMC of the
stored SDD otherwise) are checked, and any failure warns (``CacheWarning``) and recompiles. Entries of format 2 (one
compiler, pysdd) are old: they warn once and are rebuilt. Writes go to a private temporary directory that is renamed
into place, so readers never see half an entry and concurrent writers all succeed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import uuid
import warnings
from pathlib import Path

import numpy as np

from ..cache_dir import default_cache_dir
from ..layout import Layout
from .registry import Spec, spec_to_dict

FORMAT_VERSION = 3
FILES = {
    "direct": ("layout.npz",),
    "d4": ("layout.npz", "circuit.nnf"),
    "pysdd": ("layout.npz", "circuit.sdd", "circuit.vtree", "circuit.dot"),
}


class CacheWarning(UserWarning):
    """A cache entry could not be used (corrupt, old, unwritable); the circuit was recompiled."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entry_dir(spec: Spec, root: Path | str | None = None, variant: str | None = None) -> Path:
    """The entry of ``spec`` compiled by its default compiler, or by ``variant`` (another one)."""
    base = Path(root).expanduser() if root is not None else default_cache_dir()
    return base / (spec.key if variant is None else f"{spec.key}-{variant}")


def read_entry(path: Path, spec: Spec | None = None) -> tuple[Layout, dict]:
    """Load and verify one cache entry. Raises ValueError saying what is wrong."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except FileNotFoundError:
        raise ValueError("the manifest is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the manifest is unreadable ({exc.__class__.__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        got = manifest.get("format_version") if isinstance(manifest, dict) else None
        raise ValueError(f"format version {got!r}, this probmoe reads {FORMAT_VERSION}")
    if spec is not None and manifest.get("spec") != spec_to_dict(spec):
        raise ValueError(f"it holds {manifest.get('spec')}, not {spec_to_dict(spec)}")
    compiler = manifest.get("compiler")
    if compiler not in FILES:
        raise ValueError(f"unknown compiler {compiler!r}")
    sums = manifest.get("sha256", {})
    if not isinstance(sums, dict):
        raise ValueError("the manifest's checksums are unreadable")
    for name in FILES[compiler]:
        f = path / name
        if not f.is_file():
            raise ValueError(f"{name} is missing")
        if _sha256(f) != sums.get(name):
            raise ValueError(f"{name} fails its checksum")
    try:
        with np.load(path / "layout.npz", allow_pickle=False) as z:
            layout = Layout(
                n=int(z["n"]),
                groups=z["groups"].astype(np.int64),
                children=z["children"].astype(np.int64),
                implicit=z["implicit"].astype(np.int64),
            )
    except Exception as exc:  # any decoding failure of the archive means a bad entry
        raise ValueError(f"layout.npz is unreadable ({exc.__class__.__name__})") from None
    layout.validate()
    if layout.sizes() != manifest.get("sizes"):
        raise ValueError("the layout's sizes differ from the manifest")
    count = layout.model_count()
    if str(count) != manifest.get("model_count") or (spec is not None and spec.model_count() not in (None, count)):
        raise ValueError("the layout's model count is wrong")
    if spec is not None:
        try:
            spec.check(layout, path, compiler)  # the kind's own check against an independent computation
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"a file is unreadable ({exc.__class__.__name__})") from None
    return layout, manifest


def load(spec: Spec, root: Path | str | None = None, variant: str | None = None) -> tuple[Layout, dict] | None:
    """The verified entry for ``spec`` (``variant`` as in ``entry_dir``), or None (with a
    CacheWarning if one existed but was bad)."""
    path = entry_dir(spec, root, variant)
    if not path.exists():
        return None
    try:
        return read_entry(path, spec)
    except ValueError as exc:
        warnings.warn(f"probmoe cache entry {path} is invalid ({exc}); recompiling", CacheWarning, stacklevel=3)
        return None


def make_manifest(spec: Spec, layout: Layout, info: dict) -> dict:
    count = layout.model_count()
    return {
        "format_version": FORMAT_VERSION,
        "spec": spec_to_dict(spec),
        "describe": spec.describe(),
        "vtree": "balanced",  # info may say otherwise (grouped; None for a d-DNNF)
        "sizes": layout.sizes(),
        "model_count": str(count),
        "log_model_count": math.log(count),
        **info,
    }


def store(
    spec: Spec,
    layout: Layout,
    files: dict[str, bytes],
    manifest: dict,
    root: Path | str | None = None,
    replace: bool = False,
    variant: str | None = None,
):
    """Write an entry atomically; returns its path, or None (with a CacheWarning) if unwritable.

    ``manifest`` comes from ``make_manifest`` (its "compiler" names the ``FILES``); the files'
    checksums are added to the written copy. ``files`` maps the compiler's files other than
    layout.npz to their contents. ``replace`` overwrites a valid entry
    (``compile_circuit(force=True)``); otherwise a valid entry that appeared meanwhile is kept.
    ``variant`` as in ``entry_dir``.
    """
    final = entry_dir(spec, root, variant)
    tmp = final.parent / f".tmp-{spec.key}-{uuid.uuid4().hex}"
    try:
        tmp.mkdir(parents=True)
        np.savez(
            tmp / "layout.npz",
            n=np.int64(layout.n),
            groups=layout.groups,
            children=layout.children,
            implicit=layout.implicit,
        )
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        sums = {name: _sha256(tmp / name) for name in FILES[manifest["compiler"]]}
        (tmp / "manifest.json").write_text(json.dumps({**manifest, "sha256": sums}, indent=1))
        _install(tmp, final, spec, replace)
        return final
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(
            f"probmoe cache directory {final.parent} is not writable ({exc.strerror or exc}); "
            "using the circuit compiled in memory",
            CacheWarning,
            stacklevel=3,
        )
        return None


def _install(tmp: Path, final: Path, spec: Spec, replace: bool) -> None:
    """Rename ``tmp`` to ``final``. An entry already there is kept if it is valid and ``replace``
    is False (another process got there first); otherwise it is moved aside and removed."""
    for _ in range(5):
        try:
            os.rename(tmp, final)
            return
        except OSError:
            if not final.exists():
                continue
            if not replace:
                try:
                    read_entry(final, spec)
                    shutil.rmtree(tmp, ignore_errors=True)  # a valid entry is there: ours is redundant
                    return
                except ValueError:
                    pass
            trash = final.parent / f".trash-{spec.key}-{uuid.uuid4().hex}"
            with contextlib.suppress(OSError):
                os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
    raise OSError(f"could not install the cache entry {final}")
