"""Constraints read from files: ``SddFile(sdd, vtree)``, any SDD saved by pysdd / libsdd (``.sdd``
plus the ``.vtree`` it was saved with); ``CnfFile(path)``, any CNF in DIMACS format.

What they share (``_File``): the paths must name existing files and are kept absolute; the cache
key is a hash of the files' contents (editing a file gives a new entry), their JSON form only that
digest (so ``spec_from_dict`` cannot rebuild them); the model count is known only once compiled;
a layout read from the cache is checked against the circuit stored beside it: d4's d-DNNF
(``circuit.nnf``, evaluated directly by ``circuits.compiler.nnf``) or the SDD (``circuit.sdd``, pysdd's
weighted model count). They have no estimate: an SDD file is read as it is, in time linear in the
file; the SDD of a CNF depends on the formula (exponential in the worst case) and cannot be told
by arithmetic (d4's ``time_limit`` bounds it instead).

- ``SddFile`` compiles with "pysdd" only: the SDD is read as it is.
- ``CnfFile`` compiles with "d4" (the default, ``circuits.compiler.cnf``) or "pysdd"
  (``SddManager.from_cnf_file`` on a balanced vtree).

libsdd trusts its input, so both check their files first (``circuits.compiler.file_checks``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from pysdd.sdd import SddManager, SddNode, Vtree

from ...layout import Layout
from .. import cnf, file_checks, nnf, self_check
from ..registry import Progress, Spec, register


def _digest(*paths: str) -> str:
    """The first 20 hex digits of the sha256 of the files' contents, each followed by a NUL byte."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            h.update(f.read())
        h.update(b"\0")
    return h.hexdigest()[:20]


class _File(Spec):
    """A constraint given by the files named in its ``paths`` fields (module docstring)."""

    paths: tuple[str, ...] = ()  # the fields that name files, in the digest's order
    prefix = ""  # the cache key's: "<prefix>-<digest>"
    what = "file"  # "<field> must be an existing <what>"
    dict_fields = ("digest",)
    rebuildable = False

    def __post_init__(self):
        for name in self.paths:
            path = os.fspath(getattr(self, name))
            if not os.path.isfile(path):
                raise ValueError(f"{name} must be an existing {self.what}, got {path!r}")
            object.__setattr__(self, name, os.path.abspath(path))
        if not self.digest:
            object.__setattr__(self, "digest", _digest(*(getattr(self, name) for name in self.paths)))

    @property
    def key(self) -> str:
        return f"{self.prefix}-{self.digest}"

    def describe(self) -> str:
        return f"{type(self).__name__}({', '.join(os.path.basename(getattr(self, name)) for name in self.paths)})"

    def check(self, layout: Layout, entry: Path | None, compiler: str) -> None:
        if entry is None:
            return  # compiling checked it: d4's count and log Z, or the layout built from pysdd's SDD
        r = self_check.probe_logits(layout.n)
        got = self_check.layout_log_partition(layout, r)
        if compiler == "d4":
            parsed = nnf.parse((entry / "circuit.nnf").read_text(), layout.n)
            self_check.agree(got, nnf.log_partition(parsed, r))
        else:
            self_check.agree(got, self_check.sdd_log_partition(entry, r), 1e-6)  # libsdd's log WMC: ~1e-8


@register
@dataclass(frozen=True)
class SddFile(_File):
    """An SDD saved by pysdd/libsdd: ``sdd`` file plus the ``vtree`` file it was saved with.

    The cache key is the hash of both files' contents, so editing a file gives a new entry.
    """

    sdd: str
    vtree: str
    digest: str = field(default="", compare=True)

    paths = ("sdd", "vtree")
    prefix = "sdd"
    compilers = ("pysdd",)

    def build_sdd(self, progress: Progress | None = None) -> tuple[SddManager, SddNode]:
        file_checks.check_sdd_pair(self.sdd, self.vtree)
        mgr = SddManager.from_vtree(Vtree.from_file(self.vtree.encode()))
        return mgr, mgr.read_sdd_file(self.sdd.encode())


@register
@dataclass(frozen=True)
class CnfFile(_File):
    """A CNF formula in DIMACS format, compiled by d4 (``circuits.compiler.cnf``; or by pysdd on a balanced
    vtree, ``compile_circuit(..., compiler="pysdd")``)."""

    path: str
    digest: str = field(default="", compare=True)

    paths = ("path",)
    prefix = "cnf"
    what = "DIMACS CNF file"
    compilers = ("d4", "pysdd")

    def build_sdd(self, progress: Progress | None = None) -> tuple[SddManager, SddNode]:
        file_checks.check_dimacs(self.path)
        with cnf.quiet_stdout():  # pysdd prints "Read CNF: ..."
            return SddManager.from_cnf_file(self.path.encode(), b"balanced")

    def dimacs_path(self) -> str:
        return self.path
