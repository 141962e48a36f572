"""``TritonPasses``: the passes as layer-parallel Triton kernels (``triton_layers.py``), for fp32 on CUDA.

A pass is one launch per level of the circuit and direction (PyJuice's layout: values token-contiguous
in scratch, a grid of node tiles x token tiles per level), plus one launch for the leaves and one for
the outputs: log Z and the marginals, sampling, MAP and Cov(z) v. Where the torch passes compute in
float64 (``log_partition``'s accurate log Z, the marginals of a ``float64_rows`` circuit), the same
kernels run on float64 scratch. ``TorchPasses`` is their plain-torch
meaning and test oracle: the same results, the same draws from the same uniforms. No pass synchronises
with the host: sizes come from shapes, scratch from the caching allocator (its size from the device's
free memory), and the kernels branch on values inside (building the tables, once per circuit, reads the
layout on the host, as ``Program.scope_ids`` does for every implementation). With
``TRITON_INTERPRET=1`` set before this module is imported, the kernels run on CPU tensors in Triton's
interpreter (the tests do that).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from . import torch_passes
from . import triton_layers as K
from .interface import Passes, shifted
from .program import Program
from .rows import REFERENCES, RowOps, exactly_k_shift

FLOW, JVP, SAMPLE, MAP = 0, 1, 2, 3  # triton_layers' modes
#: The scratch one call may take when the device cannot say (the CPU, under the interpreter).
DEFAULT_SCRATCH = 256 << 20
MAX_TOKEN_TILES = 65535  # CUDA's limit on a grid's second axis
#: Triton's interpreter (CPU tensors, the tests) pays per program: there, tiles of 64 nodes.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Tables:
    """The index tables of ``triton_layers`` for one program (int32 on its device) and the launch plan:
    ``up``/``down``: per level (bottom-up), its first tile and tile count; ``leaf``: the variable tiles'."""

    tiles: Tensor  # [NT, 5]
    order: Tensor  # [S + nodes]
    row0: Tensor  # [S]
    fanin: Tensor  # [S]
    par_off: Tensor  # [S + 1]
    par_rows: Tensor  # [E]
    sid: Tensor  # [S]
    prime: Tensor  # [R]
    sub: Tensor  # [R]
    up_t: Tensor  # float32 [R], the tilt's sizes (``Tilt.up``)
    down_t: Tensor  # float32 [R]
    imp_off: Tensor  # [R + 1]
    imp_var: Tensor  # [P + 1]
    up: tuple[tuple[int, int], ...]
    down: tuple[tuple[int, int], ...]
    leaf: tuple[int, int]


