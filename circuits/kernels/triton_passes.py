"""``TritonPasses``: the passes as fused Triton kernels (``triton_kernels.py``), for fp32 on CUDA.

Each pass is one kernel launch: a program per block of ``block`` tokens runs the whole circuit
(log Z and the marginals, sampling, MAP, Cov(z) v). ``TorchPasses`` is their plain-torch meaning
and test oracle: the same results, the same draws from the same uniforms. No pass synchronises with the host: sizes come
from shapes, scratch from the caching allocator, and the kernels branch on values inside (building
the index tables, once per circuit and dtype, reads the layout on the host, as ``Program.scope_ids``
does for every implementation).
With ``TRITON_INTERPRET=1`` set before this module is imported, the kernels run on CPU tensors
in Triton's interpreter (the tests do that).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import torch_passes
from . import triton_kernels as K
from .interface import Passes, shifted
from .program import Program
from .rows import REFERENCES, RowOps


class TritonPasses(Passes):
    """The Triton passes over ``program`` for fp32 logits on its device. ``block``: tokens per program
    and block, a power of two >= 32 (a warp per 32 tokens, a token per thread). ``scratch_bytes``: the
    most scratch one call allocates; past it, fewer programs each take several blocks in turn."""

    name = "triton"

    def __init__(self, program: Program, rows: RowOps = REFERENCES, block: int = 32, scratch_bytes: int = 256 << 20):
        super().__init__(program, rows)
        if block < 32 or block & (block - 1):
            raise ValueError(f"block must be a power of two >= 32, got {block}")
        self.block, self.scratch_bytes = block, scratch_bytes
        prog, dev = program, program.device
        ids, _ = prog.scope_ids
        self.nodes = (
            torch.cat(
                [  # [D, 4] bottom-up: slot, first element row, fan-in, row of the uniforms
                    torch.stack(
                        [
                            torch.arange(g.start, g.start + g.nodes, device=dev),
                            torch.arange(g.rows.start, g.rows.stop, g.fanin, device=dev),
                            torch.full((g.nodes,), g.fanin, device=dev),
                            ids[g.start],
                        ],
                        dim=1,
                    )
                    for g in prog.groups
                ]
            )
            .to(torch.int32)
            .contiguous()
        )
        self.prime = prog.prime.to(torch.int32).contiguous()  # [R]
        self.sub = prog.sub.to(torch.int32).contiguous()  # [R]
        order = torch.argsort(prog.implicit_row, stable=True)  # implicit pairs by element row, CSR
        self.imp_var = torch.cat([prog.implicit_var[order], prog.implicit_var.new_zeros(1)]).to(torch.int32)  # [P + 1]
        counts = torch.bincount(prog.implicit_row, minlength=prog.num_rows)  # [R]
        self.imp_off = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)  # [R + 1]
        tilt = prog.tilt  # the tilt (``torch_passes.tilt``): its sizes per element row [R]
        self.tilt_tables = (tilt.up.to(torch.float32), tilt.down.to(torch.float32), self.imp_off, self.imp_var)
        self.tilt_moves = not tilt.uniform

    def _tilt(self, r: Tensor, v: Tensor | None = None) -> tuple[torch_passes.Tilted, Tensor]:
        """The tilt of r [T, n] (``torch_passes.tilt``, without its [R, T] addends: the kernels add them)
        and the tangents of its implicit terms along v, (sigma(r) - sigma(x)) v [T, n] (r itself when v
        is None: unread)."""
        tl = torch_passes.tilt(self.program, r, elements=False)
        dg = r if v is None else ((torch.sigmoid(r) - torch.sigmoid(tl.x)) * v).contiguous()
        return tl, dg

    def _launch(self, kernel, r: Tensor, args: tuple, scratch: str, tables: tuple = (), **flags) -> None:
        """kernel over the tokens of r [T, n]: ``args``, one fresh scratch buffer [programs, rows, block] per
        letter of ``scratch`` ("s": S rows, "r": R rows), the index tables, the sizes T, n, S, R, D."""
        prog, T = self.program, r.shape[0]
        blocks = -(-T // self.block)
        if blocks == 0:
            return
        rows = {"s": prog.num_slots, "r": prog.num_rows}
        per_program = sum(rows[kind] for kind in scratch) * self.block * r.element_size()
        programs = min(blocks, max(1, self.scratch_bytes // per_program))  # each loops over its share of blocks
        buffers = [r.new_empty(programs, rows[kind], self.block) for kind in scratch]
        # no fused multiply-add: products round as in the torch passes (and the C passes, -ffp-contract=off)
        kernel[(programs,)](
            *args,
            *buffers,
            self.nodes,
            self.prime,
            self.sub,
            *tables,
            T,
            prog.n,
            prog.num_slots,
            prog.num_rows,
            len(self.nodes),
            B=self.block,
            SMOOTH=prog.smooth,
            num_warps=self.block // 32,
            enable_fp_fusion=False,
            **flags,
        )

    def log_partition(
        self, r: Tensor, marginals: bool, shift: Tensor | None = None, *, accurate: bool = True, refine: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        if marginals and refine and self.program.float64_rows:  # the torch passes in float64 (Passes)
            return torch_passes.TorchPasses(self.program).log_partition(r, True, shift)
        r = shifted(r, shift)
        if accurate:  # log Z from the torch passes in float64 (torch_passes.accurate_log_z)
            m = self.log_partition(r, True, accurate=False, refine=False)[1] if marginals else None
            return torch_passes.accurate_log_z(self.program, r), m
        tl, _ = self._tilt(r)
        log_z, m = r.new_empty(r.shape[0]), torch.empty_like(r) if marginals else None
        self._launch(
            K.marginals_kernel,
            r,
            (tl.x, r, tl.c, tl.g, log_z if m is None else m, log_z),
            "srss",
            self.tilt_tables,
            MARGINALS=marginals,
            TILT=self.tilt_moves,
        )
        return (log_z.double() + tl.offset).to(r.dtype), m

    def sample(
        self, r: Tensor, uniforms: Tensor, fill: Tensor | None, shift: Tensor | None = None, log_z: bool = True
    ) -> tuple[Tensor, Tensor]:
        r = shifted(r, shift)
        tl, _ = self._tilt(r)
        z, log_z = torch.empty_like(r), r.new_empty(r.shape[0])
        fill = uniforms if fill is None else fill.contiguous()  # unread when the circuit is smooth
        self._launch(
            K.sample_kernel,
            r,
            (tl.x, r, tl.c, tl.g, uniforms.contiguous(), fill, z, log_z),
            "srss",
            self.tilt_tables,
            TILT=self.tilt_moves,
        )
        return z, (log_z.double() + tl.offset).to(r.dtype)

    def map(self, r: Tensor, shift: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r = shifted(r, shift)
        z, best = torch.empty_like(r), r.new_empty(r.shape[0])
        if not self.tilt_moves:  # exactly-k: not tilted (``torch_passes.max_upward``)
            self._launch(
                K.map_kernel, r, (r, r, r.new_zeros(r.shape[0]), r, z, best), "srs", self.tilt_tables, TILT=False
            )
            return z, best
        tl = torch_passes.tilt(self.program, r, elements=False, refine=False)
        hm = torch_passes.max_terms(tl.x, tl.c).contiguous()  # [T, n]
        self._launch(K.map_kernel, r, (tl.x, r, tl.c, hm, z, best), "srs", self.tilt_tables, TILT=True)
        return z, (best.double() + tl.offset).to(r.dtype)

    def marginals_jvp(self, r: Tensor, v: Tensor, shift: Tensor | None = None) -> Tensor:
        r = shifted(r, shift)
        v = v.contiguous()
        tl, dg = self._tilt(r, None if self.program.smooth else v)
        out = torch.empty_like(r)
        self._launch(
            K.jvp_kernel, r, (tl.x, r, tl.c, tl.g, dg, v, out), "srssrss", self.tilt_tables, TILT=self.tilt_moves
        )
        return out
