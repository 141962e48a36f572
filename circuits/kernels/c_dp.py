"""The cardinality DP fused in C (``circuits/kernels/c/cardinality.c``) for float32 CPU tensors.

The same results as the torch sweeps of ``circuits.kernels.torch_dp``, the reference and oracle:
``forward_marginals`` is ``TorchDP.forward_marginals`` (one up and one down sweep per tile of
tokens, the draw from the same uniforms as ``torch_dp.down``, so a seeded generator gives the same
draws either way) and ``cov_vec`` is ``torch_dp.cov_vec``. The library is the kernels' one
(``circuits.kernels.library``); off with ``PROBMOE_NATIVE=0``. ``circuits.kernels.select`` takes
``CDP`` where the library takes the logits (float32 on the CPU).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .library import describe, library
from .rows import REFERENCES, RowOps
from .torch_dp import TorchDP
from .uniforms import uniforms


def _checked(r: Tensor, kmin: int, kmax: int) -> Tensor:
    """r [T, N] as a contiguous float32 CPU tensor; ValueError for anything the C code cannot take."""
    if r.dim() != 2 or r.dtype != torch.float32 or r.device.type != "cpu":
        raise ValueError(f"the C DP takes float32 CPU logits [T, N], got {r.dtype} {tuple(r.shape)} on {r.device}")
    if not 0 <= kmin <= kmax:  # the rule's home is circuits.spec.RangeK; the C code must not see it broken
        raise ValueError(f"the C DP needs 0 <= kmin <= kmax, got kmin={kmin}, kmax={kmax}")
    return r.contiguous()


def _run(fn, *args) -> int:
    """Call a C entry point with torch's thread count (OpenMP threads inside; ctypes releases the
    GIL); returns how many tiles of tokens took the linear sweep."""
    linear_tiles = fn(*args, torch.get_num_threads())
    if linear_tiles < 0:
        raise MemoryError("circuits.dp: the C DP could not allocate its scratch")
    return linear_tiles


def _ptr(x: Tensor | None):
    return None if x is None else x.data_ptr()


def forward_marginals(
    r: Tensor, kmin: int, kmax: int, seed: Tensor | None, values: bool, *, linear: bool = True
) -> tuple[Tensor, Tensor]:
    """(m [T, N] or zeros, one draw z [T, N] or an empty tensor) for r [T, N] float32 on the CPU.

    m: the marginals P(i ∈ S | C) when ``values`` (else zeros). z: one exact draw in {0, 1} when
    a ``seed`` is given, from ``uniforms(seed, (N + 1) T)`` as ``dp.down`` with one sample (the
    sizes [T], then the variables [N, T]).
    linear: let tiles of tokens whose logits allow it sweep the lattice as numbers instead of
    logarithms (no exp or log per state; ``cardinality.c`` says when); False: the log sweep
    everywhere (the two are tested against each other).
    """
    r = _checked(r, kmin, kmax)
    T, N = r.shape
    m = torch.empty_like(r) if values else None
    want_sample = seed is not None
    z = torch.empty_like(r) if want_sample else None
    rand = uniforms(seed, (N + 1) * T, r.device, r.dtype, library()) if want_sample else None  # [(N + 1) T]
    if values or want_sample:
        _run(library().dp_forward, r.data_ptr(), _ptr(rand), _ptr(m), _ptr(z), T, N, kmin, kmax, int(linear))
    return (m if values else torch.zeros_like(r)), (z if want_sample else r.new_empty(0))


def cov_vec(r: Tensor, v: Tensor, kmin: int, kmax: int, *, linear: bool = True) -> Tensor:
    """Cov(z) v = (d m / d r) v from r alone (``dp.cov_vec``): r, v [T, N] -> [T, N] float32;
    ``linear`` as in ``forward_marginals``."""
    r = _checked(r, kmin, kmax)
    if v.shape != r.shape:
        raise ValueError(f"cov_vec: v {tuple(v.shape)} must have the shape of r {tuple(r.shape)}")
    v = v.to(torch.float32).contiguous()
    out = torch.empty_like(r)
    _run(
        library().dp_cov_vec,
        r.data_ptr(),
        v.data_ptr(),
        out.data_ptr(),
        r.shape[0],
        r.shape[1],
        kmin,
        kmax,
        int(linear),
    )
    return out


def chosen_scores(
    r: Tensor, p: Tensor, seed: Tensor, kmin: int, kmax: int, slots: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The forward of ``circuits::chosen_scores`` in one pass over the tiles: one draw z from
    ``seed`` (the uniforms and the draw of ``forward_marginals``, bit for bit), then the drawn
    variables by their score p descending (ties to the lower index) in ``slots`` slots.
    r, p [T, N] float32 (p: the scores, read at the drawn variables) -> (indices [T, slots] long,
    weights [T, slots] = p there, mask [T, slots] bool); unused slots hold the
    lowest undrawn variables, ascending (distinct), weight 0."""
    r = _checked(r, kmin, kmax)
    T, N = r.shape
    p = p.to(torch.float32).contiguous()
    idx = torch.empty(T, slots, dtype=torch.int64)
    w = torch.empty(T, slots, dtype=torch.float32)
    mask = torch.empty(T, slots, dtype=torch.bool)
    if T and slots:
        _run(
            library().dp_chosen,
            r.data_ptr(),
            int(seed),
            p.data_ptr(),
            idx.data_ptr(),
            w.data_ptr(),
            mask.data_ptr(),
            T,
            N,
            kmin,
            kmax,
            slots,
            1,
        )
    return idx, w, mask