def build_tables(prog: Program, bn: int) -> Tables:
    """The tables for ``prog`` with node tiles of at most ``bn`` nodes (see ``triton_layers``)."""
    S, R, n = prog.num_slots, prog.num_rows, prog.n
    prime, sub = prog.prime.cpu().numpy(), prog.sub.cpu().numpy()
    imp_row, imp_var = prog.implicit_row.cpu().numpy(), prog.implicit_var.cpu().numpy()
    imp_count = np.bincount(imp_row, minlength=R)  # [R]
    ids, _ = prog.scope_ids
    height = np.zeros(S, dtype=np.int64)
    row0, fanin, sid = np.zeros(S, np.int64), np.zeros(S, np.int64), np.zeros(S, np.int64)
    levels: dict[int, list] = {}
    for g in prog.groups:
        rows = np.arange(g.rows.start, g.rows.stop)
        h = 1 + int(np.maximum(height[prime[rows]], height[sub[rows]]).max())
        height[g.slots] = h
        row0[g.slots] = np.arange(g.rows.start, g.rows.stop, g.fanin)
        fanin[g.slots] = g.fanin
        sid[g.slots] = ids[g.start].cpu().numpy()
        levels.setdefault(h, []).append(g)
    for gs in levels.values():  # a level's groups are consecutive slots (the layout places them by height)
        assert all(a.start + a.nodes == b.start for a, b in itertools.pairwise(gs))
    # parents: per slot, the element rows whose prime or sub it is
    kid = np.concatenate([prime, sub])
    by_kid = np.argsort(kid, kind="stable")
    par_rows = np.concatenate([np.arange(R), np.arange(R)])[by_kid]
    par_off = np.searchsorted(kid[by_kid], np.arange(S + 1))
    parents = np.diff(par_off)  # [S]
    tiles, order = [], [np.arange(S)]
    up_plan, down_plan = [], []
    for h in sorted(levels):  # upward tiles: bn consecutive nodes of the level (its slots are consecutive)
        first, start = len(tiles), levels[h][0].start
        stop = levels[h][-1].start + levels[h][-1].nodes
        for a in range(start, stop, bn):
            b = min(a + bn, stop)
            rows = slice(row0[a], row0[b - 1] + fanin[b - 1])
            tiles.append((a, b - a, int(fanin[a:b].max()), 0, int(imp_count[rows].max(initial=0))))
        up_plan.append((first, len(tiles) - first))
    at = S
    for h in sorted(levels):  # downward tiles: the level's nodes by parent count, descending
        slots = np.concatenate([np.arange(g.start, g.start + g.nodes) for g in levels[h]])
        slots = slots[np.argsort(-parents[slots], kind="stable")]
        order.append(slots)
        first = len(tiles)
        for a in range(0, len(slots), bn):
            chunk = slots[a : a + bn]
            tiles.append((at + a, len(chunk), int(fanin[chunk].max()), int(parents[chunk].max()), 0))
        down_plan.append((first, len(tiles) - first))
        at += len(slots)
    leaf_first = len(tiles)
    for a in range(0, n, bn):  # the variables' tiles
        lits = np.concatenate([2 + np.arange(a, min(a + bn, n)), 2 + n + np.arange(a, min(a + bn, n))])
        tiles.append((0, 0, 0, int(parents[lits].max()), 0))
    dev = prog.device
    i32 = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64), device=dev).to(torch.int32).contiguous()
    imp_order = np.argsort(imp_row, kind="stable")  # implicit pairs by element row, CSR
    tilt = prog.tilt
    return Tables(
        i32(np.asarray(tiles, dtype=np.int64).reshape(-1, 5)),
        i32(np.concatenate(order)),
        i32(row0),
        i32(fanin),
        i32(par_off),
        i32(np.concatenate([par_rows, [0]])),
        i32(sid),
        i32(prime),
        i32(sub),
        tilt.up.to(torch.float32).contiguous(),
        tilt.down.to(torch.float32).contiguous(),
        i32(np.concatenate([[0], np.cumsum(imp_count)])),
        i32(np.concatenate([imp_var[imp_order], [0]])),
        tuple(up_plan),
        tuple(down_plan),
        (leaf_first, len(tiles) - leaf_first),
    )


