"""fp32 exact at every logit scale (issue 28): the marginals within 1e-5 and log Z within 1e-6
(relative, |a - b| / max(1, |b|)) of independent float64 references on the same fp32 logits, for
the torch and fused C passes of the compiled circuit and for the DP, on a small grid of
tools/accuracy_fp32.py (which prints the full table of docs/reports/circuits-evaluation-accuracy-epyc-2026-11.md). The Triton passes take
the same grid, interpreted, in tests/circuits/kernels/circuits_triton_checks.py."""

import pytest
import torch
import torch.nn.functional as F
from tool_modules import load_tool

import circuits
import circuits.kernels.select
from circuits.kernels import library, torch_passes

A = load_tool("accuracy_fp32")

CARDINALITY = [(64, 8, 8), (64, 0, 1), (64, 4, 8), (64, 0, 8)]
GROUPS = [
    circuits.GroupLimited(64, 8, 8, 2),
    circuits.GroupCapacity(64, None, 8, 2, kmin=0, kmax=8),
    circuits.GroupLimited(32, None, 4, 2, kmin=1, kmax=6),
]
SCALES = (1.0, 100.0)
IMPLS = ["torch"] + (["c"] if library.library() is not None else [])


def cardinality_spec(n, kmin, kmax):
    return circuits.ExactlyK(n, kmin) if kmin == kmax else circuits.RangeK(n, kmin, kmax)


def check(run, log_norm, n):
    for s in SCALES:
        for j, kind in enumerate(A.KINDS):
            m_err, z_err = A.errors(run, log_norm, A.rows(n, s, kind, 16, seed=100 * j + int(s)))
            assert m_err <= A.MARGINAL_BOUND, (s, kind, m_err)
            assert z_err <= A.LOG_Z_BOUND, (s, kind, z_err)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("sizes", CARDINALITY, ids=lambda s: f"{s[1]}..{s[2]}-of-{s[0]}")
def test_cardinality_circuits(impl, sizes):
    n, kmin, kmax = sizes
    c = circuits.compile_circuit(cardinality_spec(n, kmin, kmax))
    check(A.circuit_runner(c, impl), lambda r: A.cardinality_log_norm(r, kmin, kmax), n)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("spec", GROUPS, ids=lambda s: s.key)
def test_group_circuits(impl, spec):
    c = circuits.compile_circuit(spec)
    check(A.circuit_runner(c, impl), lambda r: A.group_log_norm(r, spec), spec.n)


@pytest.fixture(scope="module")
def cnf(tmp_path_factory):
    n, clauses = 14, A.random_cnf(14, 40, seed=3)
    path = tmp_path_factory.mktemp("cnf") / "random.cnf"
    path.write_text(f"p cnf {n} {len(clauses)}\n" + "".join(" ".join(map(str, c)) + " 0\n" for c in clauses))
    return circuits.compile_circuit(circuits.CnfFile(str(path))), A.cnf_models(n, clauses)


@pytest.mark.parametrize("impl", IMPLS)
def test_cnf_circuit(impl, cnf):
    c, models = cnf
    assert len(models) > 10  # a formula with choices to make
    check(A.circuit_runner(c, impl), lambda r: A.models_log_norm(r, models), c.n)


@pytest.mark.parametrize("impl", ["dp", "dp-torch"])
@pytest.mark.parametrize("s", SCALES)
@pytest.mark.parametrize("sizes", CARDINALITY + [(256, 16, 16)], ids=lambda s: f"{s[1]}..{s[2]}-of-{s[0]}")
def test_dp(sizes, s, impl):
    """The DP through the public distribution (its C sweeps here) and its torch sweeps; before the
    tilt and the lattice on log-probabilities (torch_dp's docstring) the marginals were off by up to
    7e-5 at s = 100 and log Z by 3.8e-6 (all-equal rows, n = 256)."""
    n, kmin, kmax = sizes
    run = A.dp_runner(kmin, kmax, impl)
    for j, kind in enumerate(A.KINDS):
        m_err, z_err = A.errors(
            run, lambda r: A.cardinality_log_norm(r, kmin, kmax), A.rows(n, s, kind, 16, seed=100 * j + int(s))
        )
        assert m_err <= A.MARGINAL_BOUND and z_err <= A.LOG_Z_BOUND, (kind, m_err, z_err)


