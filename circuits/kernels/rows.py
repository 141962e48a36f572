"""Per-row selection: ``topk`` (the k largest entries, descending, ties to the lower index),
``topk_chosen`` (the same order over the keys (z - 1) + x z of a 0/1 choice z, read once per row)
and ``kth_largest`` (each row's k-th largest entry, the shift of exactly-k circuits).

``torch.topk`` leaves the order of ties unspecified (and on the CPU costs about as much as a whole
fused circuit pass at n = 64); these give one order on every device: fused C for contiguous
float32 CPU rows (``pm_topk`` and ``pm_kth_largest`` in ``c/select.c``), else the ``reference``
functions, the plain-torch meaning and the C code's oracle; ``circuits.kernels.select`` picks.
Both are plain functions, no autograd; ``circuits.ops`` registers them as torch operators.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import rows_lib


def _library(x: Tensor):
    """The C row-operations library for rows like ``x``, or None (the references): ``select`` picks."""
    return rows_lib.ROWS.takes(x.device, x.dtype)


def topk_reference(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """x [T, n] -> (values [T, k], indices [T, k] long), a stable descending sort; NaN counts as -inf."""
    values, indices = torch.sort(torch.where(x.isnan(), -torch.inf, x), dim=-1, descending=True, stable=True)
    return values[:, :k], indices[:, :k]


def kth_largest_reference(x: Tensor, k: int) -> Tensor:
    """x [T, n], 1 <= k <= n -> [T]: the k-th largest of each row; NaN counts as -inf."""
    return torch.where(x.isnan(), -torch.inf, x).topk(k, dim=-1, sorted=False).values.amin(dim=-1)  # [T, k] -> [T]


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """x [T, n] float, 0 <= k <= n -> (values [T, k], indices [T, k] long)."""
    if x.dim() != 2 or not 0 <= k <= x.shape[1]:
        raise ValueError(f"topk takes x [T, n] and 0 <= k <= n, got shape {list(x.shape)} and k = {k}")
    lib = _library(x)
    if lib is None or k == 0 or x.shape[0] == 0:
        return topk_reference(x, k)
    x = x.detach().contiguous()
    values, indices = x.new_empty(x.shape[0], k), torch.empty(x.shape[0], k, dtype=torch.int64)
    if lib.pm_topk(
        x.data_ptr(), x.shape[0], x.shape[1], k, values.data_ptr(), indices.data_ptr(), torch.get_num_threads()
    ):
        raise MemoryError("circuits: topk could not allocate its scratch")
    return values, indices


def topk_chosen_reference(z: Tensor, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest keys (z - 1) + x z of each row, as ``topk_reference``: z [T, n] in {0, 1}, x [T, n] >= 0
    -> (values [T, k], indices [T, k] long): the chosen entries (z = 1) by x descending, then the
    others (value -1) by index."""
    return topk_reference((z - 1).addcmul_(x, z), k)


def topk_chosen(z: Tensor, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``topk_chosen_reference`` for z in {0, 1} and x >= 0 (or NaN), [T, n] float, 0 <= k <= n; in C
    for float32 CPU rows without building the keys or sorting every entry (O(n + c^2) per row with
    c chosen, where ``topk`` takes O(n k))."""
    if z.dim() != 2 or z.shape != x.shape or not 0 <= k <= z.shape[1]:
        raise ValueError(
            f"topk_chosen takes z, x [T, n] of one shape and 0 <= k <= n, got shapes "
            f"{list(z.shape)}, {list(x.shape)} and k = {k}"
        )
    lib = _library(x)
    if lib is None or z.dtype != x.dtype or k == 0 or x.shape[0] == 0:
        return topk_chosen_reference(z, x, k)
    z, x = z.detach().contiguous(), x.detach().contiguous()
    values, indices = x.new_empty(x.shape[0], k), torch.empty(x.shape[0], k, dtype=torch.int64)
    if lib.pm_topk_chosen(
        z.data_ptr(),
        x.data_ptr(),
        x.shape[0],
        x.shape[1],
        k,
        values.data_ptr(),
        indices.data_ptr(),
        torch.get_num_threads(),
    ):
        raise MemoryError("circuits: topk_chosen could not allocate its scratch")
    return values, indices


def kth_largest(x: Tensor, k: int) -> Tensor:
    """x [T, n] float, 1 <= k <= n -> [T] (the C loop would read before its buffer otherwise)."""
    if x.dim() != 2 or not 1 <= k <= x.shape[1]:
        raise ValueError(
            f"kth_largest takes x [T, n] and k in [1, n = {x.shape[-1]}], got shape {list(x.shape)} and k = {k}"
        )
    lib = _library(x)
    if lib is None or x.shape[0] == 0:
        return kth_largest_reference(x, k)
    x = x.detach().contiguous()
    out = x.new_empty(x.shape[0])
    if lib.pm_kth_largest(x.data_ptr(), x.shape[0], x.shape[1], k, out.data_ptr(), torch.get_num_threads()):
        raise MemoryError("circuits: kth_largest could not allocate its scratch")
    return out
