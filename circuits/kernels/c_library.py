"""The fused C passes' shared library (``c/passes.c`` with the shared units in ``c/``),
a ``circuits.kernels.build.NativeLibrary``: built on
first use into ``<cache dir>/native/<key>/libpasses.so``, loaded with ctypes, off with
``PROBMOE_NATIVE=0``. ``library()`` is the loaded library or None; ``describe()`` says which.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from .build import SCRATCH, VMATH, NativeLibrary

SOURCES = Path(__file__).with_name("c")


class ProgStruct(ctypes.Structure):
    """The C `Prog` of passes.c: a program's sizes and pointers to its index arrays."""

    _fields_ = [
        ("n", ctypes.c_int64),
        ("num_slots", ctypes.c_int64),
        ("num_rows", ctypes.c_int64),
        ("num_nodes", ctypes.c_int64),
        ("smooth", ctypes.c_int64),
        ("nodes", ctypes.c_void_p),
        ("prime", ctypes.c_void_p),
        ("sub", ctypes.c_void_p),
        ("imp_off", ctypes.c_void_p),
        ("imp_var", ctypes.c_void_p),
        ("lin_coef", ctypes.c_void_p),
        ("lin_pos", ctypes.c_float),
        ("lin_neg", ctypes.c_float),
        ("lin_true", ctypes.c_float),
        ("lin_root", ctypes.c_float),
        ("lin_r0", ctypes.c_float),
        ("lin_k", ctypes.c_float),
        ("tilt_up", ctypes.c_void_p),
        ("tilt_down", ctypes.c_void_p),
        ("tilt_kmin", ctypes.c_int64),
        ("tilt_kmax", ctypes.c_int64),
        ("tilt_moves", ctypes.c_int64),
        ("lin_coef_d", ctypes.c_void_p),
        ("lin_pos_d", ctypes.c_double),
        ("lin_neg_d", ctypes.c_double),
        ("lin_true_d", ctypes.c_double),
        ("lin_root_d", ctypes.c_double),
    ]


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr, prog = ctypes.c_int64, ctypes.c_void_p, ctypes.POINTER(ProgStruct)
    for fn, args in [
        (lib.pm_sample, [prog, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64]),
        (lib.pm_jvp, [prog, ptr, ptr, ptr, ptr, i64, i64]),
        (lib.pm_marginals, [prog, ptr, ptr, ptr, ptr, ptr, i64, i64]),
        (lib.pm_log_z, [prog, ptr, ptr, ptr, ptr, i64, i64]),
        (lib.pm_map, [prog, ptr, ptr, ptr, ptr, i64, i64]),
        (lib.pm_tile_tokens, []),
        (lib.pm_chosen, [prog, ptr, i64, ptr, ptr, ptr, ptr, ptr, i64, ptr, ptr, ptr, i64, i64]),
        (lib.pm_chosen_backward, [prog, ptr, i64, ptr, ptr, ptr, ptr, i64, i64, ptr, i64, i64]),
    ]:
        fn.restype, fn.argtypes = i64, args


NATIVE = NativeLibrary(
    "passes", [SOURCES / "passes.c", SCRATCH.with_name("chosen.c"), SCRATCH, VMATH], _declare, label="C passes"
)
library = NATIVE.library
describe = NATIVE.describe