def test_references_agree_with_brute_force():
    """The float64 references of the tool against enumeration (n = 8)."""
    from brute import exact, group_models, masks

    r = A.rows(8, 3.0, "normal", 5, seed=1)
    for kmin, kmax in ((2, 2), (0, 3)):
        want = exact(r.double(), masks(8, range(kmin, kmax + 1)))
        z, m = A.reference(lambda x: A.cardinality_log_norm(x, kmin, kmax), r)
        torch.testing.assert_close(z, want.log_partition, atol=1e-12, rtol=0)
        torch.testing.assert_close(m, want.marginals, atol=1e-12, rtol=0)
    spec = circuits.GroupCapacity(8, None, [3, 5], 2, kmin=1, kmax=4)
    want = exact(r.double(), group_models(spec))
    z, m = A.reference(lambda x: A.group_log_norm(x, spec), r)
    torch.testing.assert_close(z, want.log_partition, atol=1e-12, rtol=0)
    torch.testing.assert_close(m, want.marginals, atol=1e-12, rtol=0)


def test_the_tilt_is_exact_in_float64():
    """Any tilt c gives the same log Z and marginals (float64, against the untilted definition):
    the element addends and the offset undo what moving the leaves takes."""
    c = circuits.compile_circuit(circuits.RangeK(12, 2, 5))
    prog, r = c.program, torch.randn(6, 12, dtype=torch.float64) * 3
    up = torch_passes.upward(prog, r)  # untilted: log sigma(r) leaves, no addends
    want_m = torch_passes.marginals_from_flows(prog, torch_passes.downward(prog, up), torch.sigmoid(r))
    want_z = up.val[-1].clone()  # (the passes below reuse its scratch)
    got_z, got_m = torch_passes.TorchPasses(prog).log_partition(r, True)
    torch.testing.assert_close(got_z, want_z, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_m, want_m, atol=1e-12, rtol=0)
    assert (torch_passes.tilt(prog, r).c != 0).sum() >= 3  # most rows were tilted


