"""The group DP's Triton kernels (circuits/kernels/triton_group_dp.py, triton_groups.py) against the
torch group sweeps (their oracle), brute force and float64 references.

Run by tests/circuits/kernels/test_triton_group_dp.py in a child process: with CUDA the compiled
kernels run on the GPU; without it TRITON_INTERPRET=1 is set for the whole child and the kernels
run on CPU tensors in Triton's interpreter. Not collected by a plain ``pytest``; run it directly with

    TRITON_INTERPRET=1 python -m pytest tests/circuits/kernels/triton_group_checks.py
"""

import pytest
import torch
from brute import exact
from brute import group_models as models
from group_specs import SPECS as BRUTE_SPECS
from host_sync import no_host_synchronisation
from scratch_fill import assert_no_unwritten_reads
from stats import chi2_pvalue, mask_counts
from tool_modules import load_tool
from triton_child import checks_device

import circuits
from circuits import GroupCapacity, GroupLimited
from circuits.kernels import select, straight_through, triton_group_dp
from circuits.kernels.lattice import GroupLattice
from circuits.kernels.uniforms import seed_tensor

DEVICE = checks_device("test_triton_group_dp.py")

A = load_tool("accuracy_fp32")
N = load_tool("group_numerics")

# small specs of every kind: group-limited, capacity with a range, one from every group, unequal groups
# (the interpreter takes seconds a call: the default set runs one of each test, the slow set the rest)
SLOW = pytest.mark.slow
SPECS = [
    pytest.param(GroupLimited(12, 3, 4, 2), marks=SLOW),
    pytest.param(GroupCapacity(16, None, 4, 2, kmin=0, kmax=4), marks=SLOW),
    GroupCapacity(12, 4, 4, 1),
    pytest.param(GroupLimited(20, None, [3, 6, 4, 7], 2, capacity=3, kmin=2, kmax=5), marks=SLOW),
    pytest.param(GroupLimited(64, 8, 8, 4), marks=SLOW),
]
QUICK_BRUTE = (1, 7, 9, 11)  # one spec of each kind of limit


def sweeps(spec, impl: str):
    return select.select(GroupLattice(spec, torch.device(DEVICE)), torch.float32, prefer=impl)


