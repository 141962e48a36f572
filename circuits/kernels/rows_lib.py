"""``ROWS``: the row-operations library (``c/select.c``: row top-k, top-k of chosen entries and k-th largest;
``c/uniforms.c``: counter-based uniforms), a ``NativeLibrary`` built on first use into
``<cache dir>/native/<key>/librows.so``. ``library()`` is the loaded library or None. ``Rows``: what
``circuits.kernels.select`` picks the row operations' implementation from (C or torch)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from .build import NativeLibrary

SOURCES = Path(__file__).with_name("c")


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for fn, args in [
        (lib.pm_kth_largest, [ptr, i64, i64, i64, ptr, i64]),
        (lib.pm_topk, [ptr, i64, i64, i64, ptr, ptr, i64]),
        (lib.pm_topk_chosen, [ptr, ptr, i64, i64, i64, ptr, ptr, i64]),
        (lib.pm_uniforms, [i64, i64, i64, ptr, i64]),
    ]:
        fn.restype, fn.argtypes = i64, args


ROWS = NativeLibrary(
    "rows", [SOURCES / "select.c", SOURCES / "uniforms.c"], _declare, fast_math=None, label="C row operations"
)
library = ROWS.library
describe = ROWS.describe


@dataclass(frozen=True)
class Rows:
    """Row operations on tensors on ``device``: ``circuits.kernels.select.select(Rows(device), dtype)`` is the
    C library where it takes them, else None (the plain-torch references)."""

    device: torch.device
