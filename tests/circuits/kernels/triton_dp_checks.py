"""The Triton lattice kernels (circuits/kernels/triton_dp.py, triton_lattice.py) against the torch
DP (their oracle), the C DP, brute force and float64 references.

Run by tests/circuits/kernels/test_triton_dp.py in a child process: with CUDA the compiled kernels run on
the GPU; without it TRITON_INTERPRET=1 is set for the whole child and the kernels run on CPU
tensors in Triton's interpreter. Not collected by a plain ``pytest``; run it directly with

    TRITON_INTERPRET=1 python -m pytest tests/circuits/kernels/triton_dp_checks.py
"""

import pytest
import torch
from brute import exact, masks
from host_sync import no_host_synchronisation
from scratch_fill import assert_no_unwritten_reads
from tool_modules import load_tool
from triton_child import checks_device

import circuits
import circuits.kernels.select
from circuits.kernels import c_dp, library, select, triton_dp
from circuits.kernels.lattice import Lattice
from circuits.kernels.uniforms import seed_tensor

DEVICE = checks_device("test_triton_dp.py")

# n = 64 and range 4..8 of 64 are long in the interpreter: the slow set (and on CUDA, every set)
SIZES = [(8, 3, 3), (12, 0, 4), (13, 2, 5), (64, 8, 8), pytest.param((64, 4, 8), marks=pytest.mark.slow)]


A = load_tool("accuracy_fp32")


def sweeps(kmin: int, kmax: int, impl: str):
    return circuits.kernels.select.select(Lattice(0, kmin, kmax, torch.device(DEVICE)), torch.float32, prefer=impl)


