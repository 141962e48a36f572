"""The fused C cardinality DP (circuits/kernels/c_dp.py, circuits/kernels/c/cardinality.c) against the torch DP
(circuits/kernels/torch_dp.py).

float32 CPU calls of ``circuits::dp_marginals`` take the C sweeps (``circuits.kernels.select.select``); these
tests call both implementations on
the same inputs: the marginals and Cov(z) v against the float64 torch DP, the draws bit for bit from
the same generator seed, the draws' frequencies against the exact marginals, the edge cases, the
fallback to the torch code, and ``probmoe.route`` with and without the C library.
"""

import os
import shutil

import pytest
import torch

import circuits
import circuits.kernels.select
import probmoe
from circuits.kernels import c_dp as dp_native
from circuits.kernels import library
from circuits.kernels import torch_dp as dp
from circuits.kernels.c_dp import CDP
from circuits.kernels.lattice import Lattice
from circuits.kernels.torch_dp import TorchDP
from circuits.kernels.uniforms import seed_tensor

needs_native = pytest.mark.usefixtures("c_dp_built")


def torch_reference(r, kmin, kmax, seed, dtype=torch.float64):
    """(marginals, one draw) of the torch DP in ``dtype`` with uniforms from ``seed``: [T, N] each."""
    u = dp.up(r.to(dtype), kmin, kmax)
    m, z = dp.down(u, u.band_probs(), 1, torch.Generator().manual_seed(seed))
    return m, z[0]


def check_against_torch(r, kmin, kmax, seed=0, dtype=torch.float64):
    """The C marginals, draw and Cov(z) v of r [T, N] float32 against the torch DP in ``dtype``
    (float32: the same rounding of the tilted logits, which at |r| ~ 1e4 costs ~1e-4 in float32)."""
    v = torch.randn(r.shape, generator=torch.Generator().manual_seed(seed + 1))
    m, z = dp_native.forward_marginals(r, kmin, kmax, seed_tensor(torch.Generator().manual_seed(seed)), True)
    m_ref, z_ref = torch_reference(r, kmin, kmax, seed, dtype)
    torch.testing.assert_close(m.to(dtype), m_ref, atol=1e-5, rtol=0, equal_nan=True)
    feasible = ~m_ref.isnan().any(-1)  # an infeasible row (NaN marginals) has no distribution to draw from
    assert torch.equal(z.to(dtype)[feasible], z_ref[feasible])
    cov = dp_native.cov_vec(r, v, kmin, kmax)
    torch.testing.assert_close(
        cov.to(dtype), dp.cov_vec(r.to(dtype), v.to(dtype), kmin, kmax), atol=1e-5, rtol=0, equal_nan=True
    )
    return m, z


def test_built_wherever_a_compiler_is():
    if os.environ.get("PROBMOE_NATIVE", "1") == "0" or shutil.which("cc") is None:
        pytest.skip("no compiler, or turned off")
    assert dp_native.library() is not None


@needs_native
@pytest.mark.parametrize(
    "T,N,kmin,kmax",
    [
        (300, 64, 8, 8),  # the tile (128 tokens) does not divide T
        (257, 64, 4, 8),
        (40, 256, 16, 16),  # smaller tiles: 32 tokens for the draw, 16 for Cov(z) v
        (33, 7, 0, 7),  # kmin = 0, kmax = N
        (17, 9, 9, 9),  # all experts
        (20, 5, 0, 0),  # kmax = 0: the empty set only
        (20, 1, 0, 1),  # N = 1
        (20, 1, 1, 1),
        (10, 3, 2, 5),  # kmax > N: the sizes past N are unreachable
        (1, 5, 2, 3),
        (0, 6, 2, 3),  # T = 0
    ],
)
def test_matches_the_torch_dp(T, N, kmin, kmax):
    r = torch.randn(T, N, generator=torch.Generator().manual_seed(T * N + kmin)) * 3
    m, z = check_against_torch(r, kmin, kmax, seed=T)
    sizes = z.sum(-1)
    assert ((sizes >= kmin) & (sizes <= kmax)).all()
    if kmin == kmax:
        torch.testing.assert_close(m.sum(-1), torch.full((T,), float(kmin)), atol=1e-4, rtol=0)


