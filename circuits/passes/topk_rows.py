"""``topk``: the k largest entries of each row, descending, ties to the lower index.

``torch.topk`` leaves the order of ties unspecified (and on the CPU costs about as much as a whole
fused circuit pass at n = 64); this is the same selection with one order on every device: fused C
for contiguous float32 CPU rows (``pm_topk`` in ``c/select.c``), else ``reference``, a stable
descending sort, the plain-torch meaning and the C code's oracle.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import c_library


def reference(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """x [T, n] -> (values [T, k], indices [T, k] long); NaN counts as -inf."""
    values, indices = torch.sort(torch.where(x.isnan(), -torch.inf, x), dim=-1, descending=True, stable=True)
    return values[:, :k], indices[:, :k]


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """x [T, n] float, 0 <= k <= n -> (values [T, k], indices [T, k] long), no autograd."""
    if x.dim() != 2 or not 0 <= k <= x.shape[1]:
        raise ValueError(f"topk takes x [T, n] and 0 <= k <= n, got shape {list(x.shape)} and k = {k}")
    lib = c_library.library() if x.device.type == "cpu" and x.dtype == torch.float32 else None
    if lib is None or k == 0 or x.shape[0] == 0:
        return reference(x, k)
    x = x.detach().contiguous()
    values, indices = x.new_empty(x.shape[0], k), torch.empty(x.shape[0], k, dtype=torch.int64)
    if lib.pm_topk(x.data_ptr(), x.shape[0], x.shape[1], k, values.data_ptr(), indices.data_ptr(),
                   torch.get_num_threads()):
        raise MemoryError("circuits: topk could not allocate its scratch")
    return values, indices