@pytest.mark.parametrize("impl", IMPLS)
def test_jacobian_at_large_shifts(impl):
    """Cov(z) v (the marginals' backward) at logits shifted by +-1e4, against float64 autograd of the
    reference: within 1e-5 per unit of |v|."""
    n, kmin, kmax = 64, 4, 8
    c = circuits.compile_circuit(circuits.RangeK(n, kmin, kmax))
    passes = circuits.kernels.select.select(c.program, torch.float32, prefer=impl)
    for kind in ("+1e4", "-1e4", "normal"):
        r = A.rows(n, 3.0, kind, 8, seed=5)
        v = torch.randn(8, n, generator=torch.Generator().manual_seed(6))
        rr = r.double().requires_grad_()
        with torch.enable_grad():
            (m,) = torch.autograd.grad(A.cardinality_log_norm(rr, kmin, kmax).sum(), rr, create_graph=True)
            (want,) = torch.autograd.grad((m * v.double()).sum(), rr)
        got = passes.marginals_jvp(r, v)
        assert float((got.double() - want).abs().max()) <= 1e-5 * float(v.abs().max()), kind


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("sizes", [(256, 0, 1), (64, 4, 8), (64, 8, 8)], ids=lambda s: f"{s[1]}..{s[2]}-of-{s[0]}")
def test_map_at_large_shifts(impl, sizes):
    """MAP at every kind of row scores as the exact rule (sort the logits, take clamp(#{r > 0}, kmin,
    kmax) of them; ties may pick either): before the tilt, 41 of 256 rows of range 0..1 of 256 at
    1e4 + N(0, 1) got a worse model."""
    n, kmin, kmax = sizes
    c = circuits.compile_circuit(cardinality_spec(n, kmin, kmax))
    passes = circuits.kernels.select.select(c.program, torch.float32, prefer=impl)
    for j, kind in enumerate(A.KINDS):
        r = A.rows(n, 1.0, kind, 32, seed=7 + j)
        z, best = passes.map(r, c._shift(r))
        k = (r > 0).sum(1).clamp(kmin, kmax)
        order = torch.sort(r, dim=1, descending=True, stable=True).indices
        want = (torch.arange(n).expand(len(r), n) < k.unsqueeze(1)).float()
        want = torch.zeros_like(r).scatter(1, order, want)
        score = lambda x: torch.where(x > 0, r.double(), 0.0).sum(1)
        assert torch.equal(score(z), score(want)), kind
        assert ((z.sum(1) >= kmin) & (z.sum(1) <= kmax)).all(), kind
        rs = c.shifted(r).double()  # best is the log-value of the logits the passes took
        want_best = torch.where(want > 0, F.logsigmoid(rs), F.logsigmoid(-rs)).sum(1)
        torch.testing.assert_close(best.double(), want_best, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("impl", ["dp", "dp-torch"])
@pytest.mark.parametrize("gap", [1e3, 1e8])
def test_dp_outliers(impl, gap):
    """One logit far above and one far below N(0, 1) rows: with the row-max tilt the DP rounded the
    other logits (marginals off by 2.5e-4 at a gap of 1e3, 0.77 at 1e8); tilted by the boundary
    logit the outliers' rounding stays in states nothing likely passes through (within 6e-7)."""
    for n, kmin, kmax in ((64, 8, 8), (64, 4, 8)):
        r = torch.randn(16, n, generator=torch.Generator().manual_seed(3))
        r[:, 5] += gap
        r[:, 9] -= gap
        m_err, z_err = A.errors(A.dp_runner(kmin, kmax, impl), lambda x: A.cardinality_log_norm(x, kmin, kmax), r)
        assert m_err <= A.MARGINAL_BOUND and z_err <= A.LOG_Z_BOUND, (kmin, kmax, m_err, z_err)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "sizes", [(256, 16, 16), (256, 128, 128), (256, 4, 32), (128, 8, 16)], ids=lambda s: f"{s[1]}..{s[2]}-of-{s[0]}"
)
def test_log_z_of_equal_rows(impl, sizes):
    """log Z of rows whose logits repeat (every level in [-8, 8] by 1/4, some with a random part of
    them -inf) within 1e-6: a float32 pass's roundings go the same way at every variable there
    (exactly 16 of 256 at -2.5: 7e-6 from the C passes, range 4..32 of 256: 3.4e-6 from the torch
    passes), so log Z is accumulated in float64 (``accurate``, pm_log_z)."""
    n, kmin, kmax = sizes
    c = circuits.compile_circuit(cardinality_spec(n, kmin, kmax))
    passes = circuits.kernels.select.select(c.program, torch.float32, prefer=impl)
    g = torch.Generator().manual_seed(n + kmax)
    levels = torch.arange(-32, 33) / 4.0
    r = levels.repeat(2).unsqueeze(1).expand(-1, n).contiguous()  # [130, n]
    dead = torch.rand(len(r), n, generator=g) < torch.rand(len(r), 1, generator=g) * 0.6
    dead[: len(levels)] = False  # the first copy of the levels whole, the second with -inf entries
    r[dead] = -torch.inf
    want, _ = A.reference(lambda x: A.cardinality_log_norm(x, kmin, kmax), r)
    got, _ = passes.log_partition(r, False)
    live = want > A.NEG / 2  # satisfiable: the reference's -inf entries are NEG
    assert live.sum() > len(levels)
    err = (got.double() - want).abs() / want.abs().clamp(min=1)
    assert float(err[live].max()) <= A.LOG_Z_BOUND
    assert torch.equal(torch.isfinite(got), live)  # unsatisfiable rows are -inf, not a number
    assert torch.equal(passes.log_partition(r, True)[0], got)  # the same log Z when the marginals come too


