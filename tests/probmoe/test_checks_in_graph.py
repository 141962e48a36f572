"""Issue 45, point 2: the value checks on CUDA tensors never synchronise with the host, proved
without a GPU.

How: ``circuits.checks.in_graph`` sends tensors on "cuda" and on "meta" down the same branch (the
checks as ``torch._assert_async`` assertions), and on "meta" nothing can be read on the host: an
``.item()``, ``bool()``, ``int()``, ``.tolist()``, ``.nonzero()`` or a copy to the CPU raises (the
first test shows each). So every routing path below, run on meta logits with validation on,
fails the moment someone adds a host read to a check, or anywhere else on the path that CUDA
takes (the kernels aside: on meta the registered operators run their shape functions, and their
CUDA kernels are checked on the device, tests/probmoe/test_host_sync.py and
tests/circuits/kernels/circuits_triton_checks.py). ``test_the_host_branch_would_be_caught`` shows the
detector at work: with the CPU's branch forced on meta, the checks' host read raises.

The rest: the in-graph branch still rejects bad logits (run on the CPU, where ``_assert_async``
raises at once), and the CPU keeps its one-line ValueErrors; logits of 3e38, which overflowed the
fp32 passes (a circuit called such rows unsatisfiable, the DP gave log Z = inf), are a one-line
error naming ``logits`` and the allowed magnitude in every evaluator.
"""

import re
import types

import pytest
import torch

import circuits
import probmoe
from circuits import checks

META = torch.device("meta")
K8, R48 = circuits.ExactlyK(64, 8), circuits.RangeK(64, 4, 8)
GROUPS = circuits.GroupLimited(64, 8, groups=8, max_groups=4)
CASES = {  # route's arguments, backend
    "exactly 8 of 64, circuit": (dict(k=8), "circuit"),
    "exactly 8 of 64, dp": (dict(k=8), "dp"),
    "range 4..8 of 64, circuit": (dict(kmin=4, kmax=8), "circuit"),
    "range 4..8 of 64, dp": (dict(kmin=4, kmax=8), "dp"),
    "group-limited 8 of 64": (dict(constraint=GROUPS), "circuit"),
    "group-limited 8 of 64, dp": (dict(constraint=GROUPS), "dp"),
}


def meta_logits(*shape, grad=False):
    return torch.empty(*shape, device=META, requires_grad=grad)


def test_cuda_and_meta_take_the_in_graph_branch_and_meta_has_no_host_reads():
    for device, in_graph in (("cuda", True), ("meta", True), ("cpu", False), ("mps", False)):
        assert checks.in_graph(types.SimpleNamespace(device=torch.device(device))) is in_graph, device
    x = torch.ones(3, device=META)
    for read in (lambda: x[0].item(), lambda: bool(x[0]), lambda: int(x[0]), lambda: x.tolist(), x.nonzero, x.cpu):
        with pytest.raises((RuntimeError, NotImplementedError)):
            read()


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_route_checks_without_reading_values(case, training):
    sizes, backend = CASES[case]
    r = meta_logits(32, 64, grad=True)
    out = probmoe.route(r, **sizes, training=training, backend=backend, validate_args=True)
    assert out.weights.device == META and out.indices.shape == (32, 8)
    (out.weights * torch.ones_like(out.weights)).sum().backward()
    assert r.grad.shape == r.shape
    assert out.marginals.shape == (32, 64)


@pytest.mark.parametrize("method", ["topk-marginal", "sample-dense-ste"])
def test_route_ablations_check_without_reading_values(method):
    out = probmoe.route(meta_logits(8, 64, grad=True), k=8, method=method, training=True, validate_args=True)
    out.weights.sum().backward()


@pytest.mark.parametrize("case", CASES, ids=str)
def test_distribution_queries_check_without_reading_values(case):
    sizes, backend = CASES[case]
    d = probmoe.SubsetDistribution(meta_logits(2, 16, 64), **sizes, backend=backend, validate_args=True)
    for value in (d.mean, d.variance, d.mode, d.log_partition, d.cardinality_probs, d.entropy()):
        assert value.device == META
    z = d.sample((3,))
    assert z.shape == (3, 2, 16, 64) and d.log_prob(z).shape == (3, 2, 16)
    assert d.mean_and_sample()[1].shape == d.mean_tangent(sample=True)[0].shape == (2, 16, 64)
    assert d.chosen_scores()[0].shape == (2, 16, 8)
    with pytest.raises(ValueError, match="value must have a shape that broadcasts with"):
        d.log_prob(torch.zeros(5, 64, device=META))


EVALUATORS = [(K8, "circuit"), (R48, "circuit"), (GROUPS, "circuit"), (K8, "dp"), (R48, "dp")]


@pytest.mark.parametrize("spec,algorithm", EVALUATORS, ids=lambda x: getattr(x, "describe", lambda: x)())
def test_evaluator_queries_check_without_reading_values(spec, algorithm):
    e = circuits.engine(spec, META, algorithm)
    assert e.validate
    r = meta_logits(2, 16, 64)
    assert e.log_partition(r).shape == (2, 16)
    for query in (e.marginals, e.sample, e.map):
        assert query(r).shape == r.shape
    assert e.marginals_and_sample(r)[1].shape == r.shape
    assert e.chosen_scores(r.reshape(32, 64), slots=8)[0].shape == (32, 8)
    if algorithm == "circuit":
        e.check_satisfiable(r)
    else:
        assert e.log_counts(r).shape[:2] == (2, 16)