def chosen_tile(n: int) -> tuple[int, int]:
    """(BN, BT) of ``triton_layers.chosen_kernel`` and ``kth_largest_kernel`` for rows of n: n rounded up to a power of two (at least
    16), and rows per program so that a tile holds 2,048 keys."""
    bn = max(16, 1 << max(n - 1, 0).bit_length())
    return bn, max(1, 2048 // bn)


class TritonPasses(Passes):
    """The Triton passes over ``program`` for fp32 logits on its device. ``block``: tokens per program
    tile (BT), a power of two >= 32; ``nodes``: nodes per program tile (BN), a power of two (None: 4, 64
    under the interpreter, which pays per program). 4 x 128 with 4 warps holds 4 values of a tile per
    thread: at most 80 registers in the sm_90 compiles (``triton_layers_compile``), so 6 programs (24
    warps) fit an SM. ``scratch_bytes``: the most scratch one call allocates
    (None: half of what the device has free, its caching allocator's free blocks included; 256 MiB where
    the device cannot say); past it the tokens are taken in chunks, each through every level."""

    name = "triton"
    #: A training route is one operator here (``circuits::chosen_scores``: the sampling pass and
    #: ``chosen``'s row sort forward; ``Kernels.chosen_backward``, Cov(z) v by these passes, backward),
    #: not the composed path's dozens of operators; the same draws, indices and weights.
    fused = True

    def __init__(
        self,
        program: Program,
        rows: RowOps = REFERENCES,
        block: int = 128,
        nodes: int | None = None,
        scratch_bytes: int | None = None,
        num_warps: int = 4,
    ):
        super().__init__(program, rows)
        nodes = nodes or (64 if INTERPRETED else 4)
        if block < 32 or block & (block - 1):
            raise ValueError(f"block must be a power of two >= 32, got {block}")
        if nodes < 1 or nodes & (nodes - 1):
            raise ValueError(f"nodes must be a power of two, got {nodes}")
        self.block, self.nodes, self.scratch_bytes, self.num_warps = block, nodes, scratch_bytes, num_warps
        self.tables = build_tables(program, nodes)
        self.tilt_moves = not program.tilt.uniform

    # -- the plan ------------------------------------------------------------------------------------

    def budget(self, device: torch.device) -> int:
        """The scratch bytes a call may take: ``scratch_bytes``, else half of the device's free memory
        (``torch.cuda.mem_get_info``, no synchronisation) and of its allocator's cached free blocks."""
        if self.scratch_bytes is not None:
            return self.scratch_bytes
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return max(DEFAULT_SCRATCH // 8, (free + cached) // 2)
        return DEFAULT_SCRATCH

    def chunks(self, T: int, rows: int, device: torch.device) -> list[tuple[int, int]]:
        """[(t0, Tc)]: the token chunks a call over T tokens with ``rows`` 4-byte scratch rows per token takes."""
        per = max(self.block, self.budget(device) // (4 * rows) // self.block * self.block)
        per = min(per, MAX_TOKEN_TILES * self.block)  # the grid's second axis
        return [(t0, min(per, T - t0)) for t0 in range(0, T, per)]

    def _grid(self, Tc: int, tiles: int) -> tuple[int, int]:
        """(node or variable tiles, token tiles): node tiles first (``triton_layers``)."""
        return (tiles, -(-Tc // self.block))

    def _level_args(self, scratch: dict) -> tuple:
        """The first arguments of ``up_kernel`` and ``down_kernel``: the chunk's scratch (val, ex, norm,
        dval, de; val where a query has no such buffer) and the level tables (tiles, order, row0, fanin)."""
        val, tb = scratch["val"], self.tables
        norm, dval, de = (scratch.get(k, val) for k in ("norm", "dval", "de"))
        return (val, scratch["ex"], norm, dval, de, tb.tiles, tb.order, tb.row0, tb.fanin)

    def _up(self, scratch: dict, t0: int, Tc: int, T: int, *, c, gt, dgt, mode_max=False, tangents=False, tilt=False):
        """Every level upward over the chunk (``up_kernel``)."""
        tb, TS = self.tables, scratch["val"].shape[1]
        for tile0, count in tb.up:
            K.up_kernel[self._grid(Tc, count)](
                *self._level_args(scratch),
                tb.prime,
                tb.sub,
                tb.up_t,
                tb.down_t,
                tb.imp_off,
                tb.imp_var,
                c,
                gt,
                dgt,
                tile0,
                t0,
                Tc,
                TS,
                T,
                BN=self.nodes,
                BT=self.block,
                MAX=mode_max,
                TANGENTS=tangents,
                TILT=tilt,
                IMPLICIT=tilt and not self.program.smooth,
                num_warps=self.num_warps,
                enable_fp_fusion=False,  # no fused multiply-add: products round as in the torch passes
            )

    def _down(self, scratch: dict, t0: int, Tc: int, T: int, mode: int, uniforms: Tensor | None = None):
        """Every level downward over the chunk (``down_kernel``), the root first."""
        tb, TS = self.tables, scratch["val"].shape[1]
        val = scratch["val"]
        for tile0, count in reversed(tb.down):
            K.down_kernel[self._grid(Tc, count)](
                *self._level_args(scratch),
                tb.par_off,
                tb.par_rows,
                tb.sid,
                val if uniforms is None else uniforms,
                tile0,
                t0,
                Tc,
                TS,
                T,
                self.program.num_slots,
                BN=self.nodes,
                BT=self.block,
                MODE=mode,
                num_warps=self.num_warps,
                enable_fp_fusion=False,
            )

    def _leaves(self, scratch: dict, x: Tensor, v: Tensor | None, t0: int, Tc: int):
        n = self.program.n
        val = scratch["val"]
        K.leaves_kernel[self._grid(Tc, -(-n // self.nodes))](
            x,
            x if v is None else v,
            val,
            scratch.get("dval", val),
            t0,
            Tc,
            val.shape[1],
            n,
            BV=self.nodes,
            BT=self.block,
            TANGENTS=v is not None,
            num_warps=self.num_warps,
            enable_fp_fusion=False,
        )

    def _out(self, scratch: dict, mode: int, r: Tensor, v: Tensor | None, fill: Tensor | None, out: Tensor, t0, Tc):
        tb = self.tables
        val = scratch["val"]
        K.leaf_kernel[self._grid(Tc, tb.leaf[1])](
            scratch["ex"],
            scratch.get("de", val),
            tb.par_off,
            tb.par_rows,
            r,
            r if v is None else v,
            r if fill is None else fill,
            out,
            tb.tiles,
            tb.leaf[0],
            t0,
            Tc,
            val.shape[1],
            self.program.n,
            BV=self.nodes,
            BT=self.block,
            MODE=mode,
            SMOOTH=self.program.smooth,
            num_warps=self.num_warps,
            enable_fp_fusion=False,
        )

    def _scratch(self, like: Tensor, names: str, T: int) -> tuple[dict, list[tuple[int, int]]]:
        """Scratch rows per token for ``names`` (v: val, n: norm, e: ex, d: dval, D: de) in ``like``'s dtype,
        and the chunks."""
        prog = self.program
        rows = {"v": prog.num_slots, "n": prog.num_slots, "e": prog.num_rows, "d": prog.num_slots, "D": prog.num_rows}
        chunks = self.chunks(T, sum(rows[k] for k in names) * like.element_size() // 4, like.device)
        TS = max((tc for _, tc in chunks), default=0)
        key = {"v": "val", "n": "norm", "e": "ex", "d": "dval", "D": "de"}
        return {key[k]: like.new_empty(rows[k], TS) for k in names}, chunks

    # -- the passes ----------------------------------------------------------------------------------

    def log_partition(
        self, r: Tensor, marginals: bool, shift: Tensor | None = None, *, accurate: bool = True, refine: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        if marginals and refine and self.program.float64_rows and r.dtype != torch.float64:  # as TorchPasses:
            log_z, m = self._sum_pass(shifted(r, shift, torch.float64), True)  # every row in float64
            return log_z.to(r.dtype), m.to(r.dtype)
        r = shifted(r, shift)
        if accurate and r.dtype != torch.float64:  # log Z from a float64 pass (torch_passes.accurate_log_z)
            m = self._sum_pass(r, True)[1] if marginals else None
            return self._sum_pass(r.double(), False)[0].clamp(max=0.0).to(r.dtype), m
        return self._sum_pass(r, marginals)

    def _sum_pass(self, r: Tensor, marginals: bool) -> tuple[Tensor, Tensor | None]:
        """(log Z [T], the marginals [T, n] or None) of r [T, n] (already shifted) by the tilted upward and
        downward passes in r's dtype (float32, or float64 for ``log_partition``'s accurate and refined
        answers: the same kernels on float64 scratch)."""
        T = r.shape[0]
        tl = torch_passes.tilt(self.program, r, elements=False)
        gt = tl.g.T.contiguous() if not self.program.smooth else r
        root = r.new_empty(T)
        m = torch.empty_like(r) if marginals else None
        scratch, chunks = self._scratch(r, "vne", T)
        for t0, Tc in chunks:
            self._leaves(scratch, tl.x, None, t0, Tc)
            self._up(scratch, t0, Tc, T, c=tl.c, gt=gt, dgt=gt, tilt=self.tilt_moves)
            root[t0 : t0 + Tc] = scratch["val"][-1, :Tc]
            if marginals:
                self._down(scratch, t0, Tc, T, FLOW)
                self._out(scratch, FLOW, r, None, None, m, t0, Tc)
        return (root.double() + tl.offset).to(r.dtype), m

    def sample(
        self, r: Tensor, uniforms: Tensor, fill: Tensor | None, shift: Tensor | None = None, log_z: bool = True
    ) -> tuple[Tensor, Tensor]:
        r = shifted(r, shift)
        T = r.shape[0]
        tl = torch_passes.tilt(self.program, r, elements=False)
        gt = tl.g.T.contiguous() if not self.program.smooth else r
        z, root = torch.empty_like(r), r.new_empty(T)
        uniforms = uniforms.contiguous()
        fill = None if fill is None else fill.contiguous()
        scratch, chunks = self._scratch(r, "vne", T)
        for t0, Tc in chunks:
            self._leaves(scratch, tl.x, None, t0, Tc)
            self._up(scratch, t0, Tc, T, c=tl.c, gt=gt, dgt=gt, tilt=self.tilt_moves)
            root[t0 : t0 + Tc] = scratch["val"][-1, :Tc]
            self._down(scratch, t0, Tc, T, SAMPLE, uniforms)
            self._out(scratch, SAMPLE, r, None, fill, z, t0, Tc)
        return z, (root.double() + tl.offset).to(r.dtype)

    def map(self, r: Tensor, shift: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r = shifted(r, shift)
        T = r.shape[0]
        z, best = torch.empty_like(r), r.new_empty(T)
        if self.tilt_moves:  # tilted, without the Newton steps (``torch_passes.max_upward``)
            tl = torch_passes.tilt(self.program, r, elements=False, refine=False)
            x, c = tl.x, tl.c
            hm = torch_passes.max_terms(tl.x, tl.c).T.contiguous() if not self.program.smooth else r  # [n, T]
        else:  # exactly-k: not tilted
            x, c, hm = r, r, r
        scratch, chunks = self._scratch(r, "ve", T)
        for t0, Tc in chunks:
            self._leaves(scratch, x, None, t0, Tc)
            self._up(scratch, t0, Tc, T, c=c, gt=hm, dgt=hm, mode_max=True, tilt=self.tilt_moves)
            best[t0 : t0 + Tc] = scratch["val"][-1, :Tc]
            self._down(scratch, t0, Tc, T, MAP)
            self._out(scratch, MAP, r, None, None, z, t0, Tc)
        if self.tilt_moves:
            best = (best.double() + tl.offset).to(r.dtype)
        return z, best

    def shift(self, r: Tensor) -> Tensor | None:
        """``Passes.shift`` (the exactly-k shift, [T, 1]) with each row's k-th largest from one kernel
        (``triton_layers.kth_largest_kernel``: a sort per row in registers) instead of ``torch.topk``."""
        k, (T, n) = self.program.shift_k, r.shape
        if k == 0 or T == 0:
            return None
        kth = r.new_empty(T)
        bn, bt = chosen_tile(n)
        K.kth_largest_kernel[(-(-T // bt),)](r.detach(), kth, T, n, k, BT=bt, BN=bn, num_warps=4)
        return exactly_k_shift(kth)

    def chosen(self, r: Tensor, seed: Tensor, p: Tensor, slots: int) -> tuple[Tensor, Tensor, Tensor]:
        """``Kernels.chosen``: the draw, then the drawn by p in one kernel (``triton_layers.chosen_kernel``: a
        sort per row in registers) instead of ``rows.topk_chosen``'s sort of [T, n]."""
        z = self.draw(r, seed)
        T, n = z.shape
        slots = min(slots, n)  # as the reference's slice
        weights = z.new_empty(T, slots)
        indices = torch.empty(T, slots, dtype=torch.long, device=z.device)
        mask = torch.empty(T, slots, dtype=torch.bool, device=z.device)
        bn, bt = chosen_tile(n)
        if T:
            K.chosen_kernel[(-(-T // bt),)](
                z, p.contiguous(), weights, indices, mask, T, n, slots, BT=bt, BN=bn, num_warps=4
            )
        return weights, indices, mask

    def marginals_jvp(self, r: Tensor, v: Tensor, shift: Tensor | None = None) -> Tensor:
        r = shifted(r, shift)
        v = v.contiguous()
        T = r.shape[0]
        tl = torch_passes.tilt(self.program, r, elements=False)
        if self.program.smooth:
            gt = dgt = r
        else:
            gt = tl.g.T.contiguous()
            dgt = ((torch.sigmoid(r) - torch.sigmoid(tl.x)) * v).T.contiguous()  # the implicit terms' tangents
        out = torch.empty_like(r)
        scratch, chunks = self._scratch(r, "vnedD", T)
        for t0, Tc in chunks:
            self._leaves(scratch, tl.x, v, t0, Tc)
            self._up(scratch, t0, Tc, T, c=tl.c, gt=gt, dgt=dgt, tangents=True, tilt=self.tilt_moves)
            self._down(scratch, t0, Tc, T, JVP)
            self._out(scratch, JVP, r, v, None, out, t0, Tc)
        return out
