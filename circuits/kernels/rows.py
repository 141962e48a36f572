"""The row operations: ``topk`` (the k largest entries of each row, descending, ties to the lower
index), ``topk_chosen`` (the same order over the keys (z - 1) + x z of a 0/1 choice z, read once per
row), ``kth_largest`` (each row's k-th largest entry, the shift of exactly-k circuits) and the
counter-based ``uniforms`` (``circuits.kernels.uniforms``).

``torch.topk`` leaves the order of ties unspecified (and on the CPU costs about as much as a whole
fused circuit pass at n = 64); these give one order on every device: fused C for float32 CPU rows
(``pm_topk``, ``pm_topk_chosen``, ``pm_kth_largest`` in ``c/select.c``), else the ``reference``
functions, the plain-torch meaning and the C code's oracle. ``RowOps`` holds the choice that
``circuits.kernels.select`` makes from ``Rows`` (a device) and a dtype; every kernel that uses row
operations is given its ``RowOps`` by ``select``. No autograd; ``circuits.ops`` registers them as
torch operators.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .uniforms import uniforms


@dataclass(frozen=True)
class Rows:
    """Row operations on tensors on ``device``: what ``select`` picks a ``RowOps`` from (with a dtype)."""

    device: torch.device


def topk_reference(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """x [T, n] -> (values [T, k], indices [T, k] long), a stable descending sort; NaN counts as -inf."""
    values, indices = torch.sort(torch.where(x.isnan(), -torch.inf, x), dim=-1, descending=True, stable=True)
    return values[:, :k], indices[:, :k]


def kth_largest_reference(x: Tensor, k: int) -> Tensor:
    """x [T, n], 1 <= k <= n -> [T]: the k-th largest of each row; NaN counts as -inf."""
    return torch.where(x.isnan(), -torch.inf, x).topk(k, dim=-1, sorted=False).values.amin(dim=-1)  # [T, k] -> [T]


def topk_chosen_reference(z: Tensor, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest keys (z - 1) + x z of each row, as ``topk_reference``: z [T, n] in {0, 1}, x [T, n] >= 0
    -> (values [T, k], indices [T, k] long): the chosen entries (z = 1) by x descending, then the
    others (value -1) by index."""
    return topk_reference((z - 1).addcmul_(x, z), k)


def exactly_k_shift(kth: Tensor) -> Tensor:
    """The exactly-k shift from each row's k-th largest logit [T]: [T, 1], 0 where that is -inf (a
    row with fewer than k finite logits)."""
    kth = kth.unsqueeze(-1)
    return torch.where(torch.isfinite(kth), kth, torch.zeros_like(kth))


def _in_c(lib, *xs: Tensor) -> bool:
    """Whether the C library ``lib`` (None: none) takes rows ``xs``: float32 CPU tensors."""
    return lib is not None and all(x.dtype == torch.float32 and x.device.type == "cpu" for x in xs)


@dataclass(frozen=True)
class RowOps:
    """The row operations as ``select`` gives them for rows of one dtype on one device: ``lib``, the C
    kernels library, for the selections (None: the torch references), and ``uniforms_lib``, the one
    the uniforms are made with (float32 on the CPU, whatever the rows' dtype; None: the reference).
    Either way the same results, bit for bit; the C code needs contiguous float32 CPU rows, and a
    call outside that (or an empty one) takes the reference."""

    lib: object = None
    uniforms_lib: object = None

    @property
    def name(self) -> str:
        return "fused C" if self.lib is not None else "torch"

    def uniforms(self, seed: Tensor, count: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """``count`` counter-based uniforms of ``dtype`` on ``device`` from a 0-dim int64 ``seed``
        (``circuits.kernels.uniforms.uniforms``)."""
        return uniforms(seed, count, device, dtype, self.uniforms_lib)

    def topk(self, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """x [T, n] float, 0 <= k <= n -> (values [T, k], indices [T, k] long)."""
        if x.dim() != 2 or not 0 <= k <= x.shape[1]:
            raise ValueError(f"topk takes x [T, n] and 0 <= k <= n, got shape {list(x.shape)} and k = {k}")
        if not _in_c(self.lib, x) or k == 0 or x.shape[0] == 0:
            return topk_reference(x, k)
        x = x.detach().contiguous()
        values, indices = x.new_empty(x.shape[0], k), torch.empty(x.shape[0], k, dtype=torch.int64)
        if self.lib.pm_topk(
            x.data_ptr(), x.shape[0], x.shape[1], k, values.data_ptr(), indices.data_ptr(), torch.get_num_threads()
        ):
            raise MemoryError("circuits: topk could not allocate its scratch")
        return values, indices

    def topk_chosen(self, z: Tensor, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """``topk_chosen_reference`` for z in {0, 1} and x >= 0 (or NaN), [T, n] float, 0 <= k <= n; in C
        without building the keys or sorting every entry (O(n + c^2) per row with c chosen, where
        ``topk`` takes O(n k))."""
        if z.dim() != 2 or z.shape != x.shape or not 0 <= k <= z.shape[1]:
            raise ValueError(
                f"topk_chosen takes z, x [T, n] of one shape and 0 <= k <= n, got shapes "
                f"{list(z.shape)}, {list(x.shape)} and k = {k}"
            )
        if not _in_c(self.lib, z, x) or k == 0 or x.shape[0] == 0:
            return topk_chosen_reference(z, x, k)
        z, x = z.detach().contiguous(), x.detach().contiguous()
        values, indices = x.new_empty(x.shape[0], k), torch.empty(x.shape[0], k, dtype=torch.int64)
        if self.lib.pm_topk_chosen(
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

    def kth_largest(self, x: Tensor, k: int) -> Tensor:
        """x [T, n] float, 1 <= k <= n -> [T] (the C loop would read before its buffer otherwise)."""
        if x.dim() != 2 or not 1 <= k <= x.shape[1]:
            raise ValueError(
                f"kth_largest takes x [T, n] and k in [1, n = {x.shape[-1]}], got shape {list(x.shape)} and k = {k}"
            )
        if not _in_c(self.lib, x) or x.shape[0] == 0:
            return kth_largest_reference(x, k)
        x = x.detach().contiguous()
        out = x.new_empty(x.shape[0])
        if self.lib.pm_kth_largest(x.data_ptr(), x.shape[0], x.shape[1], k, out.data_ptr(), torch.get_num_threads()):
            raise MemoryError("circuits: kth_largest could not allocate its scratch")
        return out


#: The torch references (and reference uniforms): what a kernel made without ``select`` uses.
REFERENCES = RowOps()
