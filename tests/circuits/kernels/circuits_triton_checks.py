"""The Triton passes (circuits/kernels/triton_passes.py, layer-parallel kernels in triton_layers.py) against
the torch passes and brute force.

Run by tests/circuits/kernels/test_circuits_triton.py in a child process: with CUDA the compiled kernels run on the
GPU; without it TRITON_INTERPRET=1 is set for the whole child, and the kernels run on CPU tensors in
Triton's interpreter (triton reads the variable when a kernel is defined, its own library's as
well, so it cannot be switched on for part of a process). Not collected by a plain ``pytest``
(the file name does not start with test_); run it directly with

    TRITON_INTERPRET=1 python -m pytest tests/circuits/kernels/circuits_triton_checks.py

The interpreter is slow (seconds per pass: it pays per program and per operation), so circuits and
token counts stay small; ``test_smoke`` is the quick one (tests/circuits/kernels/test_triton_layers.py runs it
in the default suite).
"""

import functools
import os

import pytest
import torch
from brute import exact, masks
from host_sync import no_host_synchronisation
from triton_child import checks_device

import circuits
import circuits.kernels.select  # the fixture below patches it (not imported by "import circuits" alone)
from circuits.kernels.program import draw_uniforms
from circuits.kernels.torch_passes import TorchPasses

DEVICE = checks_device("tests/circuits/kernels/test_circuits_triton.py")

from circuits.kernels.triton_passes import TritonPasses  # noqa: E402 (after the skips)


def compiled(spec):
    if isinstance(spec, tuple):  # (DIMACS text, compiler): a CNF circuit
        text, compiler = spec
        path = os.path.join(CNF_DIR, f"f{abs(hash(text))}.cnf")
        with open(path, "w") as f:
            f.write(text)
        return circuits.compile_circuit(path, device=DEVICE, compiler=compiler)
    return circuits.compile_circuit(spec, device=DEVICE)


CNF_DIR = os.environ.get("TMPDIR", "/tmp")
# (x1 or x2) and (not x1 or x3) and (x2 or not x4 or x5) and (not x3 or not x5); x6 unconstrained
# (tests/circuits/test_circuits_general.py's formula): a circuit with implicit variables, not smooth
CNF = ("p cnf 6 4\n1 2 0\n-1 3 0\n2 -4 5 0\n-3 -5 0\n", "pysdd")


def seeded(seed: int) -> torch.Generator:
    return torch.Generator(DEVICE).manual_seed(seed)


def shifted(c, r):
    """r [T, n] shifted as the circuit's calls shift it (exactly-k: minus the k-th largest)."""
    return c.shifted(r)


def logits(spec, T, seed, n=None):
    """[T, n] on DEVICE: N(0, 9), row 0 with -inf logits (still satisfiable), row 1 at +-1e4 (a cardinality
    spec; ``n`` for another circuit: N(0, 9) only)."""
    gen = torch.Generator().manual_seed(seed)
    n = spec.n if n is None else n
    r = torch.randn(T, n, generator=gen) * 3
    if T > 1 and hasattr(spec, "cardinalities"):
        r[0, : spec.n - spec.cardinalities[-1]] = -torch.inf
        r[1] = 1e4 * (1 - 2 * (torch.arange(spec.n) % 2))
    return r.to(DEVICE), torch.randn(T, n, generator=gen).to(DEVICE)


