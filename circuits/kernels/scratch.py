"""``ScratchPool``: scratch buffers reused across calls, for batched passes over large [rows, T] tensors."""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor


class ScratchPool(threading.local):
    """Scratch buffers reused across calls (one set per thread).

    Fresh multi-megabyte CPU allocations page-fault on first touch, which costs as much as the
    arithmetic; reusing buffers removes that. ``get(name, shape, like)`` returns a tensor of
    ``shape`` with ``like``'s dtype and device whose contents are arbitrary. Buffers made under
    ``torch.inference_mode`` are kept apart (they cannot be written outside it). Buffers above
    ``max_bytes`` are allocated per call and not kept.
    """

    def __init__(self, max_bytes: int = 256 << 20):
        self.max_bytes = max_bytes
        self.buffers: dict[tuple, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        numel = math.prod(shape)
        key = (name, like.dtype, like.device, torch.is_inference_mode_enabled())  # inference tensors stay there
        buf = self.buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = like.new_empty(numel)
            if numel * buf.element_size() <= self.max_bytes:
                self.buffers[key] = buf
        return buf[:numel].view(shape)
