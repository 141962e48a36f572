"""The fused C passes (circuits/kernels/c_passes.py) against the torch passes and brute force.

fp32 on the CPU takes the C passes; these tests call both implementations on the same inputs (same
uniforms for sampling) and check the C results against float64 brute force and chi-squared.
"""

import atexit
import os
import shutil

import pytest
import torch
from brute import exact, masks
from stats import chi2_pvalue, mask_counts

import circuits
import circuits.kernels.select
from circuits.kernels import build as native
from circuits.kernels import c_passes, library
from circuits.kernels import rows as select
from circuits.kernels import torch_passes as kernels
from circuits.kernels.c_passes import CPasses
from circuits.kernels.program import draw_uniforms
from circuits.kernels.rows import Rows
from circuits.kernels.torch_passes import TorchPasses

# (x1 or x2) and (not x1 or x3) and (x2 or not x4 or x5) and (not x3 or not x5); x6 is unconstrained
CLAUSES = [[1, 2], [-1, 3], [2, -4, 5], [-3, -5]]


needs_native = pytest.mark.usefixtures("c_passes_built")


def shifted(c, r):
    """r [T, n] shifted as the circuit's fp32 calls shift it (exactly-k: minus the k-th largest)."""
    return c.shifted(r)


def _cnf(tmp_path):
    path = tmp_path / "f.cnf"
    path.write_text(f"p cnf 6 {len(CLAUSES)}\n" + "".join(" ".join(map(str, c)) + " 0\n" for c in CLAUSES))
    return circuits.compile_circuit(path, cache_dir=tmp_path / "cache")


def _cnf_models():
    import itertools

    rows = [
        m
        for m in itertools.product((0.0, 1.0), repeat=6)
        if all(any((m[abs(x) - 1] == 1.0) == (x > 0) for x in c) for c in CLAUSES)
    ]
    return torch.tensor(rows, dtype=torch.float64)


def test_built_wherever_a_compiler_is():
    if os.environ.get("PROBMOE_NATIVE", "1") == "0" or shutil.which("cc") is None:
        pytest.skip("no compiler, or turned off")
    assert library.library() is not None


CIRCUITS = [circuits.ExactlyK(64, 8), circuits.RangeK(60, 4, 8), circuits.ExactlyK(7, 3), circuits.RangeK(9, 0, 9)]


