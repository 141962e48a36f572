"""``TritonDP``: the cardinality DP's sweeps as fused Triton kernels (``circuits.kernels.triton_lattice``)
for float32 logits on CUDA, one token per thread with the lattice in registers.

The same results as the torch sweeps (``circuits.kernels.torch_dp``, the oracle), and from the same
seed the same draws. One kernel per query: ``forward_marginals`` (the marginals and one draw),
``chosen`` (the forward of ``circuits::chosen_scores``: tilt, draw, the drawn variables by score in
their slots, Eq. 7's weights), ``cov_vec`` and ``chosen_backward`` (Cov(z) v, with the scores'
backward of Eq. 7 for the latter), ``log_counts`` (float64 log sweep). ``log_counts_backward`` stays
the torch sweeps' (not on the routing path). The kernels read the logits transposed, rT [N, T]
(one copy per launch: thread t's load of variable i is then next to thread t + 1's, one memory
transaction for a warp's 32 tokens instead of 32 for rows of r [T, N]). The reverse sweeps read a
checkpoint scratch of [segments, states, T] floats, taken in chunks of tokens that keep it under
``SCRATCH_BYTES``.
``circuits.kernels.select`` takes ``TritonDP`` for float32 lattices on CUDA when triton imports;
``prefer="triton"`` runs it on CPU tensors under ``TRITON_INTERPRET=1`` (the tests).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from . import triton_lattice as lattice
from .rows import REFERENCES, RowOps
from .torch_dp import TorchDP

SCRATCH_BYTES = 1 << 30  # the checkpoints of one launch at most (tokens are taken in chunks)


def _block() -> int:
    """Tokens per program: ``triton_lattice.BLOCK`` (one per thread); 1024 in Triton's interpreter on the
    CPU, where a program's cost is its number of operations, whatever their width (the kernels do not
    depend on it: every token is a lane of its own)."""
    return 1024 if os.environ.get("TRITON_INTERPRET") == "1" else lattice.BLOCK


def _chunks(T: int, per_token: int) -> list[tuple[int, int]]:
    """Token ranges [a, b) whose checkpoints (``per_token`` floats each) fit ``SCRATCH_BYTES``,
    whole programs each."""
    block = _block()
    step = max(block, SCRATCH_BYTES // (4 * per_token) // block * block)
    return [(a, min(a + step, T)) for a in range(0, T, step)]


def scratch(r: Tensor, numel: int, dtype: torch.dtype) -> Tensor:
    """A launch's scratch (checkpoints, outer rows) on r's device, uninitialised: the lattice and group
    kernels write every row before they read it (the tests fill it with NaN to check that)."""
    return torch.empty(numel, dtype=dtype, device=r.device)


def _launch(plan: lattice.Plan, r: Tensor, *args: Tensor | None) -> None:
    """Run ``plan``'s kernel over r [T, N] in chunks of tokens, each with its checkpoint scratch;
    ``args``: the kernel's tensors between r and the scratch (None: unused)."""
    T, N = r.shape
    nseg = -(-N // plan.ck)
    per = nseg * (plan.kmax + 1) * (2 if plan.kind == "cov" else 1)
    dummy = r.new_empty(1)
    args = tuple(dummy if x is None else x for x in args)
    fn = lattice.kernel(plan)
    rt = r.t().contiguous()  # [N, T]: a thread's loads of its token's logits, coalesced across the warp
    for a, b in _chunks(T, per):
        ck = scratch(r, per * (b - a), r.dtype)  # [segments, states, b - a]
        head, tail = args[: plan.scratch_at], args[plan.scratch_at :]
        block = _block()
        grid = (-(-(b - a) // block),)
        fn[grid](rt, *head, ck, *tail, T, N, nseg, a, b, b - a, BLOCK=block, num_warps=lattice.BLOCK // 32)


class TritonDP(TorchDP):
    """The DP's kernels for float32 logits on CUDA (or the CPU under the interpreter), with
    ``TorchDP``'s interface and results. Inputs: r [T, N] float32, contiguous, checked by the caller."""

    name = "triton"
    fused = True

    def __init__(self, kmin: int, kmax: int, rows: RowOps = REFERENCES):
        import triton  # noqa: F401 (an optional extra: ImportError here, as for the Triton passes)

        super().__init__(kmin, kmax, rows)

    def _plan(self, kind: str, **kw) -> lattice.Plan:
        """The kernel of ``kind`` for these sizes (the sweeps that walk back get their segment length)."""
        ck = lattice.segment(kind, self.kmax) if kind in lattice.REGISTER_STATES else 1
        return lattice.Plan(kind, self.kmin, self.kmax, ck=ck, **kw)

    def forward_marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        """(m [T, N] or zeros, one draw [T, N] from ``seed`` or an empty tensor): one kernel."""
        draw = seed is not None
        m = torch.empty_like(r) if values else torch.zeros_like(r)
        z = torch.empty_like(r) if draw else r.new_empty(0)
        if r.shape[0] and (values or draw):
            plan = self._plan("forward", marginals=values, draw=draw)
            _launch(plan, r, _seed(seed, r), None, m if values else None, z if draw else None, None, None, None)
        return m, z

    def chosen(self, r: Tensor, seed: Tensor, p: Tensor, slots: int) -> tuple[Tensor, Tensor, Tensor]:
        """``Kernels.chosen`` in one kernel: the draw, then the drawn by p [T, N] descending (ties to the
        lower index), then the lowest undrawn ascending -> (weights [T, slots], indices [T, slots]
        long, mask [T, slots] bool)."""
        T = r.shape[0]
        w = r.new_empty(T, slots)
        idx = torch.empty(T, slots, dtype=torch.int64, device=r.device)
        mask = torch.empty(T, slots, dtype=torch.int8, device=r.device)
        if T and slots:
            plan = self._plan("forward", slots=slots)
            _launch(plan, r, _seed(seed, r), p.to(r.dtype).contiguous(), None, None, w, idx, mask)
        return w, idx, mask.view(torch.bool)  # the kernel writes 0 or 1

    def cov_vec(self, r: Tensor, v: Tensor) -> Tensor:
        """Cov(z) v: r, v [T, N] -> [T, N], one kernel."""
        out = torch.empty_like(r)
        if r.shape[0]:
            _launch(self._plan("cov"), r, v.to(r.dtype).contiguous(), None, None, None, out)
        return out

    def chosen_backward(self, r: Tensor, indices: Tensor, mask: Tensor, g: Tensor, kind: str, paper: bool) -> Tensor:
        """``Kernels.chosen_backward`` in one kernel: Cov(z) g_t (times sigma(-r) with ``paper``) plus
        the scores' backward, g_t = (g at the used slots, at their variables) times the scores."""
        out = torch.empty_like(r)
        slots = indices.shape[-1]
        if r.shape[0] and slots:
            plan = self._plan("cov", v_from=kind, paper=paper, slots=slots)
            _launch(plan, r, None, *slot_inputs(r, indices, mask, g), out)
        elif r.shape[0]:
            out.zero_()
        return out

    def log_counts(self, r: Tensor, paper: bool) -> Tensor:
        """log Z_j for j = kmin..kmax (``paper``: log P_indep(|S| = j)): r [T, N] -> [T, J], one kernel
        sweeping float64 log-probabilities."""
        T, N = r.shape
        out = r.new_empty(T, self.kmax - self.kmin + 1)
        if T:
            fn = lattice.kernel(self._plan("log_counts", paper=paper))
            block = _block()
            rt = r.t().contiguous()  # [N, T], as in _launch
            fn[(-(-T // block),)](rt, out, T, N, 0, T, BLOCK=block, num_warps=lattice.BLOCK // 32)
        return out


def slot_inputs(r: Tensor, indices: Tensor, mask: Tensor, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The slots as the backward kernels read them: (indices int32, the used mask int8 (no copy for
    bool), the slots' gradients in r's dtype), each [T, slots] and contiguous."""
    used = mask.view(torch.int8) if mask.dtype == torch.bool else mask.to(torch.int8)
    return indices.to(torch.int32).contiguous(), used.contiguous(), g.to(r.dtype).contiguous()


def _seed(seed: Tensor | None, r: Tensor) -> Tensor | None:
    """The seed as the kernels read it: a one-element int64 tensor on r's device (no host read)."""
    return None if seed is None else seed.to(device=r.device, dtype=torch.int64).reshape(1)