@needs_native
def test_extreme_logits():
    """-inf logits (never chosen), ±1e4 magnitudes, ties, and a row with exactly kmin finite logits;
    against the float64 DP where the logits are moderate and the float32 DP everywhere."""
    g = torch.Generator().manual_seed(3)
    r = torch.randn(200, 16, generator=g) * 2
    r[0:20, :5] = -torch.inf
    r[20:40] = 0.0  # ties everywhere
    r[40:60] = torch.randn(20, 16, generator=g) * 1e4
    r[60:80, ::2] = 1e4
    r[60:80, 1::2] = -1e4
    r[80:100, :12] = -torch.inf  # exactly 4 finite logits: forced
    r[100:120, 3] = 30.0  # one dominant expert
    for kmin, kmax in [(4, 4), (2, 6), (0, 16)]:
        check_against_torch(torch.cat([r[:40], r[80:]]), kmin, kmax, seed=kmin)
        m, z = check_against_torch(r, kmin, kmax, seed=kmin, dtype=torch.float32)
        assert (z[0:20, :5] == 0).all() and (m[0:20, :5] == 0).all()
        if kmin == 4:
            assert (z[80:100, 12:] == 1).all() and (z[80:100, :12] == 0).all()


def log_sweep_reference(r, kmin, kmax, seed, v):
    """(m, z, Cov(z) v) of the C DP with the linear sweep turned off."""
    m, z = dp_native.forward_marginals(
        r, kmin, kmax, seed_tensor(torch.Generator().manual_seed(seed)), True, linear=False
    )
    return m, z, dp_native.cov_vec(r, v, kmin, kmax, linear=False)