@needs_native
@pytest.mark.parametrize("spec", CIRCUITS, ids=str)
@pytest.mark.parametrize("T", [0, 1, 127, 128, 300])
def test_matches_the_torch_passes(spec, T):
    """Same uniforms -> the same draws; log Z, the marginals, Cov(z) v and the MAP agree with the
    torch reference in fp32 and with float64; partial tiles (T not a multiple of 128) included."""
    c = circuits.compile_circuit(spec)
    prog, n = c.program, spec.n
    native = CPasses(prog)
    gen = torch.Generator().manual_seed(T)
    r = torch.randn(T, n, generator=gen) * 3
    if T > 1:
        r[0, : n - spec.cardinalities[-1]] = -torch.inf  # -inf logits: never chosen, still feasible
    r = shifted(c, r)
    v = torch.randn(T, n, generator=gen)
    uniforms, fill = draw_uniforms(prog, r, gen)
    up = kernels.upward(prog, r)
    z_ref = kernels.sample(prog, r, up, uniforms, fill)
    z, log_z = native.sample(r, uniforms, fill)
    assert (z != z_ref).any(-1).sum() <= max(1, T // 1000)  # only rounding at a boundary may differ
    assert set(z.unique().tolist()) <= {0.0, 1.0}
    sizes = z.sum(-1)
    assert bool(((sizes >= spec.cardinalities[0]) & (sizes <= spec.cardinalities[-1])).all())
    if T > 1:
        assert not z[0, : n - spec.cardinalities[-1]].any()
    torch.testing.assert_close(log_z, up.val[-1], atol=1e-5, rtol=1e-5)
    log_z2, m = native.log_partition(r, True)
    torch.testing.assert_close(log_z2, log_z)
    up64 = kernels.upward(prog, r.double())
    m64 = kernels.marginals_from_flows(prog, kernels.downward(prog, up64), torch.sigmoid(r.double()))
    torch.testing.assert_close(m.double(), m64, atol=2e-6, rtol=0)
    torch.testing.assert_close(log_z.double(), up64.val[-1], atol=1e-5, rtol=1e-6)
    assert native.log_partition(r, False)[1] is None
    z_map, best = native.map(r)
    up_max = kernels.max_upward(prog, r)
    assert torch.equal(z_map, kernels.map_assignment(prog, r, up_max))
    torch.testing.assert_close(best, up_max.val[-1], atol=1e-5, rtol=1e-6)
    jvp = native.marginals_jvp(r, v)
    exact64 = kernels.marginals_jvp(prog, r.double(), v.double())
    torch.testing.assert_close(jvp.double(), exact64, atol=2e-5, rtol=0)
    torch.testing.assert_close(jvp, kernels.marginals_jvp(prog, r, v), atol=2e-5, rtol=0)


@needs_native
@pytest.mark.parametrize("T", [1, 127, 300])
def test_the_shift_is_subtracted_as_the_torch_passes_do(T):
    """A shift [T, 1] given to a pass (the C passes subtract it while loading a tile) gives the
    bits of the same pass on r - shift, for every pass, in the C and the torch passes; -inf and
    ±1e4 logits included."""
    c = circuits.compile_circuit(circuits.ExactlyK(64, 8))
    prog = c.program
    gen = torch.Generator().manual_seed(T)
    r = torch.randn(T, 64, generator=gen) * 3
    r[0, :20] = -torch.inf
    r[-1, 3], r[-1, 9] = 1e4, -1e4
    shift = c._shift(r)
    assert shift is not None and shift.shape == (T, 1)
    rs, v = r - shift, torch.randn(T, 64, generator=gen)
    uniforms, fill = draw_uniforms(prog, r, gen)
    for passes in (CPasses(prog), TorchPasses(prog)):
        for got, want in [
            (passes.sample(r, uniforms, fill, shift=shift), passes.sample(rs, uniforms, fill)),
            (passes.log_partition(r, True, shift=shift), passes.log_partition(rs, True)),
            (passes.map(r, shift=shift), passes.map(rs)),
            ((passes.marginals_jvp(r, v, shift=shift),), (passes.marginals_jvp(rs, v),)),
        ]:
            for a, b in zip(got, want):
                assert torch.equal(a, b), passes.name
    strided = torch.cat([shift, shift], dim=1)[:, :1]  # [T, 1] with stride 2 (a copy would be freed too early)
    if T > 1:
        with pytest.raises(ValueError, match="shift must be a contiguous float32"):
            CPasses(prog).map(r, shift=strided)


@needs_native
@pytest.mark.parametrize(
    "spec,cards", [(circuits.ExactlyK(6, 3), [3]), (circuits.RangeK(6, 2, 4), range(2, 5)), ("cnf", None)]
)
def test_brute_force_fp32(spec, cards, tmp_path):
    """Through the public API in fp32: log Z, the marginals, their Jacobian Cov(z) (the C backward)
    and the MAP agree with brute force, and the C sampler passes chi-squared; the CNF circuit has implicit
    (unsmoothed) variables."""
    if spec == "cnf":
        c, allowed = _cnf(tmp_path), _cnf_models()
        assert not c.program.smooth
    else:
        c, allowed = circuits.compile_circuit(spec), masks(spec.n, cards)
    r = torch.tensor([[0.7, -1.2, 0.3, 2.0, -0.4, 0.1]])
    want = exact(r, allowed)
    torch.testing.assert_close(c.log_partition(r).double(), want.log_partition, atol=1e-6, rtol=0)
    torch.testing.assert_close(c.marginals(r).double(), want.marginals, atol=1e-6, rtol=0)
    assert torch.equal(c.map(r).double(), want.map)
    grad = torch.autograd.grad(c.log_partition(r.requires_grad_()).sum(), r)[0]  # m - sigmoid(r)
    torch.testing.assert_close(grad.double(), want.marginals - torch.sigmoid(r.double()), atol=1e-6, rtol=0)
    r = r.detach()
    jac = torch.autograd.functional.jacobian(lambda x: c.marginals(x), r[0])
    torch.testing.assert_close(jac.double(), want.cov[0], atol=1e-6, rtol=0)
    draws = c.sample(r[0].expand(200_000, -1), generator=torch.Generator().manual_seed(7))
    counts = mask_counts(draws, allowed)
    assert chi2_pvalue(counts, want.probs[0]) > 1e-3
    assert chi2_pvalue(counts, torch.softmax(torch.randn(len(allowed), dtype=torch.float64), 0)) < 1e-6


def _all_passes(passes, r, v, uniforms, fill):
    """(log Z, m, one draw, Cov(z) v) of one implementation of the passes."""
    log_z, m = passes.log_partition(r, True)
    return log_z, m, passes.sample(r, uniforms, fill)[0], passes.marginals_jvp(r, v)


@needs_native
@pytest.mark.parametrize(
    "spec,scale,T",
    [
        (circuits.ExactlyK(64, 8), 3.0, 300),
        (circuits.RangeK(60, 4, 8), 2.0, 300),
        (circuits.ExactlyK(256, 16), 2.5, 260),
        (circuits.GroupLimited(16, 4, [4, 4, 4, 4], 2), 2.0, 200),
        ("cnf", 1.0, 200),  # not smooth: implicit variables
    ],
)
def test_the_linear_upward_matches_the_log_upward(spec, scale, T, tmp_path):
    """Tiles whose values allow it run the upward pass on numbers scaled by constants of the
    circuit (no exp or log per element): log Z, the marginals, Cov(z) v and the draws equal those of
    the upward pass on logarithms and of the float64 torch passes, and most tiles of these logits do
    take it."""
    c = _cnf(tmp_path) if spec == "cnf" else circuits.compile_circuit(spec)
    prog, n = c.program, c.n
    gen = torch.Generator().manual_seed(T + n)
    r = shifted(c, torch.randn(T, n, generator=gen) * scale)
    v = torch.randn(T, n, generator=gen)
    uniforms, fill = draw_uniforms(prog, r, gen)
    linear, logs = CPasses(prog), CPasses(prog, linear=False)
    done, tiles = linear.linear_tiles(r)
    assert done >= (tiles + 1) // 2, (done, tiles)
    assert logs.linear_tiles(r) == (0, tiles)
    got, want = _all_passes(linear, r, v, uniforms, fill), _all_passes(logs, r, v, uniforms, fill)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(got[1], want[1], atol=2e-6, rtol=0)
    assert (got[2] != want[2]).any(-1).sum() <= max(1, T // 1000)  # only rounding at a boundary may differ
    torch.testing.assert_close(got[3], want[3], atol=1e-5, rtol=0)
    up64 = kernels.upward(prog, r.double())
    torch.testing.assert_close(got[0].double(), up64.val[-1], atol=1e-5, rtol=1e-6)
    m64 = kernels.marginals_from_flows(prog, kernels.downward(prog, up64), torch.sigmoid(r.double()))
    torch.testing.assert_close(got[1].double(), m64, atol=2e-6, rtol=0)
    torch.testing.assert_close(got[3].double(), kernels.marginals_jvp(prog, r.double(), v.double()), atol=2e-5, rtol=0)


@needs_native
def test_the_linear_upward_centres_logits_of_a_fixed_cardinality():
    """Exactly-k circuits: the linear pass moves each token's logits to the circuit's nominal
    logit (the distribution does not change) and corrects log Z back. Nearly equal logits at
    exactly 16 of 256 (shifted to their k-th largest they lie far from it), logits 50 above or
    below 0 that no shift moved, and a row whose log Z is about -100 (the root's stored value
    times e^-20 was a subnormal float there: log Z off by 3e-3) all take the linear pass and
    match the float64 torch passes; a range circuit is not centred."""
    cases = [
        (circuits.ExactlyK(256, 16), torch.randn(130, 256, generator=torch.Generator().manual_seed(3)) * 0.05),
        (circuits.ExactlyK(64, 8), torch.randn(130, 64, generator=torch.Generator().manual_seed(4)) * 0.5 + 50),
        (circuits.ExactlyK(64, 8), torch.randn(130, 64, generator=torch.Generator().manual_seed(5)) * 0.5 - 50),
        (circuits.ExactlyK(24, 1), torch.tensor([[-30.0] * 8 + [0.0] * 16]).expand(130, 24).contiguous()),
    ]
    for spec, r in cases:
        c = circuits.compile_circuit(spec)
        prog, passes = c.program, CPasses(c.program)
        for rows in (r, shifted(c, r)):  # called with raw logits, and as a route calls them
            assert passes.linear_tiles(rows) == (2, 2), spec
            v = torch.randn(rows.shape, generator=torch.Generator().manual_seed(6))
            log_z, m = passes.log_partition(rows, True)
            up64 = kernels.upward(prog, rows.double())
            torch.testing.assert_close(log_z.double(), up64.val[-1], atol=1e-5, rtol=1e-6, msg=str(spec))
            m64 = kernels.marginals_from_flows(prog, kernels.downward(prog, up64), torch.sigmoid(rows.double()))
            torch.testing.assert_close(m.double(), m64, atol=2e-6, rtol=0, msg=str(spec))
            jvp64 = kernels.marginals_jvp(prog, rows.double(), v.double())
            torch.testing.assert_close(passes.marginals_jvp(rows, v).double(), jvp64, atol=2e-5, rtol=0, msg=str(spec))
    none = circuits.compile_circuit(circuits.ExactlyK(8, 0))
    far = CPasses(none.program)
    for offset in (200.0, 100.0, -200.0):
        # centred far (|c| beyond 87) with a -inf logit, which no node of exactly 0 needs: its term of the
        # log Z correction is exactly 0 (it was log(e^-c) = -inf: log Z +inf, or off by 0.3 near c = 100)
        rows = torch.randn(130, 8, generator=torch.Generator().manual_seed(7)) + offset
        rows[:, 3] = -torch.inf
        assert far.linear_tiles(rows) == (2, 2), offset
        up64 = kernels.upward(none.program, rows.double())
        torch.testing.assert_close(far.log_partition(rows, False)[0].double(), up64.val[-1], atol=1e-5, rtol=1e-6)
    assert c_passes.linear_constants(circuits.compile_circuit(circuits.RangeK(64, 4, 8)).program)[-1] == -1.0
    with pytest.raises(ValueError, match=r"linear_tiles takes float32 CPU logits \[T, 24\]"):
        passes.linear_tiles(torch.zeros(3, 23))
    with pytest.raises(ValueError, match="shift must have one row per token"):
        passes.linear_tiles(torch.zeros(3, 24), torch.zeros(2, 1))
    assert c_passes.linear_constants(circuits.compile_circuit(circuits.ExactlyK(64, 8)).program)[-1] == 8.0


@needs_native
def test_tiles_out_of_the_linear_range_take_the_logarithms():
    """A row of ±1e4 logits, a row with -inf logits and a row spread far apart each send their tile
    to the upward pass on logarithms and leave the others linear; logits scaled from well inside to
    past the linear range match the float64 torch passes wherever their tiles end up (a node that
    fell below the range unnoticed would show as a wrong marginal)."""
    c = circuits.compile_circuit(circuits.ExactlyK(64, 8))
    prog, passes = c.program, CPasses(c.program)
    gen = torch.Generator().manual_seed(9)
    r = torch.randn(640, 64, generator=gen)  # 5 tiles of 128 tokens
    assert passes.linear_tiles(shifted(c, r)) == (5, 5)
    r[5, ::2], r[5, 1::2] = 1e4, -1e4  # tile 0
    r[200, :30] = -torch.inf  # tile 1
    r[300] = torch.linspace(-150.0, 0.0, 64)  # tile 2
    rs = shifted(c, r)
    assert passes.linear_tiles(rs) == (2, 5)
    v = torch.randn(640, 64, generator=gen)
    up32, up64 = kernels.upward(prog, rs), kernels.upward(prog, rs.double())
    log_z32 = up32.val[-1].clone()
    m64 = kernels.marginals_from_flows(prog, kernels.downward(prog, up64), torch.sigmoid(rs.double()))
    log_z, m = passes.log_partition(rs, True)  # (its log Z of refused rows reuses the float64 scratch)
    torch.testing.assert_close(log_z, log_z32, atol=1e-4, rtol=1e-6)  # float32 at |logits| ~ 1e4
    ok = torch.ones(640, dtype=torch.bool)
    ok[5] = False  # ±1e4: the float64 reference differs from any float32 pass there
    torch.testing.assert_close(m.double()[ok], m64[ok], atol=2e-6, rtol=0)
    jvp64 = kernels.marginals_jvp(prog, rs.double(), v.double())
    torch.testing.assert_close(passes.marginals_jvp(rs, v).double()[ok], jvp64[ok], atol=2e-5, rtol=0)
    big = circuits.compile_circuit(circuits.ExactlyK(256, 16))
    base = torch.randn(32, 256, generator=gen)
    r = shifted(big, torch.cat([base * s for s in torch.linspace(2.0, 6.0, 8).tolist()]))  # 2 tiles
    r = torch.cat([r, shifted(big, torch.randn(128, 256, generator=gen))])  # and one inside
    fast = CPasses(big.program)
    done, tiles = fast.linear_tiles(r)
    assert 0 < done < tiles, (done, tiles)
    up64 = kernels.upward(big.program, r.double())
    m64 = kernels.marginals_from_flows(big.program, kernels.downward(big.program, up64), torch.sigmoid(r.double()))
    torch.testing.assert_close(fast.log_partition(r, True)[1].double(), m64, atol=2e-6, rtol=0)


@needs_native
def test_threads_split_tokens_without_changing_results():
    c = circuits.compile_circuit(circuits.ExactlyK(64, 8))
    gen = torch.Generator().manual_seed(0)
    r, v = shifted(c, torch.randn(1000, 64, generator=gen)), torch.randn(1000, 64, generator=gen)
    uniforms, fill = draw_uniforms(c.program, r, gen)
    native = CPasses(c.program)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.sample(r, uniforms, fill)[0], native.marginals_jvp(r, v)
        torch.set_num_threads(2)
        two = native.sample(r, uniforms, fill)[0], native.marginals_jvp(r, v)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    """The loader's state and cache directory, private to one test."""
    monkeypatch.setenv("PROBMOE_CACHE", str(tmp_path))
    monkeypatch.setattr(library.LIBRARY, "state", {})
    return tmp_path


def test_turned_off_falls_back_to_the_torch_passes(fresh_native, monkeypatch):
    monkeypatch.setenv("PROBMOE_NATIVE", "0")
    assert library.library() is None
    assert circuits.kernels.select.describe() == "torch passes (C kernels turned off by PROBMOE_NATIVE=0)"
    c = circuits.compile_circuit(circuits.RangeK(6, 2, 4))
    assert isinstance(c.kernels(torch.float32), TorchPasses)
    r = torch.randn(3, 6)
    z = c.sample(r, generator=torch.Generator().manual_seed(0))
    assert bool(((z.sum(-1) >= 2) & (z.sum(-1) <= 4)).all())
    r.requires_grad_()
    (c.marginals(r) * torch.randn(3, 6)).sum().backward()
    assert torch.isfinite(r.grad).all()


@pytest.mark.skipif(shutil.which("cc") is None or os.environ.get("PROBMOE_NATIVE") == "0", reason="needs cc")
@pytest.mark.parametrize(  # each rebuilds the library (about 9 s): one in the default run, all in the slow set
    "damage",
    [
        "garbage",
        pytest.param("no digest", marks=pytest.mark.slow),
        pytest.param("another library", marks=pytest.mark.slow),
    ],
)
def test_a_damaged_cached_library_is_rebuilt(fresh_native, damage):
    path = library.LIBRARY.path(shutil.which("cc"))
    path.parent.mkdir(parents=True)
    if damage == "another library":  # loads fine, but is not ours: its digest does not match
        shutil.copy(torch.__file__.replace("__init__.py", "lib/libc10.so"), path)
        path.with_suffix(".so.sha256").write_text("0" * 64)
    else:
        path.write_bytes(b"not a shared library")
        if damage == "garbage":
            path.with_suffix(".so.sha256").write_text(native.digest(path))
    assert library.library() is not None and circuits.kernels.select.describe() == f"fused C passes ({path})"
    assert path.read_bytes()[:4] == b"\x7fELF" and native.digest(path) == path.with_suffix(".so.sha256").read_text()


def test_an_included_header_is_part_of_the_build_key(tmp_path):
    """A change to a header a source includes (kernels.h, which every unit includes) gives another
    library path, so a stale build is never loaded."""
    assert [h.name for h in library.LIBRARY.headers()] == ["kernels.h"]
    src = tmp_path / "unit.c"
    header = tmp_path / "unit.h"
    header.write_text("int f(void);\n")
    src.write_text('#include "unit.h"\nint f(void) { return 1; }\n')
    lib = native.NativeLibrary("unit", [src], lambda _: None)
    assert lib.headers() == [header.resolve()]
    cc = shutil.which("cc") or "cc"
    if shutil.which(cc) is None:
        pytest.skip("needs cc (the key includes its version)")
    before = lib.path(cc, "portable")
    header.write_text("int f(void); /* changed */\n")
    assert lib.path(cc, "portable") != before


def test_a_missing_compiler_warns_once_and_falls_back(fresh_native, monkeypatch):
    monkeypatch.delenv("PROBMOE_NATIVE", raising=False)  # the suite may run with the C code off
    monkeypatch.setenv("CC", str(fresh_native / "no-such-cc"))
    with pytest.warns(RuntimeWarning, match="using the torch code"):
        assert library.library() is None
    assert library.library() is None  # decided once: no second warning
    assert circuits.kernels.select.describe().startswith("torch passes (C kernels unavailable: ")


@needs_native
@pytest.mark.parametrize("T,n,k", [(0, 4, 2), (1, 1, 1), (5, 3, 3), (33, 10, 10), (1000, 60, 1), (4096, 64, 8)])
def test_kth_largest_equals_topk(T, n, k):
    """The exactly-k shift: the k-th largest of each row, as topk(k).values.amin(); -inf rows and
    ties included, NaN counted as -inf."""
    r = torch.randn(T, n).round(decimals=1)  # ties
    if T > 2:
        r[0, : n - 1] = -torch.inf
        r[1, 0] = float("nan")
    want = torch.where(r.isnan(), -torch.inf, r).topk(k, dim=-1).values.amin(dim=-1) if T else r.new_empty(0)
    assert torch.equal(circuits.kernels.select.select(Rows(r.device), r.dtype).kth_largest(r, k), want)
    assert torch.equal(select.kth_largest_reference(r, k), want)


@needs_native
@pytest.mark.parametrize("k", [0, -1, 5])
def test_kth_largest_refuses_k_outside_1_to_n(k):
    with pytest.raises(ValueError, match=r"kth_largest takes x \[T, n\] and k in \[1, n = 4\]"):
        circuits.kernels.select.select(Rows(torch.device("cpu")), torch.float32).kth_largest(torch.randn(3, 4), k)


@needs_native
@pytest.mark.parametrize("size", [dict(k=8), dict(kmin=4, kmax=8)], ids=["exactly 8", "range 4..8"])
def test_route_is_the_same_with_and_without_the_c_passes(size, monkeypatch):
    """A seeded training route draws the same experts, with the same weights and gradient, on a
    machine with the C passes and on one without."""
    import probmoe

    r = (torch.randn(500, 60, generator=torch.Generator().manual_seed(0)) * 2).requires_grad_()
    c = torch.randn(500, 8)

    def run():
        out = probmoe.route(r, **size, training=True, backend="circuit", generator=torch.Generator().manual_seed(1))
        (grad,) = torch.autograd.grad((out.weights * c).sum(), r)
        return out, grad

    fast, fast_grad = run()
    monkeypatch.setattr(probmoe.constraints, "_CIRCUITS", {})  # circuits pick their passes once: make new ones
    monkeypatch.setattr(library.LIBRARY, "state", {"lib": None, "where": "turned off in this test"})
    slow, slow_grad = run()
    assert isinstance(probmoe.constraints.cardinality(60, 8, 8, "cpu").kernels(torch.float32), TorchPasses)
    assert torch.equal(fast.indices, slow.indices) and torch.equal(fast.mask, slow.mask)
    assert torch.equal(fast.weights, slow.weights)
    torch.testing.assert_close(fast_grad, slow_grad, atol=1e-6, rtol=1e-5)


@pytest.mark.skipif(shutil.which("cc") is None or os.environ.get("PROBMOE_NATIVE") == "0", reason="needs cc")
def test_a_read_only_cache_builds_for_this_process(fresh_native, monkeypatch):
    build, targets = library.LIBRARY.build, []

    def refuse_the_cache(cc, out, isa=None):  # what a read-only cache directory does to a non-root user
        targets.append(out)
        if str(out).startswith(str(fresh_native)):
            raise PermissionError(13, "Permission denied", str(out))
        build(cc, out, isa)

    at_exit = []
    monkeypatch.setattr(library.LIBRARY, "build", refuse_the_cache)
    monkeypatch.setattr(atexit, "register", lambda fn, *args: at_exit.append((fn, args)))
    assert library.library() is not None
    assert len(targets) == 2 and not str(targets[1]).startswith(str(fresh_native))
    assert circuits.kernels.select.describe() == f"fused C passes ({targets[1]})"
    for fn, args in at_exit:  # what the process does when it exits: the private build goes
        fn(*args)
    assert not targets[1].parent.exists()


@needs_native
def test_every_small_cardinality_circuit_matches_float64():
    """Every exactly-k with n <= 10 and every range with n <= 6 (k = 0 and k = n included): log Z,
    the marginals, Cov(z) v and the MAP of the C passes against the float64 torch passes, and the
    same draws from the same uniforms, over two tiles with a -inf logit."""
    specs = [circuits.ExactlyK(n, k) for n in range(1, 11) for k in range(n + 1)]
    specs += [circuits.RangeK(n, a, b) for n in range(1, 7) for a in range(n + 1) for b in range(a, n + 1)]
    for spec in specs:
        c = circuits.compile_circuit(spec)
        prog, n, lo = c.program, spec.n, spec.cardinalities[0]
        native = CPasses(prog)
        gen = torch.Generator().manual_seed(n)
        r = torch.randn(130, n, generator=gen) * 3
        if n > lo:
            r[0, 0] = -torch.inf
        r, v = shifted(c, r), torch.randn(130, n, generator=gen)
        log_z, m = native.log_partition(r, True)
        up = kernels.upward(prog, r.double())
        m64 = kernels.marginals_from_flows(prog, kernels.downward(prog, up), torch.sigmoid(r.double()))
        torch.testing.assert_close(log_z.double(), up.val[-1], atol=1e-5, rtol=0, msg=str(spec))
        torch.testing.assert_close(m.double(), m64, atol=1e-5, rtol=0, msg=str(spec))
        jvp64 = kernels.marginals_jvp(prog, r.double(), v.double())
        torch.testing.assert_close(native.marginals_jvp(r, v).double(), jvp64, atol=1e-5, rtol=0, msg=str(spec))
        uniforms, fill = draw_uniforms(prog, r, gen)
        z, _ = native.sample(r, uniforms, fill)
        assert torch.equal(z, kernels.sample(prog, r, kernels.upward(prog, r), uniforms, fill)), spec
        up_max = kernels.max_upward(prog, r.double())
        assert torch.equal(native.map(r)[0].double(), kernels.map_assignment(prog, r.double(), up_max)), spec


@needs_native
def test_concurrent_calls_from_python_threads():
    """Each OS thread has its own scratch: four Python threads at once get the sequential results."""
    import concurrent.futures

    c = circuits.compile_circuit(circuits.RangeK(64, 4, 8))
    gen = torch.Generator().manual_seed(0)
    jobs = []
    for _ in range(8):
        r, v = shifted(c, torch.randn(700, 64, generator=gen)), torch.randn(700, 64, generator=gen)
        jobs.append((r, v, *draw_uniforms(c.program, r, gen)))
    native = c.kernels(torch.float32)

    def work(job):
        r, v, uniforms, fill = job
        return native.sample(r, uniforms, fill)[0], native.marginals_jvp(r, v)

    want = [work(job) for job in jobs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(work, jobs))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(want, got))
