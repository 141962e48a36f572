"""Native code shared by ``circuits.passes`` and by ``probmoe``: the C build machinery and the
row operations every routing call uses.

    build.py     NativeLibrary: C sources built with the system's cc on first use, loaded with
                 ctypes, cached per CPU and compiler; PROBMOE_NATIVE=0 turns every library off
    c/           C units shared by every library (vmath.c: SIMD exp/log; scratch.c: per-thread
                 scratch) and the row operations' sources (select.c, uniforms.c)
    rows.py      ROWS: the row-operations library (select.c, uniforms.c)
    select.py    topk, kth_largest: per-row selection, ties to the lower index (C or torch)
    uniforms.py  uniforms, seed_tensor: counter-based uniforms from one seed (C or torch)

Each C routine has a plain-torch ``reference`` beside it with the same results: its test oracle
and its fallback where the library is not built (no compiler, not Linux, PROBMOE_NATIVE=0).
"""

from .build import SCRATCH, VMATH, NativeLibrary, build_dir

__all__ = ["SCRATCH", "VMATH", "NativeLibrary", "build_dir"]
