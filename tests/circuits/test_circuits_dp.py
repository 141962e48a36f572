"""``circuits.CardinalityDP``, the DP behind the queries of a ``Circuit``, and ``circuits.engine``, which picks
the algorithm: brute-force enumeration (float64, 1e-9), the compiled circuit of the same spec, the
checks, and ``circuits.kernels.select.select`` for the DP and the row operations."""

import math

import pytest
import torch
from brute import exact, masks

import circuits
import circuits.kernels.select
from circuits.kernels import c_dp, library
from circuits.kernels.c_dp import CDP
from circuits.kernels.lattice import Lattice
from circuits.kernels.rows import Rows
from circuits.kernels.torch_dp import TorchDP

SPECS = [
    circuits.ExactlyK(1, 0),
    circuits.ExactlyK(1, 1),
    circuits.ExactlyK(6, 3),
    circuits.ExactlyK(7, 7),
    circuits.RangeK(6, 0, 6),
    circuits.RangeK(7, 2, 4),
    circuits.RangeK(8, 0, 1),
    circuits.RangeK(5, 4, 5),
]


def _logits(n, T=5, seed=0, dtype=torch.float64, device="cpu"):
    """[T, n] N(0, 4) logits, drawn on the CPU (the same on every device), then moved to ``device``."""
    return (torch.randn(T, n, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2).to(device)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.describe())
def test_queries_match_brute_force(spec, device):
    dp = circuits.engine(spec, device, algorithm="dp")
    assert isinstance(dp, circuits.CardinalityDP) and (dp.kmin, dp.kmax) == (
        spec.cardinalities[0],
        spec.cardinalities[-1],
    )
    r = _logits(spec.n, device=device).requires_grad_()
    want = exact(r.detach().cpu(), masks(spec.n, spec.cardinalities))
    log_z = dp.log_partition(r)
    torch.testing.assert_close(log_z.cpu(), want.log_partition, atol=1e-9, rtol=0)
    (grad,) = torch.autograd.grad(log_z.sum(), r)  # d log Z / d r = m - sigmoid(r)
    torch.testing.assert_close(grad.cpu(), want.marginals - torch.sigmoid(r.detach().cpu()), atol=1e-9, rtol=0)
    torch.testing.assert_close(dp.marginals(r).cpu(), want.marginals, atol=1e-9, rtol=0)
    assert torch.equal(dp.map(r).cpu(), want.map)
    # log Z_j: the natural log-partition of each size
    counts = dp.log_counts(r).cpu()
    sizes = list(spec.cardinalities)
    rc = r.detach().cpu()
    direct = torch.stack([torch.logsumexp(rc @ masks(spec.n, [j]).T, dim=-1) for j in sizes], -1)
    torch.testing.assert_close(counts, direct, atol=1e-9, rtol=0)