def test_group_marginals_of_the_pass_on_logarithms_in_float64():
    """The public marginals of group circuits within 1e-6 of the float64 reference where the float32
    pass on logarithms lost up to 1.8e-5 (GroupLimited, groups of 32, at 1e4 + N(0, 3^2)) and 1.6e-4
    (two-level rows 31.9 apart): such rows come from the float64 passes (``Program.float64_rows``).
    The C passes' linear tiles keep their float32 marginals bit for bit; a cardinality circuit
    refines nothing."""
    assert not circuits.compile_circuit(circuits.ExactlyK(64, 8)).program.float64_rows
    g = torch.Generator().manual_seed(4)
    shifted = (1e4 + 3 * torch.randn(64, 256, generator=g, dtype=torch.float64)).float()
    two_level = torch.full((1, 256), -1.63087)
    for k, size in enumerate([24, 21, 25, 27, 24, 24, 27, 30]):
        two_level[0, 32 * k : 32 * k + size] += 31.9
    four, six = circuits.GroupLimited(256, None, 8, 4, kmin=0), circuits.GroupLimited(256, None, 8, 6, kmin=0)
    for spec, r in ((four, shifted), (six, two_level), (four, A.rows(256, 100.0, "-inf", 16, seed=3))):
        c = circuits.compile_circuit(spec)
        assert c.program.float64_rows
        _, want = A.reference(lambda x: A.group_log_norm(x, spec), r)
        for impl in IMPLS:
            passes = circuits.kernels.select.select(c.program, torch.float32, prefer=impl)
            got = passes.log_partition(r, True, c._shift(r), accurate=False)[1]
            assert float((got.double() - want).abs().max()) <= 1e-6, impl
        assert float((c.marginals(r).double() - want).abs().max()) <= 1e-6
    if "c" in IMPLS:  # N(0, 1) rows take the linear pass: nothing to refine
        small = A.rows(64, 1.0, "normal", 64, seed=2)
        c64 = circuits.compile_circuit(circuits.GroupLimited(64, 8, 8, 2))
        passes = circuits.kernels.select.select(c64.program, torch.float32, prefer="c")
        assert passes.linear_tiles(c64.shifted(small)) == (1, 1)
        unrefined = passes.log_partition(small, True, c64._shift(small), refine=False)[1]
        assert torch.equal(c64.marginals(small), unrefined)


@pytest.mark.parametrize("impl", ["dp", "dp-torch"])
def test_dp_marginals_of_nearly_equal_rows_with_a_few_odd_logits(impl):
    """255 logits at one level and one apart, and random rows of nearly equal logits with two
    odd ones: the DP's marginals were off by up to 9.3e-5 (C sweeps, RangeK(256, 1, 256)) and
    1.5e-5 (torch sweeps; exactly 255 of 256 gave 0 where the answer is 1.06e-5). Each step of
    the sweeps moved a mass of about 4e-8 between neighbouring states, less than half a float32
    ulp of 1: W rounded to 1, the adjoints A - A W lost it, and states near log 0.5 lost as much
    at every one of the 256 steps. Now W is stored as min(W, 1 - W) with a sign, and the states and
    adjoints are float64 (docs/reports/circuits-evaluation-accuracy-epyc-2026-11.md, "The DP's precision"). Found by an independent check."""
    cases = []
    for level, odd, kmin, kmax in (
        (16.985, -0.015, 1, 256),
        (16.99, -0.01, 0, 256),
        (16.525, 0.525, 255, 256),
        (16.15, 2.15, 0, 256),
        (21.05, 4.05, 255, 255),
        (-15.95, 1.05, 0, 16),
    ):
        r = torch.full((1, 256), level, dtype=torch.float64)
        r[0, 0] = odd
        cases.append((kmin, kmax, r.float()))
    g = torch.Generator().manual_seed(5)
    for n, kmin, kmax in ((256, 1, 256), (256, 0, 256), (256, 252, 252), (128, 0, 128)):
        r = (
            10
            + 12 * torch.rand(24, 1, generator=g, dtype=torch.float64)
            + 0.1 * torch.randn(24, n, generator=g, dtype=torch.float64)
        )
        odd = torch.rand(24, n, generator=g).argsort(-1)[:, :2]  # two odd logits per row, N(0, 1)
        r.scatter_(1, odd, torch.randn(24, 2, generator=g, dtype=torch.float64))
        cases.append((kmin, kmax, r.float()))
    for kmin, kmax, r in cases:
        m_err, _ = A.errors(A.dp_runner(kmin, kmax, impl), lambda x: A.cardinality_log_norm(x, kmin, kmax), r)
        assert m_err <= A.MARGINAL_BOUND, (kmin, kmax, m_err)
