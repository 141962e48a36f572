"""``CPasses``: the passes fused in C (``c/passes.c``), for fp32 on the CPU.

Each pass evaluates one tile of tokens through the whole circuit while it stays in cache: log Z
and the marginals, sampling, MAP, Cov(z) v. ``TorchPasses`` is their
plain-torch meaning and test oracle: the same results, the same draws from the same uniforms.
Tiles of tokens are split between ``torch.get_num_threads()`` OpenMP threads (ctypes releases the
GIL). The library comes from ``circuits.passes.c_library``.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from . import c_library
from .interface import Passes
from .program import Program


class CPasses(Passes):
    """The C passes over ``program`` (on the CPU). Holds the C view of the program: its sizes and
    pointers into index tensors that this object keeps alive."""

    name = "fused C"

    def __init__(self, program: Program):
        super().__init__(program)
        self.lib = c_library.library()
        if self.lib is None:
            raise RuntimeError("the C passes are not available (circuits.passes.describe() says why)")
        prog = program
        nodes = torch.tensor([[g.start + j, g.rows.start + j * g.fanin, g.fanin] for g in prog.groups
                              for j in range(g.nodes)], dtype=torch.int64)  # [D, 3], bottom-up
        ids, _ = prog.scope_ids
        self.uid = torch.zeros(prog.num_slots, dtype=torch.int64)  # [S]: a decision slot's row of the uniforms
        for g in prog.groups:
            self.uid[g.slots] = ids[g.start].cpu()
        order = torch.argsort(prog.implicit_row, stable=True)  # implicit pairs by element row, CSR
        imp_var = prog.implicit_var[order].contiguous()
        imp_off = torch.zeros(prog.num_rows + 1, dtype=torch.int64)
        imp_off[1:] = torch.bincount(prog.implicit_row, minlength=prog.num_rows).cumsum(0)
        self._keep = (nodes, prog.prime, prog.sub, imp_off, imp_var)  # what the struct points into
        self.struct = c_library.ProgStruct(
            prog.n, prog.num_slots, prog.num_rows, len(nodes), int(prog.smooth), nodes.data_ptr(),
            prog.prime.data_ptr(), prog.sub.data_ptr(), imp_off.data_ptr(), imp_var.data_ptr())

    def _run(self, fn, *args) -> None:
        """Call a pass with torch's thread count (OpenMP threads inside)."""
        if fn(ctypes.byref(self.struct), *args, torch.get_num_threads()):
            raise MemoryError("circuits: the C passes could not allocate their scratch")

    def log_partition(self, r: Tensor, marginals: bool, shift: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        log_z, m = r.new_empty(r.shape[0]), torch.empty_like(r) if marginals else None
        self._run(self.lib.pm_marginals, r.data_ptr(), _pointer(shift), None if m is None else m.data_ptr(),
                  log_z.data_ptr(), r.shape[0])
        return log_z, m

    def sample(self, r: Tensor, uniforms: Tensor, fill: Tensor | None,
               shift: Tensor | None = None) -> tuple[Tensor, Tensor]:
        uniforms = uniforms.contiguous()
        fill = None if fill is None else fill.contiguous()
        z, log_z = torch.empty_like(r), r.new_empty(r.shape[0])
        self._run(self.lib.pm_sample, r.data_ptr(), _pointer(shift), uniforms.data_ptr(), self.uid.data_ptr(),
                  None if fill is None else fill.data_ptr(), z.data_ptr(), log_z.data_ptr(), r.shape[0])
        return z, log_z

    def map(self, r: Tensor, shift: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z, best = torch.empty_like(r), r.new_empty(r.shape[0])
        self._run(self.lib.pm_map, r.data_ptr(), _pointer(shift), z.data_ptr(), best.data_ptr(), r.shape[0])
        return z, best

    def marginals_jvp(self, r: Tensor, v: Tensor, shift: Tensor | None = None) -> Tensor:
        v = v.contiguous()
        out = torch.empty_like(r)
        self._run(self.lib.pm_jvp, r.data_ptr(), _pointer(shift), v.data_ptr(), out.data_ptr(), r.shape[0])
        return out


def _pointer(shift: Tensor | None) -> int | None:
    """The C view of a shift [T, 1] (one float32 per token), or NULL. The callers' shifts are
    contiguous (``Circuit._shift``); a strided one is refused rather than copied to a temporary
    that could be freed before the call."""
    if shift is None:
        return None
    if not shift.is_contiguous() or shift.dtype != torch.float32 or shift.numel() != shift.shape[0]:
        raise ValueError(f"shift must be a contiguous float32 [T, 1] tensor, got {shift.dtype} {list(shift.shape)}")
    return shift.data_ptr()