@pytest.mark.parametrize("spec", [circuits.ExactlyK(6, 2), circuits.RangeK(6, 1, 4)], ids=lambda s: s.describe())
def test_jacobian_of_marginals_is_covariance(spec, device):
    dp = circuits.CardinalityDP(spec, device)
    r = _logits(spec.n, T=1)[0]
    jac = torch.autograd.functional.jacobian(dp.marginals, r.to(device)).cpu()
    torch.testing.assert_close(jac, exact(r[None], masks(spec.n, spec.cardinalities)).cov[0], atol=1e-9, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("spec", [circuits.ExactlyK(64, 8), circuits.RangeK(64, 4, 8)], ids=lambda s: s.describe())
def test_the_two_algorithms_agree(spec, dtype, device):
    """The DP and the compiled circuit: log Z, marginals, their backward and the MAP (leading dims kept)."""
    dp, circuit = circuits.engine(spec, device, algorithm="dp"), circuits.engine(spec, device=device)
    r = _logits(64, T=24, dtype=dtype, device=device).reshape(2, 12, 64).requires_grad_()
    tol = 1e-9 if dtype == torch.float64 else 2e-5
    v = torch.randn(r.shape, dtype=dtype).to(device)
    for query in ("log_partition", "marginals"):
        a, b = getattr(dp, query)(r), getattr(circuit, query)(r)
        assert a.shape == b.shape and a.dtype == dtype
        torch.testing.assert_close(a, b, atol=tol * 10 if query == "log_partition" else tol, rtol=0)
        va = v if query == "marginals" else v[..., 0]
        (ga,) = torch.autograd.grad(a, r, va)
        (gb,) = torch.autograd.grad(b, r, va)
        torch.testing.assert_close(ga, gb, atol=tol * 10, rtol=0)
    assert torch.equal(dp.map(r), circuit.map(r))


def test_draws_follow_the_marginals_and_are_seeded(device):
    """Empirical frequencies of 40,000 draws within 5 standard errors of the exact marginals, and each
    draw allowed; the same generator seed gives the same draws, as ``marginals_and_sample`` does."""
    spec = circuits.RangeK(6, 2, 4)
    dp = circuits.CardinalityDP(spec, device)
    r = _logits(6, T=1, dtype=torch.float32)
    rd = r.to(device).expand(40000, 6)
    z = dp.sample(rd, torch.Generator(device).manual_seed(0)).cpu()
    sizes = z.sum(-1)
    assert ((sizes >= 2) & (sizes <= 4)).all() and ((z == 0) | (z == 1)).all()
    m = exact(r, masks(6, spec.cardinalities)).marginals[0].float()
    assert ((z.mean(0) - m).abs() < 5 * (m * (1 - m) / 40000).sqrt() + 1e-6).all()
    assert not ((z.mean(0) - torch.full_like(m, 0.5)).abs() < 5 * (0.25 / 40000) ** 0.5).all()  # it can fail
    again = dp.sample(rd, torch.Generator(device).manual_seed(0)).cpu()
    assert torch.equal(z, again)
    m2, z2 = dp.marginals_and_sample(rd, torch.Generator(device).manual_seed(0))
    assert torch.equal(z2.cpu(), z)
    torch.testing.assert_close(m2[0].cpu(), m, atol=1e-5, rtol=0)


def test_half_precision_and_validation():
    dp = circuits.CardinalityDP(circuits.RangeK(8, 2, 4))
    r = _logits(8, dtype=torch.float32)
    m16 = dp.marginals(r.half())
    assert m16.dtype == torch.float16
    torch.testing.assert_close(m16.float(), dp.marginals(r.half().float()), atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="NaN"):
        dp.marginals(torch.where(torch.arange(8) == 3, torch.nan, r))
    with pytest.raises(ValueError, match="\\+inf"):
        dp.sample(torch.where(torch.arange(8) == 3, torch.inf, r))
    dead = r.clone()
    dead[2, 1:] = -torch.inf  # one logit above -inf, kmin = 2: unsatisfiable
    with pytest.raises(ValueError, match="fewer than kmin = 2"):
        dp.log_partition(dead)
    with pytest.raises(ValueError, match="shape \\[..., n\\] with n = 8"):
        dp.marginals(torch.randn(3, 7))
    dp.validate = False  # the caller checked: nothing is looked at
    assert dp.marginals(dead)[2].isnan().all()


def test_engine_picks_the_algorithm(tmp_path):
    cnf = tmp_path / "two.cnf"
    cnf.write_text("p cnf 2 1\n1 2 0\n")
    spec = circuits.ExactlyK(10, 3)
    assert isinstance(circuits.engine(spec), circuits.Circuit)
    assert isinstance(circuits.engine(spec, algorithm="dp"), circuits.CardinalityDP)
    c = circuits.compile_circuit(spec)
    assert circuits.engine(c) is c and isinstance(circuits.engine(c, algorithm="dp"), circuits.CardinalityDP)
    assert circuits.ALGORITHMS == ("circuit", "dp")
    with pytest.raises(ValueError, match="algorithm must be one of \\('circuit', 'dp'\\), got 'gpu'"):
        circuits.engine(spec, algorithm="gpu")
    assert isinstance(circuits.engine(circuits.GroupLimited(16, 4, 4, 2), algorithm="dp"), circuits.GroupDP)
    with pytest.raises(ValueError, match="the DPs evaluate only ExactlyK, RangeK, GroupLimited and GroupCapacity; "):
        circuits.check_algorithm("dp", circuits.CnfFile(cnf))
    with pytest.raises(ValueError, match="ExactlyK and RangeK specs, got CnfFile"):
        circuits.CardinalityDP(circuits.CnfFile.__new__(circuits.CnfFile))


def test_engine_names_a_bad_device():
    """The second positional argument is the device: an algorithm's name there, or anything torch
    cannot read as a device, is a ValueError naming the argument (it failed deep in torch)."""
    spec = circuits.ExactlyK(10, 3)
    with pytest.raises(ValueError, match="device must be a torch device, got 'dp', an algorithm: pass algorithm='dp'"):
        circuits.engine(spec, "dp")
    for bad in ("gpu", 2.5, None):
        with pytest.raises(ValueError, match="device must be a torch device such as 'cpu'"):
            circuits.engine(spec, bad)
    assert circuits.engine(spec, torch.device("cpu"), "dp").device == torch.device("cpu")


def test_one_evaluator_type():
    """The DP and the circuit are one ``Evaluator``: a device each (logits elsewhere: ValueError naming
    it), the same queries, log Z in natural form (the DP's from its counts by size, without
    cancellation), the satisfiability check; only the DP counts every size in one pass."""
    spec = circuits.RangeK(7, 2, 4)
    dp, circuit = circuits.engine(spec, "cpu", "dp"), circuits.engine(spec, "cpu")
    assert isinstance(dp, circuits.Evaluator) and isinstance(circuit, circuits.Evaluator)
    assert (dp.kmin, dp.kmax, dp.device) == (circuit.kmin, circuit.kmax, circuit.device) == (2, 4, torch.device("cpu"))
    assert dp.counts_by_size and not circuit.counts_by_size
    r = _logits(7, T=6).reshape(2, 3, 7)
    want = torch.logsumexp(r.reshape(-1, 7) @ masks(7, spec.cardinalities).T, dim=-1).reshape(2, 3)
    for evaluator in (dp, circuit):
        torch.testing.assert_close(evaluator.log_normalizer(r), want, atol=1e-9, rtol=0)
        with pytest.raises(ValueError, match="logits is on meta but the circuit is on cpu"):
            evaluator.marginals(r.to("meta"))
    torch.testing.assert_close(dp.log_counts(r).logsumexp(-1), want, atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="Circuit has no log-count by size in one pass"):
        circuit.log_counts(r)
    dead = r.clone()
    dead[1, 2, 1:] = -torch.inf  # one logit above -inf, kmin = 2: unsatisfiable
    dp.check_satisfiable(r), circuit.check_satisfiable(r)
    with pytest.raises(ValueError, match="fewer than kmin = 2"):
        dp.check_satisfiable(dead)
    with pytest.raises(ValueError, match="unsatisfiable at row 5"):
        circuit.check_satisfiable(dead)
    moved = dp.to("meta")
    assert isinstance(moved, circuits.CardinalityDP) and moved.device == torch.device("meta") and moved.spec == spec
    assert circuits.native_kernels(dp, torch.float32) == (c_dp.library() is not None)
    assert not circuits.native_kernels(dp, torch.float64)


def test_select_is_the_one_place_that_picks():
    """The DP's sweeps and the row operations come from ``circuits.kernels.select.select`` like the circuits' passes."""
    cpu = torch.device("cpu")
    built = c_dp.library() is not None
    assert type(circuits.kernels.select.select(Lattice(8, 2, 4, cpu), torch.float32)) is (CDP if built else TorchDP)
    assert type(circuits.kernels.select.select(Lattice(8, 2, 4, cpu), torch.float64)) is TorchDP
    assert type(circuits.kernels.select.select(Lattice(8, 2, 4, cpu), torch.float32, prefer="torch")) is TorchDP
    with pytest.raises(ValueError, match="the c passes take float32 logits"):
        circuits.kernels.select.select(Lattice(8, 2, 4, cpu), torch.float64, prefer="c")
    assert circuits.kernels.select.select(Rows(cpu), torch.float64).lib is None  # the torch references
    assert circuits.kernels.select.select(Rows(cpu), torch.float64).uniforms_lib is library.library()  # made in float32
    assert circuits.kernels.select.select(Rows(cpu), torch.float32).lib is library.library()
    assert circuits.kernels.select.select(Rows(cpu), torch.float32, prefer="torch").lib is None


def test_checks_are_the_one_home_of_integer_and_size_rules():
    checks = circuits.checks
    assert checks.integer("k", 3, 0, 8) == 3
    with pytest.raises(ValueError, match=r"k must be in \[0, n = 8\], got 9"):
        checks.integer("k", 9, 0, 8, hi_name="n")
    with pytest.raises(ValueError, match="k must be an integer, got True"):
        checks.integer("k", True, 0, 8)
    with pytest.raises(ValueError, match=r"kmin must be in \[0, kmax = 3\], got 5"):
        circuits.RangeK(8, 5, 3)  # the specs use the same check
    assert checks.cardinality(8, kmin=2) == (2, 8) and checks.cardinality(8, k=0) == (0, 0)
    with pytest.raises(ValueError, match="kmin must be <= kmax"):
        checks.cardinality(8, kmin=5, kmax=3)
    with pytest.raises(ValueError, match="not both"):
        checks.cardinality(8, k=2, kmax=3)
    with pytest.raises(ValueError, match=r"k must be in \[1, 8\] \(of 8\), got 0"):
        checks.cardinality(8, k=0, lowest=1, note=" (of 8)")
    assert math.isclose(len(circuits.SPECS), 6) and set(circuits.CARDINALITY_SPECS) <= set(circuits.SPECS)