def logits(n: int, kmax: int, T: int, seed: int) -> torch.Tensor:
    """[T, n] fp32 on DEVICE: N(0, 9), row 0 with -inf logits (still satisfiable), row 1 at +-1e4,
    row 2 all equal."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(T, n, generator=g) * 3
    r[0, : n - kmax] = -torch.inf
    r[1] = 1e4 * (1 - 2 * (torch.arange(n) % 2))
    r[2] = 0.5
    return r.to(DEVICE)


def seed(s: int) -> torch.Tensor:
    return seed_tensor(torch.Generator().manual_seed(s)).to(DEVICE)


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: f"{s[1]}..{s[2]}-of-{s[0]}")
def test_against_the_torch_dp(sizes):
    """Marginals, one draw (the same seed draws the same subset), Cov(z) v and the log counts, on more
    tokens than one program holds (T = 200)."""
    n, kmin, kmax = sizes
    r = logits(n, kmax, 200, seed=n + kmax)
    v = torch.randn(r.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    tri, ref = sweeps(kmin, kmax, "triton"), sweeps(kmin, kmax, "torch")
    assert isinstance(tri, triton_dp.TritonDP)
    m, z = tri.forward_marginals(r, seed(7), True)
    m_ref, z_ref = ref.forward_marginals(r.double(), seed(7), True)
    torch.testing.assert_close(m.double(), m_ref, atol=1e-6, rtol=0)
    assert torch.equal(z, z_ref.float())
    assert ((z.sum(-1) >= kmin) & (z.sum(-1) <= kmax)).all()
    torch.testing.assert_close(tri.cov_vec(r, v).double(), ref.cov_vec(r.double(), v.double()), atol=1e-5, rtol=1e-5)
    lc, lc_ref = tri.log_counts(r, True), ref.log_counts(r.double(), True)
    assert torch.equal(torch.isinf(lc), torch.isinf(lc_ref))
    fin = torch.isfinite(lc_ref)
    torch.testing.assert_close(lc[fin].double(), lc_ref[fin], atol=0, rtol=1e-6)
    values_off, z_only = tri.forward_marginals(r, seed(7), False)
    assert torch.equal(z_only, z) and not values_off.any()


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: f"{s[1]}..{s[2]}-of-{s[0]}")
@pytest.mark.parametrize("kind", ["softmax", pytest.param("sigmoid", marks=pytest.mark.slow)])
def test_the_fused_route_equals_the_composed_one(sizes, kind):
    """``chosen`` (the draw, the drawn by score, unused slots by index) and ``chosen_backward`` (Eq. 7,
    both conventions) against ``Kernels``' composed defaults on the torch sweeps."""
    n, kmin, kmax = sizes
    r = logits(n, kmax, 150, seed=3 * n + kmax)
    p = circuits.kernels.straight_through.scores(r, kind)
    tri, ref = sweeps(kmin, kmax, "triton"), sweeps(kmin, kmax, "torch")
    for slots in sorted({kmax, n}):
        w, idx, mask = tri.chosen(r, seed(11), p, slots)
        w_ref, idx_ref, mask_ref = ref.chosen(r, seed(11), p, slots)
        assert torch.equal(idx, idx_ref) and torch.equal(mask, mask_ref) and torch.equal(w, w_ref)
    g = torch.randn(w.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    for paper in (False, True):
        got = tri.chosen_backward(r, idx.to(torch.int32), mask, g, kind, paper)
        want = ref.chosen_backward(r.double(), idx, mask, g.double(), kind, paper)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_the_probability_form_in_plain_torch():
    """``triton_lattice.plain_forward`` (the kernels' lattice and adjoint lattice in float64 torch, at the
    tilt of the torch passes) gives the torch DP's marginals, and the kernels give its."""
    from circuits.kernels import triton_lattice
    from circuits.kernels.torch_passes import tilt_constant

    for n, kmin, kmax in ((8, 3, 3), (13, 2, 5), (64, 8, 8)):
        r = logits(n, kmax, 40, seed=n).cpu()
        P, m = triton_lattice.plain_forward(r, kmin, kmax, tilt_constant(r, kmin, kmax))
        want = sweeps(kmin, kmax, "torch").forward_marginals(r.double().to(DEVICE), None, True)[0].cpu()
        torch.testing.assert_close(m, want, atol=1e-7, rtol=0)  # two float64 computations, other roundings
        assert (P[:, kmin:].sum(-1) > 1e-3).all()  # the tilt puts the band's mass near 1
        got = sweeps(kmin, kmax, "triton").forward_marginals(r.to(DEVICE), None, True)[0].cpu()
        torch.testing.assert_close(got.double(), m, atol=1e-6, rtol=0)


def test_against_brute_force():
    """n = 8: marginals, the whole Jacobian Cov(z) (one cov_vec per basis vector), log Z."""
    n, kmin, kmax = 8, 2, 5
    r = logits(n, kmax, 6, seed=4)
    want = exact(r.cpu().double(), masks(n, range(kmin, kmax + 1)))
    tri = sweeps(kmin, kmax, "triton")
    m, _ = tri.forward_marginals(r, None, True)
    torch.testing.assert_close(m.cpu().double(), want.marginals, atol=1e-6, rtol=0)
    eye = torch.eye(n, device=DEVICE)
    cov = torch.stack([tri.cov_vec(r, eye[i].expand_as(r).contiguous()) for i in range(n)], -1)  # [T, n, n]
    torch.testing.assert_close(cov.cpu().double(), want.cov, atol=1e-6, rtol=0)
    log_z = torch.logsumexp(tri.log_counts(r, True).double(), -1)
    torch.testing.assert_close(log_z.cpu(), want.log_partition, atol=0, rtol=1e-6)


def test_draws_follow_the_distribution():
    """chi^2 of 6,000 draws of one row (each token its own uniforms) against the exact
    probabilities of its subsets; a draw that ignored the constraint or the weights fails."""
    n, kmin, kmax = 6, 1, 3
    row = torch.tensor([1.5, -0.5, 0.0, 2.0, -1.0, 0.3])
    T = 6000
    _, z = sweeps(kmin, kmax, "triton").forward_marginals(row.expand(T, n).contiguous().to(DEVICE), seed(3), False)
    allowed = masks(n, range(kmin, kmax + 1))
    want = exact(row[None].double(), allowed).probs[0]  # [M]
    codes = (z.cpu().double() @ (2.0 ** torch.arange(n, dtype=torch.float64))).long()
    keys = (allowed @ (2.0 ** torch.arange(n, dtype=torch.float64))).long()
    counts = (codes[:, None] == keys[None]).sum(0).double()
    assert counts.sum() == T  # every draw is an allowed subset
    chi2 = ((counts - T * want) ** 2 / (T * want)).sum().item()
    assert chi2 < 95.0, chi2  # 41 subsets: 40 degrees of freedom, p < 1e-6 above 95


@pytest.mark.skipif(DEVICE != "cpu" or library.library() is None, reason="the C DP runs on the CPU")
def test_the_same_draws_as_the_c_dp():
    r = logits(64, 8, 300, seed=9)
    z = sweeps(4, 8, "triton").forward_marginals(r, seed(21), False)[1]
    assert torch.equal(z, c_dp.forward_marginals(r, 4, 8, seed(21), False)[1])


@pytest.mark.slow
def test_no_kernel_reads_scratch_it_did_not_write(monkeypatch):
    """Every query with its checkpoint scratch filled with NaN first gives the same results bit for
    bit: no kernel reads a checkpoint that it has not written."""
    r = logits(13, 5, 150, seed=8)
    tri = sweeps(2, 5, "triton")
    p = torch.softmax(r, -1)
    v = torch.randn(r.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)

    def queries():
        w, idx, mask = tri.chosen(r, seed(5), p, 5)
        back = tri.chosen_backward(r, idx, mask, torch.ones_like(w), "softmax", True)
        return [*tri.forward_marginals(r, seed(5), True), w, idx, back, tri.cov_vec(r, v)]

    assert_no_unwritten_reads(monkeypatch, queries)


def test_chunks_of_tokens_change_nothing(monkeypatch):
    """A checkpoint scratch too small for the batch: the kernels run over chunks of tokens, with the
    same results and draws (the uniforms are indexed by the token in the whole batch)."""
    r = logits(13, 5, 300, seed=2)
    tri = sweeps(2, 5, "triton")
    whole = tri.forward_marginals(r, seed(4), True)
    monkeypatch.setattr(triton_dp, "SCRATCH_BYTES", 1)
    monkeypatch.setattr(triton_dp, "_block", lambda: 128)  # the GPU's programs, whatever runs them
    assert triton_dp._chunks(300, 100) == [(0, 128), (128, 256), (256, 300)]
    chunked = tri.forward_marginals(r, seed(4), True)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])