def check_against_torch(prog, r, v, fast, gen):
    """``fast`` (a TritonPasses) on r, v [T, n] against the torch passes: the same draws from the same
    uniforms and the same MAP, log Z within 1e-5, the marginals and Cov(z) v against float64."""
    ref = TorchPasses(prog)
    uniforms, fill = draw_uniforms(prog, r, gen)
    z, log_z = fast.sample(r, uniforms, fill)
    z_ref, log_z_ref = ref.sample(r, uniforms, fill)
    assert torch.equal(z, z_ref)
    torch.testing.assert_close(log_z, log_z_ref, atol=1e-5, rtol=1e-5)
    # refine=False: a float64_rows circuit (CNF, groups) otherwise takes the torch passes in float64
    log_z2, m = fast.log_partition(r, True, accurate=False, refine=False)
    assert torch.equal(log_z2, log_z) and fast.log_partition(r, False)[1] is None
    log_z64, m64 = ref.log_partition(r.double(), True)
    torch.testing.assert_close(log_z.double(), log_z64, atol=1e-5, rtol=1e-6)
    accurate, m_refined = fast.log_partition(r, True)  # log Z (and a float64_rows circuit's m) from float64 kernels
    torch.testing.assert_close(accurate.double(), log_z64, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(accurate, ref.log_partition(r, True)[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(m_refined.double(), m64, atol=1e-6 if prog.float64_rows else 2e-6, rtol=0)
    torch.testing.assert_close(m.double(), m64, atol=2e-6, rtol=0)
    z_map, best = fast.map(r)
    z_map_ref, best_ref = ref.map(r)
    assert torch.equal(z_map, z_map_ref)
    torch.testing.assert_close(best, best_ref, atol=1e-5, rtol=1e-6)
    jvp = fast.marginals_jvp(r, v)
    torch.testing.assert_close(jvp.double(), ref.marginals_jvp(r.double(), v.double()), atol=2e-5, rtol=0)
    return z


SMALL = [
    circuits.ExactlyK(6, 3),
    circuits.RangeK(8, 2, 5),
    circuits.ExactlyK(10, 4),
    circuits.RangeK(12, 3, 7),
    circuits.ExactlyK(16, 5),
    circuits.GroupLimited(16, 4, 4, 2),  # 4 of 16 from at most 2 of 4 groups: the tilt moves elements
]


def test_smoke():
    """The quick check (the default suite's): a range circuit (implicit variables, a tilt that moves
    elements), every pass against the torch passes."""
    spec = circuits.RangeK(8, 2, 5)
    c = compiled(spec)
    r, v = logits(spec, 24, seed=37)
    check_against_torch(c.program, shifted(c, r), v, TritonPasses(c.program, block=32), seeded(1))
    check_chosen(c, r, 1)


def check_chosen(c, r, seed_value):
    """``TritonPasses.chosen`` (one sort per row in a kernel) against ``Kernels.chosen`` composed from the
    same draw and the reference ``topk_chosen``: the same weights, indices and mask, tied scores included."""
    from circuits.kernels import straight_through
    from circuits.kernels.interface import Kernels
    from circuits.kernels.uniforms import seed_tensor

    fast = TritonPasses(c.program, block=32)
    seed = seed_tensor(seeded(seed_value), DEVICE)
    slots = c.spec.cardinalities[-1]
    for kind in ("softmax", "sigmoid"):
        p = straight_through.scores(r, kind)
        p[min(2, len(p) - 1)] = p[0, 0]  # a row of tied scores
        got, want = fast.chosen(r, seed, p, slots), Kernels.chosen(fast, r, seed, p, slots)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), (kind, a, b)


@pytest.mark.parametrize("spec", [circuits.ExactlyK(16, 5), circuits.ExactlyK(64, 8), circuits.ExactlyK(6, 6)], ids=str)
def test_the_exactly_k_shift_matches_the_reference(spec):
    """``TritonPasses.shift`` (a sort per row in a kernel) against ``Passes.shift`` (``kth_largest``'s
    reference): -inf entries, equal rows, NaN (as -inf), a row of only -inf."""
    from circuits.kernels.interface import Passes

    c = compiled(spec)
    fast = TritonPasses(c.program)
    r = logits(spec, 37, seed=5)[0]
    r[2] = 1.5
    r[3, 1] = float("nan")
    r[4] = -torch.inf
    assert torch.equal(fast.shift(r), Passes.shift(fast, r))


@pytest.mark.parametrize("spec", [circuits.ExactlyK(16, 5), circuits.RangeK(10, 0, 10)], ids=str)
def test_chosen_matches_the_composed_reference(spec):
    c = compiled(spec)
    check_chosen(c, logits(spec, 37, seed=9)[0], 9)


@pytest.mark.parametrize("cnf", [CNF, ("uf20-01", "d4")], ids=["general-formula-pysdd", "uf20-01-d4"])
def test_cnf_circuits_match_the_torch_passes(cnf):
    """Circuits compiled from CNF (not smooth, float64 rows): the small formula by pysdd, SATLIB's uf20-01 by
    d4 (the ``cnf`` extra; skipped without it)."""
    if cnf[0] == "uf20-01":
        pytest.importorskip("py_d4", reason="d4 is not installed (the cnf extra)")
        path = os.path.join(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            "data",
            "satlib",
            "uf20-01.cnf",
        )
        with open(path) as f:
            cnf = (f.read(), "d4")
    c = compiled(cnf)
    r, v = logits(None, 37, seed=11, n=c.program.n)
    check_against_torch(c.program, r, v, TritonPasses(c.program, block=32), seeded(4))


@pytest.mark.parametrize("T", [1, 37])
@pytest.mark.parametrize("spec", SMALL, ids=str)
def test_small_circuits_match_the_torch_passes(spec, T):
    """T = 37: two blocks of 32 tokens, the second partial; range circuits have implicit variables."""
    c = compiled(spec)
    r, v = logits(spec, T, seed=T)
    z = check_against_torch(c.program, shifted(c, r), v, TritonPasses(c.program), seeded(1))
    sizes = z.sum(-1)
    assert bool(((sizes >= spec.cardinalities[0]) & (sizes <= spec.cardinalities[-1])).all())
    if T > 1:
        assert not z[0, : spec.n - spec.cardinalities[-1]].any()


def test_exactly_8_of_64_matches_the_torch_passes():
    spec = circuits.ExactlyK(64, 8)
    c = compiled(spec)
    r, v = logits(spec, 20, seed=0)
    z = check_against_torch(c.program, shifted(c, r), v, TritonPasses(c.program), seeded(2))
    assert bool((z.sum(-1) == 8).all()) and not z[0, :56].any()


def test_chunks_taken_in_turn_and_no_tokens():
    """Past the scratch budget the tokens go through the levels in chunks (here 3 chunks of 64, the last
    partial); T = 0 launches nothing."""
    spec = circuits.RangeK(6, 1, 4)
    c = compiled(spec)
    r, v = logits(spec, 150, seed=3)
    fast = TritonPasses(c.program, block=64, scratch_bytes=1)
    check_against_torch(c.program, r, v, fast, seeded(3))
    empty = r[:0]
    assert fast.log_partition(empty, True)[1].shape == (0, 6) and fast.map(empty)[0].shape == (0, 6)
    assert fast.marginals_jvp(empty, empty).shape == (0, 6)
    assert fast.sample(empty, *draw_uniforms(c.program, empty))[0].shape == (0, 6)


@pytest.mark.parametrize("spec", [circuits.ExactlyK(5, 2), circuits.RangeK(5, 1, 3)], ids=str)
def test_many_draws_equal_the_torch_passes(spec):
    """4,096 draws (blocks of 1,024 tokens), token for token: an inverse-CDF step off by a little shows."""
    c = compiled(spec)
    r = shifted(c, logits(spec, 4096, seed=7)[0])
    uniforms, fill = draw_uniforms(c.program, r, seeded(7))
    z, _ = TritonPasses(c.program, block=1024).sample(r, uniforms, fill)
    assert torch.equal(z, TorchPasses(c.program).sample(r, uniforms, fill)[0])


@pytest.mark.parametrize(
    "spec,cards",
    [
        (circuits.ExactlyK(6, 3), [3]),
        (circuits.RangeK(7, 2, 4), range(2, 5)),
        (circuits.ExactlyK(5, 5), [5]),
        (circuits.RangeK(6, 0, 6), range(7)),
    ],
    ids=str,
)
def test_brute_force(spec, cards):
    """log Z, the marginals, Cov(z) v and the MAP against enumeration in float64, -inf and +-1e4 logits included."""
    c = compiled(spec)
    r, v = logits(spec, 8, seed=4)
    r = shifted(c, r)
    want = exact(r.cpu(), masks(spec.n, cards))
    fast = TritonPasses(c.program)
    log_z, m = fast.log_partition(r, True)
    torch.testing.assert_close(log_z.cpu().double(), want.log_partition, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(m.cpu().double(), want.marginals, atol=2e-6, rtol=0)
    cov_v = torch.einsum("tij,tj->ti", want.cov, v.cpu().double())
    torch.testing.assert_close(fast.marginals_jvp(r, v).cpu().double(), cov_v, atol=2e-5, rtol=0)
    assert torch.equal(fast.map(r)[0].cpu().double(), want.map)


@pytest.fixture
def triton_everywhere(monkeypatch):
    """Circuits compiled under this fixture take the Triton passes for float32, whatever the device."""
    select = circuits.kernels.select.select  # where Circuit reads it
    monkeypatch.setattr(circuits.kernels.select, "select", functools.partial(select, prefer="triton"))


def test_through_the_public_api(triton_everywhere):
    """Circuit calls on the Triton passes: the exactly-k shift, the autograd contract (the marginals'
    Jacobian is Cov(z), by the Triton Cov(z) v), the MAP, and seeded draws equal to the torch passes'."""
    spec = circuits.RangeK(6, 2, 4)
    c = compiled(spec)
    assert isinstance(c.kernels(torch.float32), TritonPasses)
    r = torch.tensor([[0.7, -1.2, 0.3, 2.0, -0.4, 0.1]], device=DEVICE)
    want = exact(r.cpu(), masks(6, range(2, 5)))
    torch.testing.assert_close(c.marginals(r).cpu().double(), want.marginals, atol=2e-6, rtol=0)
    jac = torch.autograd.functional.jacobian(lambda x: c.marginals(x), r[0])
    torch.testing.assert_close(jac.cpu().double(), want.cov[0], atol=2e-6, rtol=0)
    x = r.clone().requires_grad_()
    grad = torch.autograd.grad(c.log_partition(x).sum(), x)[0]  # m - sigmoid(r)
    torch.testing.assert_close(grad.cpu().double(), want.marginals - torch.sigmoid(r.cpu().double()), atol=2e-6, rtol=0)
    assert torch.equal(c.map(r).cpu().double(), want.map)
    k4 = compiled(circuits.ExactlyK(12, 4))
    rr = (torch.randn(40, 12, generator=torch.Generator().manual_seed(5)) * 2 + 50).to(DEVICE)
    # the circuit shifts rr by each row's 4th largest before the passes
    z = k4.sample(rr, generator=seeded(5))
    rs = shifted(k4, rr)
    z_ref, _ = TorchPasses(k4.program).sample(rs, *draw_uniforms(k4.program, rs, seeded(5)))
    assert torch.equal(z, z_ref) and bool((z.sum(-1) == 4).all())


@pytest.mark.parametrize(
    "size",
    [dict(k=3), dict(kmin=2, kmax=4), dict(constraint=circuits.GroupLimited(12, 3, 4, 2))],
    ids=["exactly", "range", "grouped"],
)
def test_route_fused_equals_composed(triton_everywhere, size, monkeypatch):
    """route(training=True) on the Triton passes as one operator (``TritonPasses.fused``: the draw, its
    row sort, Eq. 7's backward) against the composed path on the same passes: the same indices, weights,
    mask and scores bit for bit, gradients to rounding (tests/probmoe/test_route_fused.py for the C ones);
    sizes, and a group spec's compiled circuit."""
    import importlib

    import probmoe

    route_module = importlib.import_module("probmoe.route")
    r = (torch.randn(24, 12, generator=torch.Generator().manual_seed(11)) * 2).to(DEVICE)
    g = torch.randn(24, 4, generator=torch.Generator().manual_seed(12)).to(DEVICE)[:, : size.get("k", 4)]
    if "constraint" in size:
        g = g[:, : size["constraint"].kmax]

    def routed():
        x = r.clone().requires_grad_()
        out = probmoe.route(x, **size, training=True, backend="circuit", generator=seeded(13))
        (grad,) = torch.autograd.grad((out.weights * g).sum(), x)
        return out.indices, out.weights.detach(), out.mask, out.probs, grad

    calls = []
    real = route_module._route_fused
    monkeypatch.setattr(route_module, "_route_fused", lambda *a: calls.append(1) or real(*a))
    fused = routed()
    assert calls, "the fused path was not taken"
    from probmoe import constraints

    if "constraint" in size:
        evaluator = constraints.compiled(size["constraint"], DEVICE)
    else:
        kmin, kmax = size.get("k", size.get("kmin")), size.get("k", size.get("kmax"))
        evaluator = constraints.cardinality(12, kmin, kmax, DEVICE)
    assert isinstance(evaluator.kernels(torch.float32), TritonPasses)
    monkeypatch.setattr(route_module, "_fused", lambda *a: False)
    composed = routed()
    for a, b in zip(fused[:4], composed[:4]):
        assert torch.equal(a, b)
    torch.testing.assert_close(fused[4], composed[4], atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(DEVICE != "cuda", reason="host synchronisation is observable on CUDA only")
def test_no_host_synchronisation():
    c = compiled(circuits.RangeK(64, 4, 8))
    fast = TritonPasses(c.program)
    r, v = logits(c.spec, 4096, seed=6)
    uniforms, fill = draw_uniforms(c.program, r)

    def every_pass():
        fast.log_partition(r, True), fast.sample(r, uniforms, fill), fast.map(r), fast.marginals_jvp(r, v)

    every_pass()  # compiles the kernels
    with no_host_synchronisation():
        every_pass()


def test_fp32_exact_at_every_scale():
    """Issue 28: the marginals within 1e-5 and log Z within 1e-6 (relative) of float64 references on
    the same fp32 logits (tools/accuracy_fp32.py), every kind of row at scales 1 and 100, for a range
    whose circuit has implicit variables (0..8 of 64) and for exactly 8 of 64; Cov(z) v at +1e4
    against the torch passes."""
    import importlib.util
    import sys

    spec_ = importlib.util.spec_from_file_location(
        "accuracy_fp32",
        os.path.join(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
            "tools",
            "accuracy_fp32.py",
        ),
    )
    A = importlib.util.module_from_spec(spec_)
    sys.modules["accuracy_fp32"] = A
    spec_.loader.exec_module(A)
    for n, kmin, kmax in ((64, 0, 8), (64, 8, 8)):
        spec = circuits.RangeK(n, kmin, kmax) if kmin < kmax else circuits.ExactlyK(n, kmin)
        c = compiled(spec)
        inner = A.circuit_runner(c, "triton")

        def run(x, inner=inner):  # the references run on the CPU
            return tuple(t.cpu() for t in inner(x.to(DEVICE)))

        for s in (1.0, 100.0):  # one block of 30 rows: 6 of each kind
            r = torch.cat([A.rows(n, s, kind, 6, seed=10 * j + int(s)) for j, kind in enumerate(A.KINDS)])
            m_err, z_err = A.errors(run, lambda x: A.cardinality_log_norm(x, kmin, kmax), r)
            assert m_err <= A.MARGINAL_BOUND and z_err <= A.LOG_Z_BOUND, (spec, s, m_err, z_err)
        r = A.rows(n, 3.0, "+1e4", 8, seed=4).to(DEVICE)
        v = torch.randn(8, n, generator=torch.Generator().manual_seed(5)).to(DEVICE)
        fast = TritonPasses(c.program)
        torch.testing.assert_close(
            fast.marginals_jvp(r, v), TorchPasses(c.program).marginals_jvp(r, v), atol=1e-5, rtol=0
        )
