"""The kernels' C library: every unit of ``c/`` (their one header ``c/kernels.h`` lists them) built
into one shared library per instruction set, a ``circuits.kernels.build.NativeLibrary``: shipped
in a wheel as ``prebuilt/<isa>/libkernels.so`` (setup.py), else built on first use into
``<cache dir>/native/<key>/libkernels.so``; loaded with ctypes; off with ``PROBMOE_NATIVE=0``.
``library()`` is the loaded library or None; ``describe()`` says which.

The ctypes side of ``c/kernels.h``, written once here: ``ProgStruct`` (the C ``Prog``) and
``FUNCTIONS``, the signature of every entry point Python calls; tests/circuits/kernels/test_c_library.py
checks both against the header.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from .build import NativeLibrary

SOURCES = Path(__file__).with_name("c")
HEADER = SOURCES / "kernels.h"


class ProgStruct(ctypes.Structure):
    """The C ``Prog`` of ``c/kernels.h``: a program's sizes and pointers to its index arrays."""

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
        ("lin_float", ctypes.c_int64),
        ("lin_pos", ctypes.c_double),
        ("lin_neg", ctypes.c_double),
        ("lin_true", ctypes.c_double),
        ("lin_root", ctypes.c_double),
        ("lin_r0", ctypes.c_float),
        ("lin_k", ctypes.c_float),
        ("tilt_up", ctypes.c_void_p),
        ("tilt_down", ctypes.c_void_p),
        ("tilt_kmin", ctypes.c_int64),
        ("tilt_kmax", ctypes.c_int64),
        ("tilt_moves", ctypes.c_int64),
    ]


_I64, _PTR, _PROG = ctypes.c_int64, ctypes.c_void_p, ctypes.POINTER(ProgStruct)

#: name -> (return type, argument types) of each entry point Python calls, as ``c/kernels.h`` declares it.
FUNCTIONS: dict[str, tuple[type, list[type]]] = {
    # select.c: the row operations
    "pm_kth_largest": (_I64, [_PTR, _I64, _I64, _I64, _PTR, _I64]),
    "pm_topk": (_I64, [_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64]),
    "pm_topk_chosen": (_I64, [_PTR, _PTR, _I64, _I64, _I64, _PTR, _PTR, _I64]),
    # uniforms.c
    "pm_uniforms": (_I64, [_I64, _I64, _I64, _PTR, _I64]),
    # passes.c: the circuit passes
    "pm_sample": (_I64, [_PROG, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64]),
    "pm_jvp": (_I64, [_PROG, _PTR, _PTR, _PTR, _PTR, _I64, _I64]),
    "pm_chosen": (_I64, [_PROG, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64]),
    "pm_chosen_backward": (_I64, [_PROG, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _PTR, _I64, _I64]),
    "pm_marginals": (_I64, [_PROG, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64]),
    "pm_log_z": (_I64, [_PROG, _PTR, _PTR, _PTR, _PTR, _I64, _I64]),
    "pm_tile_tokens": (_I64, []),
    "pm_map": (_I64, [_PROG, _PTR, _PTR, _PTR, _PTR, _I64, _I64]),
    # cardinality.c: the DP's sweeps
    "dp_forward": (_I64, [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64]),
    "dp_cov_vec": (_I64, [_PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64]),
    "dp_forward_lanes": (_I64, [_I64, _I64]),
    "dp_chosen": (_I64, [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _I64]),
    "dp_chosen_backward": (_I64, [_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64]),
}


def declare(lib: ctypes.CDLL) -> None:
    """Give each function of ``FUNCTIONS`` its ctypes signature; AttributeError when one is missing."""
    for name, (restype, argtypes) in FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


PREBUILT = Path(__file__).with_name("prebuilt")  # what a wheel ships: <isa>/libkernels.so (setup.py)
LIBRARY = NativeLibrary(
    "kernels",
    sorted(SOURCES.glob("*.c")),
    declare,
    fast_math=SOURCES / "vmath.c",
    label="C kernels",
    prebuilt=PREBUILT,
)
library = LIBRARY.library
describe = LIBRARY.describe