@pytest.mark.parametrize(
    "sizes",
    [
        (64, 8, 8),
        pytest.param((64, 4, 8), marks=pytest.mark.slow),
        pytest.param((64, 0, 1), marks=pytest.mark.slow),
        pytest.param((256, 16, 16), marks=pytest.mark.slow),
        pytest.param((256, 8, 32), marks=pytest.mark.slow),
    ],
    ids=lambda s: f"{s[1]}..{s[2]}-of-{s[0]}",
)
def test_accuracy_grid(sizes):
    """Marginals within 1e-6 of float64 and log Z within 1e-6 relative on every kind of row of
    tools/accuracy_fp32.py (N(0, s^2) at s = 1 and 100, +-1e4 shifts, -inf entries, equal rows), all
    in one batch (one call of each kernel: the interpreter's cost is per call)."""
    n, kmin, kmax = sizes
    count = 16 if n <= 64 else 8
    kinds = [(s, j, kind) for s in (1.0, 100.0) for j, kind in enumerate(A.KINDS)]
    r = torch.cat([A.rows(n, s, kind, count, seed=100 * j + int(s)) for s, j, kind in kinds])
    m_err, z_err = A.errors(A.dp_runner(kmin, kmax, "dp-triton"), lambda x: A.cardinality_log_norm(x, kmin, kmax), r)
    assert m_err <= 1e-6 and z_err <= 1e-6, (m_err, z_err)


@pytest.fixture
def triton_everywhere(monkeypatch):
    """``select`` takes the Triton lattice for float32 lattices on this device (on the CPU too)."""
    default = select._default
    monkeypatch.setattr(
        select, "_default", lambda program, dtype: "triton" if dtype == torch.float32 else default(program, dtype)
    )
    select._dp_sweeps.cache_clear()
    yield
    select._dp_sweeps.cache_clear()


def test_the_dp_queries_and_the_route_take_the_kernels(triton_everywhere):
    """CardinalityDP's queries and probmoe.route's fused training route (bf16 logits too) through the
    operators: the same values, draws and gradients as the torch sweeps."""
    import probmoe

    dp = circuits.CardinalityDP(circuits.RangeK(16, 2, 6), DEVICE)
    assert dp.kernels(torch.float32).name == "triton"
    r = logits(16, 6, 40, seed=8).requires_grad_()
    gen = torch.Generator(DEVICE).manual_seed(1)
    m, z = dp.marginals_and_sample(r, gen)
    ref = sweeps(2, 6, "torch")
    torch.testing.assert_close(
        m.detach().double(), ref.forward_marginals(r.detach().double(), None, True)[0], atol=1e-6, rtol=0
    )
    assert ((z.sum(-1) >= 2) & (z.sum(-1) <= 6)).all()
    (g,) = torch.autograd.grad((m * torch.arange(16.0, device=DEVICE)).sum(), r)
    want = ref.cov_vec(r.detach().double(), torch.arange(16.0, device=DEVICE).expand(40, 16).double().contiguous())
    torch.testing.assert_close(g.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        dp.log_partition(r).detach(),
        circuits.CardinalityDP(circuits.RangeK(16, 2, 6), DEVICE).log_partition(r.detach()),
        atol=0,
        rtol=1e-6,
    )
    for dtype in (torch.float32, torch.bfloat16):
        x = r.detach().to(dtype).requires_grad_()
        out = probmoe.route(x, k=4, backend="dp", training=True, generator=torch.Generator(DEVICE).manual_seed(3))
        out.weights.sum().backward()
        assert out.indices.shape == (40, 4) and out.mask.all() and torch.isfinite(x.grad).all()


@pytest.mark.skipif(DEVICE != "cuda", reason="host synchronisations are a CUDA matter")
def test_no_host_synchronisation():
    r = logits(64, 8, 512, seed=1).requires_grad_()
    tri = sweeps(8, 8, "triton")
    with no_host_synchronisation():
        p = torch.softmax(r.detach(), -1)
        w, idx, mask = tri.chosen(r.detach(), seed(1), p, 8)
        tri.chosen_backward(r.detach(), idx, mask, torch.ones_like(w), "softmax", False)
        tri.forward_marginals(r.detach(), seed(1), True)
