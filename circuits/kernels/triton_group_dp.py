"""``TritonGroupDP``: the group DP's queries as fused Triton kernels (``circuits.kernels.triton_groups``)
for float32 logits on CUDA, one token per thread: a group's lattice in registers, the outer one
streamed through scratch.

The same results as the torch sweeps (``circuits.kernels.torch_groups``, the oracle), and from the
same seed the same draws. One kernel per query: ``log_partition`` (log Z, the marginals), ``sample``
(one draw, log Z), ``chosen`` (the forward of ``circuits::chosen_scores``: the draw, then the drawn
by score in their slots), ``marginals_jvp`` and ``chosen_backward`` (Cov(z) v, with the scores'
backward of Eq. 7 for the latter), ``map`` (the most probable allowed subset: inference in one
kernel). The log counts by size stay the torch sweeps' (not on a route). The kernels read the
logits transposed, rT [n, T] (coalesced loads across a warp), and a scratch of checkpoints and outer
rows per token, taken in chunks of tokens that keep it under ``SCRATCH_BYTES``.
``circuits.kernels.select`` takes it for float32 group lattices on CUDA when triton imports;
``prefer="triton"`` runs it on CPU tensors under ``TRITON_INTERPRET=1`` (the tests).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import triton_dp
from . import triton_groups as groups
from .lattice import GroupLattice
from .rows import REFERENCES, RowOps
from .torch_groups import TorchGroupDP
from .triton_dp import _block, slot_inputs

SCRATCH_BYTES = 1 << 30  # the scratch of one launch at most (tokens are taken in chunks)


class TritonGroupDP(TorchGroupDP):
    """The group DP's kernels for float32 logits on CUDA (or the CPU under the interpreter), with
    ``TorchGroupDP``'s interface and results. Inputs: r [T, n] float32, contiguous, checked by the caller."""

    name = "triton"
    fused = True

    def __init__(self, lattice: GroupLattice, rows: RowOps = REFERENCES):
        import triton  # noqa: F401 (an optional extra: ImportError here, as for the Triton passes)

        super().__init__(lattice, rows)
        sizes = list(self.spec.groups)
        starts = [sum(sizes[:g]) for g in range(len(sizes))]
        self.starts = torch.tensor(starts, dtype=torch.int32, device=lattice.device)  # [G]
        self.sizes = torch.tensor(sizes, dtype=torch.int32, device=lattice.device)  # [G]

    def _plan(self, kind: str, **kw) -> groups.GroupPlan:
        spec = self.spec
        sizes = tuple(spec.groups)
        ck = groups.segment(sizes, spec.capacity, spec.kmax, kind == "cov")
        return groups.GroupPlan(kind, sizes, spec.kmin, spec.kmax, spec.capacity, spec.max_groups, ck=ck, **kw)

    def _launch(self, plan: groups.GroupPlan, r: Tensor, **tensors: Tensor | None) -> None:
        """Run ``plan``'s kernel over r [T, n] in chunks of tokens, each with its scratch; ``tensors``:
        the kernel's tensor arguments by name (the rest get a placeholder)."""
        T, N = r.shape
        per = 4 * plan.rows32 + 8 * plan.rows64  # scratch bytes a token
        block = _block()
        step = max(block, SCRATCH_BYTES // per // block * block)
        dummy = r.new_empty(1)
        given = {"r_ptr": r.t().contiguous(), "gs_ptr": self.starts, "gn_ptr": self.sizes}
        given.update({f"{k}_ptr": v for k, v in tensors.items() if v is not None})
        fn = groups.kernel(plan)
        for a in range(0, T, step):
            b = min(a + step, T)
            programs = -(-(b - a) // block)  # each with its block of scratch rows: [programs, rows, block]
            given["ck_ptr"] = triton_dp.scratch(r, programs * plan.rows32 * block, torch.float32)
            given["c64_ptr"] = triton_dp.scratch(r, programs * plan.rows64 * block, torch.float64)
            args = [given.get(name, dummy) for name in groups.TENSORS]
            fn[(programs,)](*args, T, N, a, b, BLOCK=block, num_warps=groups.BLOCK // 32, num_stages=groups.STAGES)

    # --- the queries ----------------------------------------------------------------------------
    def log_partition(self, r: Tensor, marginals: bool, shift=None, *, accurate=True, refine=True):
        """(log P_indep(C) [T], the marginals [T, n] when ``marginals``, else None): one kernel."""
        lz = r.new_empty(r.shape[0])
        m = torch.empty_like(r) if marginals else None
        if r.shape[0]:
            self._launch(self._plan("forward", log_z=True, marginals=marginals), r, lz=lz, m=m)
        return lz, m

    def map(self, r: Tensor, shift=None) -> tuple[Tensor, Tensor]:
        """(the most probable allowed assignment z [T, n] in {0, 1}, 0 where nothing is allowed; its
        log P_indep [T], -inf there): one kernel, the same subset as the torch sweeps' (ties alike)."""
        z = torch.empty_like(r)
        log_p = r.new_empty(r.shape[0])
        if r.shape[0]:
            self._launch(self._plan("map"), r, z=z, lz=log_p)
        return z, log_p

    def draw_uniforms(self, r: Tensor, seed: Tensor) -> tuple[Tensor, None]:
        """The kernels make their uniforms themselves (at ``TorchGroupDP.draw_uniforms``' indices): the
        seed, as they read it (a one-element int64 tensor on r's device, no host read), and None."""
        return seed.to(device=r.device, dtype=torch.int64).reshape(1), None

    def sample(self, r: Tensor, uniforms: Tensor, fill=None, shift=None, log_z: bool = True):
        """(one exact draw z [T, n] in {0, 1}, log P_indep(C) [T] or None) from the seed that
        ``draw_uniforms`` gives: one kernel."""
        z = torch.empty_like(r)
        lz = r.new_empty(r.shape[0]) if log_z else None
        if r.shape[0]:
            self._launch(self._plan("forward", log_z=log_z, draw=True), r, seed=uniforms, z=z, lz=lz)
        return z, lz

    def draw(self, r: Tensor, seed: Tensor) -> Tensor:
        return self.sample(r, *self.draw_uniforms(r, seed), log_z=False)[0]

    def chosen(self, r: Tensor, seed: Tensor, p: Tensor, slots: int) -> tuple[Tensor, Tensor, Tensor]:
        """``Kernels.chosen`` in one kernel: the draw, then the drawn by p [T, n] descending (ties to
        the lower index), then the lowest undrawn ascending -> (weights [T, slots], indices [T, slots]
        long, mask [T, slots] bool)."""
        T = r.shape[0]
        w = r.new_empty(T, slots)
        idx = torch.empty(T, slots, dtype=torch.int64, device=r.device)
        mask = torch.empty(T, slots, dtype=torch.int8, device=r.device)
        if T and slots:
            seed = self.draw_uniforms(r, seed)[0]
            ps = p.to(r.dtype).contiguous()
            self._launch(self._plan("forward", slots=slots), r, seed=seed, ps=ps, w=w, oidx=idx, omask=mask)
        return w, idx, mask.view(torch.bool)  # the kernel writes 0 or 1

    def marginals_jvp(self, r: Tensor, v: Tensor, shift=None) -> Tensor:
        """Cov(z) v: r, v [T, n] -> [T, n], one kernel."""
        out = torch.empty_like(r)
        if r.shape[0]:
            self._launch(self._plan("cov"), r, v=v.to(r.dtype).contiguous(), out=out)
        return out

    def chosen_backward(self, r: Tensor, indices: Tensor, mask: Tensor, g: Tensor, kind: str, paper: bool) -> Tensor:
        """``Kernels.chosen_backward`` in one kernel: Cov(z) g_t (times sigma(-r) with ``paper``) plus
        the scores' backward, g_t = (g at the used slots, at their variables) times the scores."""
        out = torch.empty_like(r)
        slots = indices.shape[-1]
        if r.shape[0] and slots:
            idx, used, g32 = slot_inputs(r, indices, mask, g)
            self._launch(
                self._plan("cov", v_from=kind, paper=paper, slots=slots), r, idx=idx, mask=used, g=g32, out=out
            )
        elif r.shape[0]:
            out.zero_()
        return out