@pytest.mark.parametrize("train", [True, False])
def test_the_router_module_checks_without_reading_values(train):
    router = probmoe.ProbMoERouter(32, 64, k=8, device=META, validate_args=True).train(train)
    logits, weights, indices = router(torch.empty(4, 5, 32, device=META))
    assert logits.shape == (20, 64) and weights.shape == indices.shape == (20, 8)
    weights.sum().backward()
    assert router.weight.grad.device == META


@pytest.mark.parametrize(
    "family,method", [("olmoe", "probmoe"), ("qwen3_moe", "probmoe-dynamic"), ("deepseek_v3", "probmoe")]
)
def test_the_patched_gate_routes_without_reading_values(family, method):
    pytest.importorskip("transformers", minversion="5.0")
    import probmoe.integrations.transformers as pt
    from probmoe.integrations.transformers.testing import tiny_model

    model = pt.patch_model(tiny_model(family), method)
    for block in model.probmoe_family.blocks(model):
        gate = block.gate.to(META)
        for train in (True, False):
            logits, weights, indices = gate.train(train)(torch.empty(2, 3, 64, device=META))
            assert weights.device == indices.device == META and logits.shape[0] == 6


def test_the_host_branch_would_be_caught(monkeypatch):
    """The detector: the CPU's branch (a host read) forced on meta logits raises."""
    monkeypatch.setattr(checks, "IN_GRAPH_DEVICES", ("cuda",))
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        probmoe.route(meta_logits(4, 64), k=8, training=True, validate_args=True)
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        circuits.engine(K8, META, "dp").marginals(meta_logits(4, 64))


BAD = {
    "NaN": (float("nan"), "logits contain NaN"),
    "+inf": (float("inf"), r"logits contain \+inf"),
    "3e38": (3e38, r"logits must be -inf or finite with \|logits\| < 1e\+20"),
    "-3e38": (-3e38, r"logits must be -inf or finite with \|logits\| < 1e\+20"),
}


@pytest.mark.parametrize("bad", BAD, ids=str)
def test_the_in_graph_branch_rejects_bad_logits(bad, monkeypatch):
    """The CUDA branch run on the CPU (``_assert_async`` raises there at once, a RuntimeError with
    the message; on CUDA the same assertion is a device-side assert)."""
    monkeypatch.setattr(checks, "IN_GRAPH_DEVICES", ("cuda", "meta", "cpu"))
    value, message = BAD[bad]
    r = torch.randn(4, 64)
    r[2, 5] = value
    calls = [
        lambda: probmoe.route(r, k=8, training=True),
        lambda: probmoe.route(r, k=8, training=False, backend="dp"),
        lambda: circuits.engine(R48, "cpu", "circuit").marginals(r),
        lambda: circuits.engine(R48, "cpu", "dp").sample(r),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match=message):
            call()
    r = torch.randn(4, 64)
    r[1, 3:] = -torch.inf  # 3 experts left, kmin = 4
    for call in calls[2:]:
        with pytest.raises(RuntimeError, match="kmin = 4|unsatisfiable"):
            call()
    with pytest.raises(RuntimeError, match="fewer than kmin = 4"):
        probmoe.route(r, kmin=4, kmax=8, training=True)


@pytest.mark.parametrize("value", [3e38, -3e38, 1e20], ids=str)
def test_huge_logits_are_one_line_errors_not_unsatisfiable(value):
    """Issue 48, point 8: 3e38 overflowed the fp32 passes and the circuit called the row
    unsatisfiable (the DP returned log Z = inf): every evaluator and query now names the logits
    and the allowed magnitude, and the value found."""
    r = torch.randn(3, 64)
    r[1] = value  # every logit of the row: the passes' sums overflow
    want = rf"^logits must be -inf or finite with \|logits\| < 1e\+20, got {re.escape(f'{value:g}')}$"
    for spec, algorithm in EVALUATORS:
        e = circuits.engine(spec, "cpu", algorithm)
        for query in (e.log_partition, e.marginals, e.sample, e.map, lambda x: e.chosen_scores(x, slots=8)):
            with pytest.raises(ValueError, match=want):
                query(r)
    for backend in ("circuit", "dp"):
        with pytest.raises(ValueError, match=want):
            probmoe.route(r, k=8, training=True, backend=backend)


def test_the_largest_allowed_logits_stay_finite():
    r = torch.randn(4, 64)
    r[1], r[2] = 9.9e19, -9.9e19
    r[3, :5], r[3, 5:] = 9.9e19, -9.9e19
    for spec, algorithm in EVALUATORS:
        e = circuits.engine(spec, "cpu", algorithm)
        for out in (e.log_partition(r), e.marginals(r), e.sample(r), e.map(r), e.chosen_scores(r, slots=8)[0]):
            assert torch.isfinite(out).all(), (spec, algorithm)


def test_cpu_messages_are_unchanged():
    r = torch.randn(2, 8)
    r[1, 0] = float("nan")
    for call in (
        lambda: probmoe.route(r, k=2, training=True),
        lambda: circuits.engine(circuits.ExactlyK(8, 2), "cpu", "dp").marginals(r),
        lambda: circuits.engine(circuits.ExactlyK(8, 2), "cpu", "circuit").marginals(r),
    ):
        with pytest.raises(ValueError, match="^logits contain NaN$"):
            call()
    r = torch.randn(2, 8)
    r[1, 2:] = -torch.inf
    with pytest.raises(ValueError, match=r"logits at row \(1,\) have only 2 experts above -inf, but kmin = 3"):
        probmoe.route(r, kmin=3, kmax=4, training=True)
    with pytest.raises(ValueError, match="unsatisfiable at row 1.*at least 3"):
        circuits.engine(circuits.RangeK(8, 3, 4), "cpu", "circuit").marginals(r)
