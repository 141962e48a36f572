"""The layer-parallel Triton passes' plan (circuits/kernels/triton_passes.py: tables, tiles, chunks), a quick
check of every pass against the torch passes in Triton's interpreter, and a compile of the heaviest kernel
for sm_90. The full checks are tests/circuits/kernels/circuits_triton_checks.py (run by test_circuits_triton.py,
slow); this file is the default suite's share.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from triton_child import run_checks, run_compiled

import circuits

pytest.importorskip("triton", reason="triton is not installed (the optional extra: pip install -e '.[triton]')")

from circuits.kernels.triton_passes import TritonPasses, build_tables

HERE = Path(__file__).parent


@pytest.mark.parametrize(
    "spec",
    [circuits.ExactlyK(16, 5), circuits.RangeK(12, 3, 7), circuits.GroupLimited(16, 4, 4, 2), circuits.ExactlyK(64, 8)],
    ids=str,
)
@pytest.mark.parametrize("bn", [1, 8, 64])
def test_tables_cover_every_node_once_level_by_level(spec, bn):
    """Up and down tiles each cover every node once, level by level (a node's children all in lower
    levels: a level's launch reads only finished values); each slot's parents are exactly the element
    rows that name it; the variable tiles cover the variables."""
    prog = circuits.compile_circuit(spec).program
    tb = build_tables(prog, bn)
    tiles, order = tb.tiles.numpy(), tb.order.numpy()
    prime, sub, row0, fanin = prog.prime.numpy(), prog.sub.numpy(), tb.row0.numpy(), tb.fanin.numpy()
    first_node = 2 + 2 * prog.n
    par_off, par_rows = tb.par_off.numpy(), tb.par_rows.numpy()
    parents = np.diff(par_off)
    done = np.zeros(prog.num_slots, dtype=bool)
    done[:first_node] = True
    for plan, direction in ((tb.up, "up"), (tb.down, "down")):
        seen = []
        levels = []
        for t0, count in plan:
            level = []
            for first, cnt, fmax, pmax, _imax in tiles[t0 : t0 + count]:
                assert 1 <= cnt <= bn
                slots = order[first : first + cnt]
                assert fmax == fanin[slots].max()
                assert pmax == (0 if direction == "up" else parents[slots].max())
                level += slots.tolist()
            levels.append(level)
            seen += level
        assert sorted(seen) == list(range(first_node, prog.num_slots)), direction
        if direction == "up":
            for level in levels:
                for s in level:
                    rows = np.arange(row0[s], row0[s] + fanin[s])
                    assert done[prime[rows]].all() and done[sub[rows]].all()
                done[level] = True
    for s in range(2, prog.num_slots):
        want = sorted(np.flatnonzero(prime == s).tolist() + np.flatnonzero(sub == s).tolist())
        assert sorted(par_rows[par_off[s] : par_off[s + 1]].tolist()) == want
    assert tb.leaf[1] == -(-prog.n // bn)


def test_chunks_and_the_scratch_budget():
    prog = circuits.compile_circuit(circuits.ExactlyK(16, 5)).program
    fast = TritonPasses(prog, block=32, nodes=8, scratch_bytes=1)
    assert fast.chunks(100, 10, torch.device("cpu")) == [(0, 32), (32, 32), (64, 32), (96, 4)]
    fast.scratch_bytes = 4 * 10 * 64  # two tiles of tokens per chunk
    assert fast.chunks(100, 10, torch.device("cpu")) == [(0, 64), (64, 36)]
    fast.scratch_bytes = None  # the CPU cannot say: the default
    assert fast.chunks(100, 10, torch.device("cpu")) == [(0, 100)]
    assert fast.chunks(0, 10, torch.device("cpu")) == []
    with pytest.raises(ValueError, match="power of two"):
        TritonPasses(prog, nodes=3)


def test_smoke_in_the_interpreter():
    """circuits_triton_checks.py's test_smoke: every pass against the torch passes (compiled on CUDA)."""
    done = run_checks(str(HERE / "circuits_triton_checks.py"), "-k", "test_smoke", timeout=600)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]


COMPILE_ONE = """
from circuits.kernels.triton_layers_compile import compile_all, variants
import circuits.kernels.triton_layers_compile as C
C.variants = lambda bn, bt: [v for v in variants(bn, bt) if v[0] == "up tangents tilted implicit"]
(row,) = compile_all(90)
print(row)
assert row["spill_stores"] == 0 and row["spill_loads"] == 0
print("compiled")
"""


def test_the_heaviest_kernel_compiles_for_sm90_without_spills():
    """The upward kernel with tangents, tilt and implicit variables (the most registers) for sm_90, no GPU
    needed (tests/circuits/kernels/test_circuits_triton.py compiles every specialisation, slow)."""
    done = run_compiled(COMPILE_ONE, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