def logits(spec, T: int, seed: int) -> torch.Tensor:
    """[T, n] fp32 on DEVICE: N(0, 9); row 1 at +-1e4, row 2 all equal, row 3 with its first group
    1e4 below the rest, row 4 with every third logit -inf, row 5 at scale 90."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(T, spec.n, generator=g) * 3
    r[1] = 1e4 * (1 - 2 * (torch.arange(spec.n) % 2))
    r[2] = 0.5
    r[3, : spec.groups[0]] -= 1e4
    r[4, ::3] = -torch.inf
    r[5] *= 30
    return r.to(DEVICE)


def tied(spec, T: int, seed: int) -> torch.Tensor:
    """``logits`` with rows 6..11 of small integers (equal logits in a group, equal sums across
    groups, all exact) and row 0 with one finite logit (nothing allowed where kmin > 1)."""
    r = logits(spec, T, seed)
    r[6:12] = torch.randint(-2, 3, (6, spec.n), generator=torch.Generator().manual_seed(seed)).float().to(DEVICE)
    r[0, 1:] = -torch.inf
    return r


def seed(s: int) -> torch.Tensor:
    return seed_tensor(torch.Generator().manual_seed(s)).to(DEVICE)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_against_the_torch_sweeps(spec):
    """log Z, the marginals, one draw (the same seed draws the same subset), Cov(z) v, on more tokens
    than one program holds in the interpreter (T = 1,100), rows that allow nothing NaN in both."""
    r = logits(spec, 1100, seed=spec.n)
    tri, ref = sweeps(spec, "triton"), sweeps(spec, "torch")
    assert isinstance(tri, triton_group_dp.TritonGroupDP) and tri.fused
    lz, m = tri.log_partition(r, True)
    lz_ref, m_ref = ref.log_partition(r.double(), True)
    ok = torch.isfinite(lz_ref)
    assert torch.equal(torch.isnan(m).any(1), ~ok) and torch.equal(torch.isinf(lz), ~ok)
    torch.testing.assert_close(m[ok].double(), m_ref[ok], atol=1e-6, rtol=0)
    torch.testing.assert_close(lz[ok].double(), lz_ref[ok], atol=1e-6, rtol=1e-6)
    z, lz_draw = tri.sample(r, *tri.draw_uniforms(r, seed(7)))
    z_ref, _ = ref.sample(r.double(), *ref.draw_uniforms(r, seed(7)))
    assert torch.equal(z[ok].double(), z_ref[ok]) and torch.equal(lz_draw, lz)
    assert torch.equal(tri.draw(r, seed(7))[ok], z[ok])
    v = torch.randn(r.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    got, want = tri.marginals_jvp(r, v), ref.marginals_jvp(r.double(), v.double())
    torch.testing.assert_close(got[ok].double(), want[ok], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_the_map_equals_the_torch_sweeps(spec):
    """The most probable allowed subset in one kernel: the torch sweeps' subset (equal logits and equal
    sums resolved alike), its log probability; z = 0 and -inf where nothing is allowed."""
    r = tied(spec, 300, seed=spec.n)
    z, lp = sweeps(spec, "triton").map(r)
    z_ref, lp_ref = sweeps(spec, "torch").map(r.double())
    assert torch.equal(z.double(), z_ref)
    ok = torch.isfinite(lp_ref)
    assert torch.equal(torch.isinf(lp), ~ok) and z[~ok].eq(0).all() and (spec.kmin < 2 or not ok[0])
    torch.testing.assert_close(lp[ok].double(), lp_ref[ok], atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize(
    "spec",
    [spec if i in QUICK_BRUTE else pytest.param(spec, marks=SLOW) for i, spec in enumerate(BRUTE_SPECS)],
    ids=lambda s: s.describe(),
)
def test_against_brute_force(spec):
    """Marginals, the whole Jacobian Cov(z) (one marginals_jvp per basis vector), log Z and the MAP
    (an allowed subset of the largest probability) against enumeration of the allowed subsets (every
    spec of tests/helpers/group_specs.py, n <= 10)."""
    r = tied(spec, 12, seed=3 * spec.n)[[2, 3, 5, 6, 7, 8, 9]]
    allowed = models(spec)
    want = exact(r.cpu().double(), allowed)
    tri = sweeps(spec, "triton")
    lz, m = tri.log_partition(r, True)
    torch.testing.assert_close(m.cpu().double(), want.marginals, atol=1e-6, rtol=0)
    torch.testing.assert_close(lz.cpu().double(), want.log_partition, atol=1e-6, rtol=1e-6)  # log Z near 0: absolute
    z, lp = tri.map(r)
    mask_counts(z.cpu().double(), allowed)  # asserts that every MAP is allowed
    best = want.probs.max(-1).values.log() + want.log_partition  # log P_indep of a most probable subset
    torch.testing.assert_close(lp.cpu().double(), best, atol=1e-5, rtol=1e-6)
    x = r.cpu().double()
    own = torch.where(z.cpu() > 0, x, 0.0).sum(-1) - torch.nn.functional.softplus(x).sum(-1)  # z's own log P_indep
    torch.testing.assert_close(own, best, atol=1e-5, rtol=1e-6)
    eye = torch.eye(spec.n, device=DEVICE)
    cov = torch.stack([tri.marginals_jvp(r, eye[i].expand_as(r).contiguous()) for i in range(spec.n)], -1)
    torch.testing.assert_close(cov.cpu().double(), want.cov, atol=1e-6, rtol=0)


@pytest.mark.parametrize("spec", SPECS[:4], ids=str)
def test_the_fused_route_equals_the_composed_one(spec):
    """``chosen`` (the draw, the drawn by score, unused slots by index) and ``chosen_backward`` (Eq. 7,
    both scores, both conventions) against ``Kernels``' composed defaults on the torch sweeps."""
    r = logits(spec, 150, seed=5 * spec.n)
    tri, ref = sweeps(spec, "triton"), sweeps(spec, "torch")
    for kind in ("softmax", "sigmoid"):
        p = straight_through.scores(r, kind)
        for slots in sorted({spec.kmax, spec.n}):
            w, idx, mask = tri.chosen(r, seed(11), p, slots)
            w_ref, idx_ref, mask_ref = ref.chosen(r, seed(11), p, slots)
            assert torch.equal(idx, idx_ref) and torch.equal(mask, mask_ref) and torch.equal(w, w_ref)
        g = torch.randn(w.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE)
        for paper in (False, True):
            got = tri.chosen_backward(r, idx.to(torch.int32), mask, g, kind, paper)
            want = ref.chosen_backward(r.double(), idx, mask, g.double(), kind, paper)
            torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_no_expert_chosen():
    """k = 0 under a group limit (one outer state, no lattice inside the groups): log Z = Σ log
    sigma(-r), marginals, Cov(z) v, the draw and the MAP all zero."""
    spec = GroupLimited(6, 0, 3, 1)
    r = logits(spec, 10, seed=4)[[0, 2, 5, 6]]
    tri = sweeps(spec, "triton")
    lz, m = tri.log_partition(r, True)
    torch.testing.assert_close(lz, torch.nn.functional.logsigmoid(-r).sum(-1), atol=1e-5, rtol=1e-6)
    v = torch.randn(r.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    assert not m.any() and not tri.draw(r, seed(2)).any() and not tri.map(r)[0].any()
    assert not tri.marginals_jvp(r, v).any()


@pytest.mark.parametrize(
    "spec", [BRUTE_SPECS[3], BRUTE_SPECS[8], *(pytest.param(BRUTE_SPECS[i], marks=SLOW) for i in (2, 11))], ids=str
)
def test_draws_follow_the_distribution(spec):
    """chi^2 of 6,000 draws of one row (each token its own uniforms) against the exact probabilities
    of its allowed subsets; a draw that ignored the constraint or the weights fails."""
    row = torch.randn(1, spec.n, generator=torch.Generator().manual_seed(spec.n)) * 2
    allowed = models(spec)
    want = exact(row.double(), allowed).probs[0]  # [M]
    z = sweeps(spec, "triton").draw(row.expand(6000, spec.n).contiguous().to(DEVICE), seed(3))
    counts = mask_counts(z.cpu().double(), allowed)  # asserts that every draw is allowed
    assert chi2_pvalue(counts, want) > 1e-3


@SLOW
def test_no_kernel_reads_scratch_it_did_not_write(monkeypatch):
    """Every query with its scratch filled with NaN first gives the same results bit for bit: no
    kernel reads a row of scratch that it has not written (an uninitialised read would otherwise pass
    or fail by chance)."""
    spec = GroupLimited(20, None, [3, 6, 4, 7], 2, capacity=3, kmin=2, kmax=5)
    r = tied(spec, 140, seed=9)
    tri = sweeps(spec, "triton")
    p = straight_through.scores(r, "softmax")
    v = torch.randn(r.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)

    def queries():
        w, idx, mask = tri.chosen(r, seed(5), p, spec.kmax)
        g = torch.ones_like(w)
        back = tri.chosen_backward(r, idx.to(torch.int32), mask, g, "softmax", False)
        return [
            *tri.log_partition(r, True),
            *tri.sample(r, seed(5)),
            w,
            idx,
            back,
            tri.marginals_jvp(r, v),
            *tri.map(r),
        ]

    assert_no_unwritten_reads(monkeypatch, queries)


def test_chunks_of_tokens_change_nothing(monkeypatch):
    """A scratch too small for the batch: the kernels run over chunks of tokens, with the same results
    and draws (the uniforms are indexed by the token in the whole batch)."""
    spec = GroupLimited(20, None, [3, 6, 4, 7], 2, capacity=3, kmin=2, kmax=5)
    r = logits(spec, 300, seed=2)
    tri = sweeps(spec, "triton")
    whole = tri.log_partition(r, True), tri.draw(r, seed(4))
    monkeypatch.setattr(triton_group_dp, "SCRATCH_BYTES", 1)
    monkeypatch.setattr(triton_group_dp, "_block", lambda: 128)  # the GPU's programs, whatever runs them
    chunked = tri.log_partition(r, True), tri.draw(r, seed(4))
    assert torch.equal(whole[0][1], chunked[0][1]) and torch.equal(whole[1], chunked[1])


@pytest.mark.parametrize(
    "spec",
    [pytest.param(GroupLimited(64, 8, 8, 2), marks=SLOW), pytest.param(GroupLimited(256, 8, 8, 4), marks=SLOW)],
    ids=str,
)
def test_accuracy_grid_and_forced_groups(spec):
    """Marginals within 1e-6 of float64 and log Z within 1e-6 relative on every kind of row of
    tools/accuracy_fp32.py (N(0, s^2) at s = 1 and 100, +-1e4 shifts, -inf entries, equal rows) and
    on rows whose first group lies 300 to 1e4 below the rest, all in one batch."""
    kinds = [(s, j, kind) for s in (1.0, 100.0) for j, kind in enumerate(A.KINDS)]
    r = torch.cat([A.rows(spec.n, s, kind, 8, seed=100 * j + int(s)) for s, j, kind in kinds])
    r = torch.cat([r, N.forced_rows(spec, 16, seed=spec.n)])
    tri = sweeps(spec, "triton")

    def run(x):
        lz, m = tri.log_partition(x.to(DEVICE), True)
        return lz.cpu(), m.cpu()

    m_err, z_err = A.errors(run, lambda x: A.group_log_norm(x, spec), r)
    assert m_err <= 1e-6 and z_err <= 1e-6, (m_err, z_err)


@pytest.fixture
def triton_everywhere(monkeypatch):
    """``select`` takes the Triton kernels for float32 group lattices on this device (on the CPU too)."""
    default = select._default
    monkeypatch.setattr(
        select, "_default", lambda program, dtype: "triton" if dtype == torch.float32 else default(program, dtype)
    )
    select._kept_group_sweeps.cache_clear()
    yield
    select._kept_group_sweeps.cache_clear()


@SLOW
def test_the_group_dp_and_the_route_take_the_kernels(triton_everywhere, monkeypatch):
    """GroupDP's queries and probmoe.route's fused training route (bf16 logits too) through the
    operators: the same values and gradients as the torch sweeps, draws that the spec allows; the
    fused route (one kernel forward, one backward) equal to the composed one."""
    import importlib

    import probmoe

    route_module = importlib.import_module("probmoe.route")

    spec = GroupLimited(16, 4, 4, 2)
    dp = circuits.GroupDP(spec, DEVICE)
    assert dp.kernels(torch.float32).name == "triton" and circuits.native_kernels(dp, torch.float32)
    r = logits(spec, 40, seed=8)[6:].requires_grad_()
    ref = sweeps(spec, "torch")
    m = dp.marginals(r)
    torch.testing.assert_close(m.detach().double(), ref.log_partition(r.detach().double(), True)[1], atol=1e-6, rtol=0)
    (g,) = torch.autograd.grad((m * torch.arange(16.0, device=DEVICE)).sum(), r)
    v = torch.arange(16.0, device=DEVICE).expand_as(r).double().contiguous()
    torch.testing.assert_close(g.double(), ref.marginals_jvp(r.detach().double(), v), atol=1e-5, rtol=1e-5)
    z = dp.sample(r.detach(), torch.Generator(DEVICE).manual_seed(2))
    assert ((z.sum(-1) == 4) & (z.view(-1, 4, 4).amax(-1).sum(-1) <= 2)).all()
    best = ref.map(r.detach().double())[0]
    assert torch.equal(dp.map(r.detach()).double(), best)
    out = probmoe.route(r.detach(), constraint=spec, training=False, algorithm="dp")  # eval: the MAP
    assert torch.equal(torch.zeros_like(best).scatter_(1, out.indices, out.mask.double()), best)
    calls = []
    real = route_module._route_fused
    monkeypatch.setattr(route_module, "_route_fused", lambda *a: calls.append(1) or real(*a))
    for dtype in (torch.float32, torch.bfloat16):
        x = r.detach().to(dtype).requires_grad_()
        gen = torch.Generator(DEVICE).manual_seed(3)
        out = probmoe.route(x, constraint=spec, training=True, algorithm="dp", generator=gen)
        out.weights.sum().backward()
        assert out.indices.shape == (34, 4) and out.mask.all() and torch.isfinite(x.grad).all()
        groups_used = torch.zeros(34, 4, device=DEVICE).scatter_(1, out.indices // 4, 1.0).sum(-1)
        assert (groups_used <= 2).all()
        if dtype == torch.float32:
            fused = out.indices, out.weights.detach(), x.grad
    assert calls == [1, 1]
    monkeypatch.setattr(route_module, "_fused", lambda *a: False)
    x = r.detach().requires_grad_()
    out = probmoe.route(
        x, constraint=spec, training=True, algorithm="dp", generator=torch.Generator(DEVICE).manual_seed(3)
    )
    out.weights.sum().backward()
    assert torch.equal(out.indices, fused[0]) and torch.equal(out.weights.detach(), fused[1])
    torch.testing.assert_close(x.grad, fused[2], atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(DEVICE != "cuda", reason="host synchronisations are a CUDA matter")
def test_no_host_synchronisation():
    spec = GroupLimited(256, 8, 8, 4)
    r = logits(spec, 512, seed=1)
    tri = sweeps(spec, "triton")
    with no_host_synchronisation():
        p = torch.softmax(r, -1)
        w, idx, mask = tri.chosen(r, seed(1), p, 8)
        tri.chosen_backward(r, idx, mask, torch.ones_like(w), "softmax", False)
        tri.log_partition(r, True)
        tri.map(r)