@needs_native
@pytest.mark.parametrize(
    "T,N,kmin,kmax,scale",
    [
        (300, 64, 8, 8, 3.0),
        (300, 64, 4, 8, 4.0),
        (200, 256, 16, 16, 2.0),
        (100, 256, 1, 16, 2.4),  # near the edge: some tiles sweep linearly, some do not
        (130, 9, 0, 9, 5.0),
        (64, 32, 3, 6, 0.0),  # ties everywhere
    ],
)
def test_the_linear_sweep_matches_the_log_sweep(T, N, kmin, kmax, scale):
    """Tiles whose logits allow it sweep the lattice as numbers (no exp or log per state); the
    marginals, Cov(z) v and draws equal those of the log sweep and of the float64 torch DP, -inf
    logits included, and most tiles of these logits do take the linear sweep."""
    g = torch.Generator().manual_seed(T + N)
    r = torch.randn(T, N, generator=g) * scale
    r[:7, : N - kmax] = -torch.inf  # fewer finite logits: w = 0 exactly, unreachable states
    v = torch.randn(T, N, generator=g)
    done, tiles = dp_native.linear_tiles(r, kmin, kmax)
    assert done >= tiles // 2, (done, tiles)
    m, z = check_against_torch(r, kmin, kmax, seed=T)
    m_log, z_log, cov_log = log_sweep_reference(r, kmin, kmax, T, v)
    torch.testing.assert_close(m, m_log, atol=2e-6, rtol=0)
    assert (z != z_log).any(-1).sum() <= max(1, T // 1000)  # only rounding at a boundary may differ
    torch.testing.assert_close(dp_native.cov_vec(r, v, kmin, kmax), cov_log, atol=1e-5, rtol=0)


@needs_native
def test_far_spread_tiles_take_the_log_sweep():
    """One row of ±1e4 logits sends its tile to the log sweep and leaves the others linear; a
    row spread just past what the linear sweep can hold (its states would fall below 2^-120)
    does the same; every row matches the float64 torch DP either way."""
    g = torch.Generator().manual_seed(4)
    r = torch.randn(512, 64, generator=g)  # 4 tiles of 128 tokens
    assert dp_native.linear_tiles(r, 8, 8) == (4, 4)
    r[5, ::2], r[5, 1::2] = 1e4, -1e4  # tile 0
    r[300] = torch.linspace(-60.0, 0.0, 64)  # tile 2: e_8 of the first experts ~ e^-470
    assert dp_native.linear_tiles(r, 8, 8) == (2, 4)
    check_against_torch(torch.cat([r[:5], r[6:]]), 8, 8, seed=1)
    check_against_torch(r, 8, 8, seed=2, dtype=torch.float32)
    check_against_torch(r, 2, 8, seed=3, dtype=torch.float32)


@needs_native
def test_a_state_below_the_floor_sends_its_tile_to_the_log_sweep():
    """Exactly 5 of 6 with two or three logits 60-90 below the rest: the bound on the largest state
    lets the linear sweep start, but the states that must take a low expert fall below 2^-120 (they
    would underflow to 0 and give marginals off by 0.5-1, found by a search); the floor check sends
    the tile to the log sweep, which matches the float64 torch DP."""
    r = torch.tensor(
        [[-90.0, -90.0, 0.0, 0.0, 0.0, 0.0], [-90.0, 0.0, -90.0, 0.0, 0.0, 0.0], [-60.0, -60.0, -60.0, 0.0, 0.0, 0.0]]
    )
    for row in r:
        assert dp_native.linear_tiles(row[None], 5, 5) == (0, 1)
    check_against_torch(r, 5, 5, seed=8)


@needs_native
def test_the_linear_sweep_at_the_edge_of_its_range():
    """Rows scaled from well inside to past the linear sweep's range: wherever a tile ends up,
    the marginals and Cov(z) v match the float64 torch DP (a state that fell below the floor
    unnoticed would show here as a wrong marginal)."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(16, 256, generator=g)
    r = torch.cat([base * s for s in torch.linspace(1.5, 6.0, 16).tolist()])  # tiles of 32 tokens here
    done, tiles = dp_native.linear_tiles(r, 16, 16)
    assert 0 < done < tiles, (done, tiles)
    check_against_torch(r, 16, 16, seed=6)
    check_against_torch(r, 1, 16, seed=7)


@needs_native
def test_infeasible_rows_are_nan_as_in_torch():
    """More -inf logits than kmin allows: the torch DP's marginals and Cov(z) v are NaN there; so are C's."""
    r = torch.randn(4, 6)
    r[1, 1:] = -torch.inf  # one finite logit, kmin = 2
    m, _ = check_against_torch(r, 2, 3)
    assert m[1].isnan().all() and not m[[0, 2, 3]].isnan().any()


@needs_native
def test_garbage_logits_never_draw_more_than_kmax():
    """Validation off (as ``validate_args=False`` allows): a NaN with a logit above 1e30 in the same
    row once drove the draw's count below zero, so it read table rows below its own and drew up to
    6 experts at kmax = 2. Whatever the garbage, a draw stays within kmax."""
    for pos in range(7):
        for big in (2e30, 3e38, torch.inf):
            r = torch.randn(500, 8, generator=torch.Generator().manual_seed(pos))
            r[:, pos], r[:, 7] = big, torch.nan
            _, z = dp_native.forward_marginals(r, 2, 2, seed_tensor(torch.Generator().manual_seed(pos)), True)
            assert z.sum(-1).max() <= 2, (pos, big)


@needs_native
def test_short_lived_threads_do_not_leak_scratch():
    """A call that fits one tile runs on the calling thread, in that thread's scratch (~1 MB at
    N = 256, kmax = 64); the scratch is freed when the thread exits (it leaked 100 MB per 100 threads)."""
    import threading

    r = torch.randn(4, 256)

    def work():
        dp_native.forward_marginals(r, 1, 64, None, True)

    def resident_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    work()
    for _ in range(10):  # warm up the allocator's arenas
        t = threading.Thread(target=work)
        t.start()
        t.join()
    before = resident_mib()
    for _ in range(100):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert resident_mib() - before < 40


@needs_native
def test_frequencies_match_the_marginals():
    """Many tokens with identical logits: every draw is allowed, and each expert's and each size's
    frequency is within 5 standard errors of its exact probability."""
    T = 20_000
    row = torch.tensor([0.8, -0.5, 1.5, -2.0, 0.1, 0.4, -torch.inf, 0.0])
    r = row.expand(T, 8).contiguous()
    m, z = dp_native.forward_marginals(r, 2, 5, seed_tensor(torch.Generator().manual_seed(11)), True)
    sizes = z.sum(-1)
    assert ((sizes >= 2) & (sizes <= 5)).all() and (z[:, 6] == 0).all()
    p = torch_reference(r[:1], 2, 5, 0)[0][0]
    torch.testing.assert_close(m.double(), p.expand(T, 8), atol=1e-6, rtol=0)
    se = (p * (1 - p) / T).sqrt()
    assert ((z.double().mean(0) - p).abs() <= 5 * se + 1e-12).all()
    band = dp.up(r[:1].double(), 2, 5).band_probs()[:, 0]  # [J]
    freq = torch.stack([(sizes == j).double().mean() for j in range(2, 6)])
    assert ((freq - band).abs() <= 5 * (band * (1 - band) / T).sqrt() + 1e-12).all()


@needs_native
def test_results_do_not_depend_on_the_thread_count():
    r = torch.randn(700, 32) * 2
    v = torch.randn(700, 32)
    old = torch.get_num_threads()
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            outs.append(
                (
                    *dp_native.forward_marginals(r, 3, 6, seed_tensor(torch.Generator().manual_seed(0)), True),
                    dp_native.cov_vec(r, v, 3, 6),
                )
            )
        finally:
            torch.set_num_threads(old)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


@needs_native
def test_only_what_is_asked_for():
    """values=False gives zeros (the draw alone); want_sample=False an empty draw and no generator use."""
    r = torch.randn(50, 10)
    g = torch.Generator().manual_seed(5)
    m, z = dp_native.forward_marginals(r, 2, 4, seed_tensor(g), False)
    assert torch.equal(m, torch.zeros(50, 10)) and z.shape == (50, 10)
    assert torch.equal(z, torch_reference(r, 2, 4, 5)[1].float())
    state = g.get_state()
    m, z = dp_native.forward_marginals(r, 2, 4, None, True)
    assert z.numel() == 0 and torch.equal(g.get_state(), state)
    torch.testing.assert_close(m.double(), torch_reference(r, 2, 4, 0)[0], atol=1e-5, rtol=0)


@needs_native
@pytest.mark.parametrize(
    "T,N,kmin,kmax,scale", [(300, 64, 8, 8, 2.0), (257, 64, 4, 8, 3.0), (100, 256, 16, 16, 2.0), (90, 9, 0, 9, 6.0)]
)
def test_the_draw_alone_is_the_draw_with_the_marginals(T, N, kmin, kmax, scale):
    """Without the marginals a linear tile keeps its states, not W, and the draw makes W along its
    path from them (cardinality.c, draw_step_linear): the same draw, bit for bit, as the one that
    reads the W the marginals need; -inf logits (unreachable states, W = 0 or 1 exactly: all of a
    row's finite logits drawn), ties and a far-spread row (its tile on logarithms) included."""
    g = torch.Generator().manual_seed(T + N)
    r = torch.randn(T, N, generator=g) * scale
    r[:9, : N - kmax] = -torch.inf  # kmax finite logits: every one drawn where kmin = kmax
    r[9:20] = 0.5  # ties
    r[-1] = torch.randn(N, generator=g) * 1e4  # the last tile sweeps on logarithms
    done, tiles = dp_native.linear_tiles(r, kmin, kmax)
    assert 0 < done < tiles or tiles == 1
    for s in range(3):
        seed = seed_tensor(torch.Generator().manual_seed(s))
        alone = dp_native.forward_marginals(r, kmin, kmax, seed, False)[1]
        assert torch.equal(alone, dp_native.forward_marginals(r, kmin, kmax, seed, True)[1])
        idx, _, mask = dp_native.chosen_scores(r, torch.softmax(r, -1), seed, kmin, kmax, kmax)
        assert torch.equal(torch.zeros_like(r).scatter(1, idx, mask.float()), alone)


@needs_native
def test_bad_arguments():
    r = torch.randn(4, 6)
    with pytest.raises(ValueError, match="kmin <= kmax"):
        dp_native.forward_marginals(r, 3, 2, seed_tensor(None), True)
    with pytest.raises(ValueError, match="float32 CPU"):
        dp_native.cov_vec(r.double(), r.double(), 1, 2)
    with pytest.raises(ValueError, match="shape"):
        dp_native.cov_vec(r, r[:2], 1, 2)


@needs_native
def test_cardinality_dispatch(monkeypatch):
    """``circuits.kernels.select.select`` gives float32 CPU logits the C sweeps (not dp.up) and float64 the torch
    sweeps (not the C ones), through the operators."""
    r = torch.randn(30, 8)
    assert isinstance(circuits.kernels.select.select(Lattice(8, 2, 4, r.device), torch.float32), CDP)
    assert isinstance(circuits.kernels.select.select(Lattice(8, 2, 4, r.device), torch.float64), TorchDP)
    assert isinstance(
        circuits.kernels.select.select(Lattice(8, 2, 4, r.device), torch.float32, prefer="torch"), TorchDP
    )
    with pytest.raises(ValueError, match="float32"):
        circuits.kernels.select.select(Lattice(8, 2, 4, r.device), torch.float64, prefer="triton")

    def refuse(*args, **kwargs):
        raise AssertionError("the wrong implementation ran")

    ones = torch.ones_like(r)
    with monkeypatch.context() as patch:
        patch.setattr(dp, "up", refuse)
        patch.setattr(dp, "cov_vec", refuse)
        m, z = torch.ops.circuits.dp_marginals(r, seed_tensor(torch.Generator().manual_seed(2)), 2, 4, True)
        torch.ops.circuits.dp_cov_vec(r, ones, 2, 4)
    assert torch.equal(z.double(), torch_reference(r, 2, 4, 2)[1])
    with monkeypatch.context() as patch:
        patch.setattr(dp_native, "forward_marginals", refuse)
        patch.setattr(dp_native, "cov_vec", refuse)
        m64, z64 = torch.ops.circuits.dp_marginals(
            r.double(), seed_tensor(torch.Generator().manual_seed(2)), 2, 4, True
        )
        torch.ops.circuits.dp_cov_vec(r.double(), ones.double(), 2, 4)
    torch.testing.assert_close(m.double(), m64, atol=1e-5, rtol=0)
    assert torch.equal(z.double(), z64)


def test_fallback_when_the_library_is_off(c_dp_off, monkeypatch):
    """With the library off, float32 CPU takes the torch sweeps, and describe() says why."""
    monkeypatch.setattr(dp_native, "forward_marginals", None)  # a call would fail
    monkeypatch.setattr(dp_native, "cov_vec", None)
    r = torch.randn(20, 8)
    assert isinstance(circuits.kernels.select.select(Lattice(8, 1, 3, r.device), r.dtype), TorchDP)
    assert "off" in dp_native.describe()
    with pytest.raises(RuntimeError, match="not available"):
        circuits.kernels.select.select(Lattice(8, 1, 3, r.device), r.dtype, prefer="c")
    m, z = torch.ops.circuits.dp_marginals(r, seed_tensor(torch.Generator().manual_seed(0)), 1, 3, True)
    out = torch.ops.circuits.dp_cov_vec(r, torch.randn(20, 8), 1, 3)
    assert m.dtype == z.dtype == out.dtype == torch.float32 and ((z.sum(-1) >= 1) & (z.sum(-1) <= 3)).all()


def route_dp(r, size, seed):
    """probmoe.route(training=True, backend="dp") forward and backward: (indices, weights, grad)."""
    r = r.clone().requires_grad_()
    out = probmoe.route(r, **size, training=True, backend="dp", generator=torch.Generator().manual_seed(seed))
    c = torch.randn(out.weights.shape, generator=torch.Generator().manual_seed(seed + 1))
    (out.weights * c).sum().backward()
    return out.indices, out.weights.detach(), r.grad


@needs_native
@pytest.mark.parametrize("size", [dict(k=8), dict(kmin=2, kmax=6)])
def test_route_with_and_without_the_library(size, monkeypatch):
    r = torch.randn(300, 32, generator=torch.Generator().manual_seed(4)) * 2
    r[:10, :3] = -torch.inf
    with_c = route_dp(r, size, 9)
    monkeypatch.setattr(library.LIBRARY, "state", {"lib": None, "where": "off"})
    without = route_dp(r, size, 9)
    assert torch.equal(with_c[0], without[0])
    torch.testing.assert_close(with_c[1], without[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(with_c[2], without[2], atol=1e-5, rtol=0)