def chosen_scores_backward(
    r: Tensor, idx: Tensor, mask: Tensor, g: Tensor, kmin: int, kmax: int, sigmoid: bool
) -> Tensor:
    """The gradient of ``chosen_scores``' weights (the exact convention): r [T, N]; idx [T, slots]
    (int32 or long), mask [T, slots] bool, g [T, slots] the weights' gradient -> [T, N]: Cov(z) g_t +
    the scores' backward, g_t = (g scattered to idx) ⊙ p, p = softmax(r) (or sigmoid(r)) recomputed."""
    r = _checked(r, kmin, kmax)
    T, N = r.shape
    idx = idx.to(torch.int32).contiguous()
    g = g.to(torch.float32).contiguous()
    mask = mask.to(torch.bool).contiguous()
    out = torch.empty_like(r)
    if T:
        _run(
            library().dp_chosen_backward,
            r.data_ptr(),
            idx.data_ptr(),
            g.data_ptr(),
            mask.data_ptr(),
            out.data_ptr(),
            T,
            N,
            kmin,
            kmax,
            idx.shape[1],
            int(sigmoid),
            1,
        )
    return out


def linear_tiles(r: Tensor, kmin: int, kmax: int) -> tuple[int, int]:
    """(tiles that take the linear sweep, tiles) for logits r [T, N] float32 on the CPU: how much
    of a batch runs without an exp or log per lattice state (``cardinality.c``, "The linear
    sweep"). A tile holds up to 128 tokens (fewer for large N * kmax); one token whose logits are
    spread too far apart sends its whole tile to the log sweep. For diagnostics and tests."""
    r = _checked(r, kmin, kmax)
    T, N = r.shape
    m = torch.empty_like(r)
    done = _run(library().dp_forward, r.data_ptr(), None, m.data_ptr(), None, T, N, kmin, kmax, 1)
    return done, -(-T // library().dp_forward_lanes(N, kmax))


class CDP(TorchDP):
    """The DP's kernels for float32 CPU tensors, with ``TorchDP``'s interface and results: the
    marginals, the draw and Cov(z) v in C; the log counts by size (``log_counts``, its backward)
    stay ``TorchDP``'s."""

    name = "fused C"
    fused = True

    def __init__(self, kmin: int, kmax: int, rows: RowOps = REFERENCES):
        if library() is None:
            raise RuntimeError(f"the C DP is not available ({describe()})")
        super().__init__(kmin, kmax, rows)

    def forward_marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        """(m [T, N] or zeros, one draw [T, N] from ``seed`` or an empty tensor)."""
        return forward_marginals(r, self.kmin, self.kmax, seed, values)

    def cov_vec(self, r: Tensor, v: Tensor) -> Tensor:
        """Cov(z) v: r, v [T, N] -> [T, N]."""
        return cov_vec(r, v, self.kmin, self.kmax)

    def chosen(self, r: Tensor, seed: Tensor, p: Tensor, slots: int) -> tuple[Tensor, Tensor, Tensor]:
        """``Kernels.chosen`` in one pass over the tiles (``chosen_scores``)."""
        idx, w, mask = chosen_scores(r, p, seed, self.kmin, self.kmax, slots)
        return w, idx, mask

    def chosen_backward(self, r: Tensor, indices: Tensor, mask: Tensor, g: Tensor, kind: str, paper: bool) -> Tensor:
        """``Kernels.chosen_backward`` in one pass (``chosen_scores_backward``) for the exact
        convention; the "paper" one is composed."""
        if paper:
            return super().chosen_backward(r, indices, mask, g, kind, paper)
        return chosen_scores_backward(r, indices, mask, g, self.kmin, self.kmax, kind == "sigmoid")
