"""The counting circuits built directly (circuits.compiler.count_tree) against the pysdd-built ones: the
same layout up to the order of nodes within a height and of elements within a node (an
isomorphism of the two DAGs, checked by interning every node bottom-up), the same groups table,
levels and sizes; the same function by brute force; and the speed and cache size the issue asks
for, in a fresh process."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest
import torch
from brute import exact, group_models, masks

import circuits
from circuits.compiler.compile import compile_sdd
from circuits.layout import FALSE_SLOT, build_layout


def canonical(layout) -> int:
    """The root's id after interning every node as the sorted multiset of its live elements
    (prime id, sub id, implicit variables): equal ids <=> isomorphic circuits."""
    implicit: dict[int, list[int]] = {}
    for row, var in layout.implicit.tolist():
        implicit.setdefault(row, []).append(var)
    ids = {s: ("leaf", s) for s in range(2 + 2 * layout.n)}
    table: dict[tuple, int] = {}
    for start, nodes, fanin, off, _ in layout.groups.tolist():
        for i in range(nodes):
            elems = []
            for e in range(fanin):
                row = off + i * fanin + e
                p, s = layout.children[row].tolist()
                if p != FALSE_SLOT:
                    elems.append((ids[p], ids[s], tuple(sorted(implicit.get(row, ())))))
            ids[start + i] = table.setdefault(tuple(sorted(elems)), len(table))
    return ids[layout.root_slot]


def assert_same_layout(spec) -> None:
    mgr, root = compile_sdd(spec)
    want, got = build_layout(mgr, root), spec.build_direct()
    assert got.sizes() == want.sizes(), spec
    assert got.levels() == want.levels(), spec
    assert (got.groups == want.groups).all(), spec
    assert canonical(got) == canonical(want), spec


CARDINALITY = (
    [circuits.ExactlyK(n, k) for n in range(1, 14) for k in range(n + 1)]
    + [circuits.ExactlyK(n, k) for n, k in ((64, 8), (100, 7), (129, 64), (256, 32))]
    + [circuits.RangeK(n, a, b) for n in range(1, 10) for a in range(n + 1) for b in range(a, n + 1)]
    + [circuits.RangeK(n, a, b) for n, a, b in ((64, 4, 8), (37, 3, 30), (100, 0, 10), (64, 60, 64))]
)


@pytest.mark.parametrize("n", sorted({s.n for s in CARDINALITY}))
def test_cardinality_layouts_match_pysdd(n):
    for spec in CARDINALITY:
        if spec.n == n:
            assert_same_layout(spec)


def _group_specs() -> list:
    out = []
    for sizes in ((2, 2, 2), (3, 1, 2), (4, 4), (1, 1, 1, 1), (2, 3, 3), (5,), (3, 3, 3)):
        n = sum(sizes)
        for limit in range(1, len(sizes) + 1):
            for cap in range(1, max(sizes) + 1):
                for kmin in range(0, n + 1, 2):
                    for kmax in range(kmin, n + 1, 3):
                        with contextlib.suppress(ValueError):  # past what the limits allow
                            out.append(
                                circuits.GroupLimited(n, None, list(sizes), limit, capacity=cap, kmin=kmin, kmax=kmax)
                            )
    return out + [
        circuits.GroupLimited(64, 8, 8, 2),
        circuits.GroupCapacity(64, 8, 8, 2),
        circuits.GroupCapacity(48, groups=[8, 16, 4, 20], capacity=3, kmin=2, kmax=9),
        circuits.GroupLimited(40, groups=10, max_groups=3, capacity=2, kmin=1, kmax=6),
    ]


GROUPS = _group_specs()


@pytest.mark.parametrize("chunk", range(4))
def test_group_layouts_match_pysdd(chunk):
    for spec in GROUPS[chunk::4]:
        assert_same_layout(spec)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize(
    "spec",
    [
        circuits.ExactlyK(9, 4),
        circuits.RangeK(10, 2, 7),
        circuits.ExactlyK(5, 0),
        circuits.GroupLimited(9, groups=3, max_groups=2, kmin=1, kmax=5),
        circuits.GroupCapacity(10, 4, [3, 3, 4], 2),
    ],
    ids=lambda s: s.describe(),
)
def test_direct_circuits_against_brute_force(spec, tmp_path):
    c = circuits.compile_circuit(spec, cache_dir=tmp_path)
    assert c.info["compiler"] == "direct"
    allowed = group_models(spec) if hasattr(spec, "groups") else masks(spec.n, spec.cardinalities)
    r = torch.randn(4, spec.n, generator=torch.Generator().manual_seed(spec.n)) * 1.5
    want = exact(r, allowed)
    torch.testing.assert_close(c.log_partition(r), want.log_partition, atol=1e-10, rtol=0)
    torch.testing.assert_close(c.marginals(r), want.marginals, atol=1e-10, rtol=0)
    assert torch.equal(c.map(r), want.map)


FRESH = """
import json, sys, time
t0 = time.perf_counter()
import circuits
c = circuits.compile_circuit(circuits.ExactlyK({n}, {k}), cache_dir=sys.argv[1])
print(json.dumps({{"compile": c.info["compile_seconds"], "call": time.perf_counter() - t0}}))
"""


def _fresh_compile(n: int, k: int, cache_dir) -> tuple[dict, int]:
    """Compile ExactlyK(n, k) cold in a new process: its timings, and the entry's size in bytes."""
    res = subprocess.run(
        [sys.executable, "-c", FRESH.format(n=n, k=k), str(cache_dir)], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr
    entry = cache_dir / circuits.ExactlyK(n, k).key
    return json.loads(res.stdout), sum(f.stat().st_size for f in entry.iterdir())


def test_exactly_128_of_1024_is_fast_and_small(tmp_path):
    times, size = _fresh_compile(1024, 128, tmp_path)
    assert size <= 10 * 2**20  # the bound; 2.2 MB measured
    assert times["compile"] < 5  # 0.2-0.5 s measured on the shared 2-core EPYC; generous here


@pytest.mark.slow
def test_exactly_64_of_4096_under_10_seconds(tmp_path):
    times, size = _fresh_compile(4096, 64, tmp_path)
    assert times["compile"] < 10 and size <= 10 * 2**20
