"""Compile the layer-parallel kernels (``triton_layers``) ahead of time for a GPU architecture, no GPU needed.

Triton's interpreter (the CPU tests) accepts code that its compiler rejects, and says nothing of
registers; this compiles every specialisation ``TritonPasses`` launches to a cubin for ``arch`` (80:
A100, 90: H100) with the ptxas that ships with triton, and reads ptxas's report: registers per thread,
spill stores and loads, stack. Run it without ``TRITON_INTERPRET`` (``tools/bench_circuits_gpu.py
--registers`` prints the table; the tests check that every kernel compiles without spills).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterator

INTS = {"tile0", "t0", "Tc", "TS", "T", "S", "n", "slots", "k"}
FLOAT32 = {"up", "down"}  # the tilt's size tables stay float32 in the float64 passes
INT64 = {"indices"}
BOOL = {"mask"}
TABLES = {"tiles", "order", "row0", "fanin", "prime", "sub", "imp_off", "imp_var", "par_off", "par_rows", "sid"}


def variants(bn: int = 4, bt: int = 128) -> Iterator[tuple[str, object, dict]]:
    """(label, kernel, constexprs) for every specialisation the passes launch with tiles of bn nodes
    (variables) by bt tokens; labels ending in "f64" take float64 values (log Z and the marginals in
    float64: ``TritonPasses.log_partition``)."""
    from . import triton_layers as K
    from .triton_passes import chosen_tile

    yield "leaves", K.leaves_kernel, dict(BV=bn, BT=bt, TANGENTS=False)
    yield "leaves+tangents", K.leaves_kernel, dict(BV=bn, BT=bt, TANGENTS=True)
    for name, flags in (
        ("up sum", dict(MAX=False, TANGENTS=False, TILT=False, IMPLICIT=False)),
        ("up sum tilted implicit", dict(MAX=False, TANGENTS=False, TILT=True, IMPLICIT=True)),
        ("up max tilted implicit", dict(MAX=True, TANGENTS=False, TILT=True, IMPLICIT=True)),
        ("up tangents", dict(MAX=False, TANGENTS=True, TILT=False, IMPLICIT=False)),
        ("up tangents tilted implicit", dict(MAX=False, TANGENTS=True, TILT=True, IMPLICIT=True)),
    ):
        yield name, K.up_kernel, dict(BN=bn, BT=bt, **flags)
    for mode, name in enumerate(("flow", "jvp", "sample", "map")):
        yield f"down {name}", K.down_kernel, dict(BN=bn, BT=bt, MODE=mode)
        for smooth in (True, False):
            yield (
                f"leaf {name}{'' if smooth else ' implicit'}",
                K.leaf_kernel,
                dict(BV=bn, BT=bt, MODE=mode, SMOOTH=smooth),
            )
    for n in (64, 256):
        BN, BT = chosen_tile(n)
        yield f"chosen n={n}", K.chosen_kernel, dict(BT=BT, BN=BN)
        yield f"kth largest n={n}", K.kth_largest_kernel, dict(BT=BT, BN=BN)
    yield "leaves f64", K.leaves_kernel, dict(BV=bn, BT=bt, TANGENTS=False)
    up = dict(BN=bn, BT=bt, MAX=False, TANGENTS=False, TILT=True, IMPLICIT=True)
    yield "up sum tilted implicit f64", K.up_kernel, up
    yield "down flow f64", K.down_kernel, dict(BN=bn, BT=bt, MODE=0)
    yield "leaf flow implicit f64", K.leaf_kernel, dict(BV=bn, BT=bt, MODE=0, SMOOTH=False)


def ptxas_report(ptx: str, arch: int) -> dict:
    """ptxas -v on ``ptx`` for sm_``arch``: {registers, spill_stores, spill_loads, stack} (bytes)."""
    from triton.backends.nvidia.compiler import get_ptxas

    tool = get_ptxas(arch)
    path = getattr(tool, "path", tool)
    suffix = "a" if arch >= 90 else ""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        done = subprocess.run(
            [path, f"-arch=sm_{arch}{suffix}", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True
        )
    text = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed: {text[-2000:]}")
    num = lambda pattern: int(m.group(1)) if (m := re.search(pattern, text)) else 0
    return {
        "registers": num(r"Used (\d+) registers"),
        "spill_stores": num(r"(\d+) bytes spill stores"),
        "spill_loads": num(r"(\d+) bytes spill loads"),
        "stack": num(r"(\d+) bytes stack frame"),
    }


def compile_all(arch: int = 90, bn: int = 4, bt: int = 128, num_warps: int = 4) -> list[dict]:
    """Every specialisation of ``variants`` compiled for sm_``arch`` (``triton.compile``, no device):
    one dict per kernel with its label and ``ptxas_report``. Raises what the compiler raises."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out = []
    for label, fn, consts in variants(bn, bt):
        real = "*fp64" if label.endswith("f64") else "*fp32"
        sig = {
            a: "constexpr"
            if a in consts
            else "i32"
            if a in INTS
            else "*i32"
            if a in TABLES
            else "*i64"
            if a in INT64
            else "*i1"
            if a in BOOL
            else "*fp32"
            if a in FLOAT32
            else real
            for a in fn.arg_names
        }
        src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): x for k, x in consts.items()})
        kernel = triton.compile(
            src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps, "enable_fp_fusion": False}
        )
        out.append({"kernel": label, **ptxas_report(kernel.asm["ptx"], arch)})
    return out
