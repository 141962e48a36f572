"""Structured routing constraints: SubsetDistribution, route and ProbMoERouter with any compiled circuit
(group-limited, capacity-limited, a CNF) against brute force; errors; the config's dict form."""

import itertools
import json

import pytest
import torch
from brute import exact
from brute import group_models as models
from brute import satisfies_groups as satisfies
from stats import chi2_pvalue, mask_counts

import circuits
import probmoe
from circuits import GroupCapacity, GroupLimited
from probmoe import RoutingConfig, SubsetDistribution

# (x1 or x2) and (not x1 or x3) and (not x4 or not x5): a CNF over 6 variables, subsets of 1..5
CLAUSES = [[1, 2], [-1, 3], [-4, -5]]


def cnf_constraint(tmp_path):
    path = tmp_path / "c.cnf"
    path.write_text(f"p cnf 6 {len(CLAUSES)}\n" + "".join(" ".join(map(str, c)) + " 0\n" for c in CLAUSES))
    rows = torch.tensor(list(itertools.product((0.0, 1.0), repeat=6)), dtype=torch.float64)
    ok = torch.stack([torch.stack([(rows[:, abs(x) - 1] == 1) == (x > 0) for x in c]).any(0) for c in CLAUSES]).all(0)
    return circuits.compile_circuit(path, cache_dir=tmp_path / "cache"), rows[ok]


SPECS = [
    GroupLimited(8, 3, 4, 2),
    GroupCapacity(9, 4, [3, 3, 3], 2),
    GroupLimited(10, None, [2, 3, 5], 2, capacity=2, kmin=1, kmax=4),
]


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("grad", ["exact", "paper"])
def test_distribution_matches_brute_force(spec, grad, float64):
    allowed = models(spec)
    r = torch.randn(5, spec.n, generator=torch.Generator().manual_seed(2)) * 1.5
    d = SubsetDistribution(r, constraint=spec, grad=grad)
    want = exact(r, allowed)
    assert (d.kmin, d.kmax, d.k) == (spec.kmin, spec.kmax, spec.k)
    torch.testing.assert_close(d.log_partition, want.log_partition, atol=1e-9, rtol=0)
    torch.testing.assert_close(d.mean, want.marginals, atol=1e-9, rtol=0)
    assert torch.equal(d.mode, want.map)
    torch.testing.assert_close(d.log_prob(allowed[:, None]), (want.probs.T).log(), atol=1e-9, rtol=0)
    entropy = -(want.probs * want.probs.log()).sum(-1)
    torch.testing.assert_close(d.entropy(), entropy, atol=1e-9, rtol=0)
    sizes = allowed.sum(-1).long()
    card = torch.stack([want.probs[:, sizes == j].sum(-1) for j in range(spec.kmin, spec.kmax + 1)], -1)
    torch.testing.assert_close(d.cardinality_probs, card, atol=1e-9, rtol=0)
    # the Jacobian of the marginals: Cov(z), or Cov(z) diag(1 - p) for grad="paper"
    x = r[0].clone().requires_grad_()
    jac = torch.autograd.functional.jacobian(lambda v: SubsetDistribution(v, constraint=spec, grad=grad).mean, x)
    cov = exact(r[:1], allowed).cov[0]
    torch.testing.assert_close(jac, cov if grad == "exact" else cov * torch.sigmoid(-r[0]), atol=1e-9, rtol=0)
    # the support: allowed masks pass, others do not
    every = torch.tensor(list(itertools.product((0.0, 1.0), repeat=spec.n)))
    assert torch.equal(d.support.check(every), satisfies(every, spec))


def test_samples_chi_squared():
    spec = SPECS[2]
    r = torch.randn(spec.n, generator=torch.Generator().manual_seed(4)) - 0.5
    d = SubsetDistribution(r.float(), constraint=spec)
    draws = d.sample((50_000,), generator=torch.Generator().manual_seed(5))
    allowed = models(spec)
    probs = exact(r[None].double(), allowed).probs[0]
    assert chi2_pvalue(mask_counts(draws, allowed), probs) > 1e-3


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_route_training_is_eq7_with_the_constraint(spec, float64):
    """The drawn subsets are allowed; the weights are softmax at the drawn experts (value) and their
    gradient is that of (z - m).detach() + m) * softmax(r) with brute-force marginals."""
    allowed = models(spec)
    r = (torch.randn(64, spec.n, generator=torch.Generator().manual_seed(6)) * 2).requires_grad_()
    out = probmoe.route(r, constraint=spec, training=True, generator=torch.Generator().manual_seed(7))
    assert out.indices.shape == out.weights.shape == out.mask.shape == (64, spec.kmax)
    chosen = out.selected()
    assert bool(satisfies(chosen, spec).all()) and torch.equal(out.counts, chosen.sum(-1))
    probs = torch.softmax(r, -1)
    torch.testing.assert_close(out.weights, torch.where(out.mask, probs.gather(-1, out.indices), 0.0))
    v = torch.randn(64, spec.kmax, generator=torch.Generator().manual_seed(8))
    (got,) = torch.autograd.grad((out.weights * v).sum(), r)
    m = exact(r, allowed).marginals  # differentiable in r
    z = chosen.double()
    w = ((z - m).detach() + m) * probs
    (want,) = torch.autograd.grad((w.gather(-1, out.indices) * torch.where(out.mask, v, 0.0)).sum(), r)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)


def test_route_eval_takes_the_circuits_map_not_top_k():
    spec = GroupLimited(16, 4, 4, 1)  # 4 experts, all from one group of 4
    r = torch.randn(300, 16, generator=torch.Generator().manual_seed(9))
    out = probmoe.route(r, constraint=spec, training=False)
    brute = torch.zeros_like(r)
    best = r.view(300, 4, 4).sum(-1).argmax(-1)  # the whole group with the largest sum of logits
    brute.view(300, 4, 4)[torch.arange(300), best] = 1.0
    assert torch.equal(out.selected().float(), brute)
    topk = torch.zeros_like(r).scatter_(-1, r.topk(4).indices, 1.0)
    assert not torch.equal(topk, brute)  # top-k is not the MAP here
    assert torch.equal(out.mask, torch.ones(300, 4, dtype=torch.bool))
    d = probmoe.route(r, constraint=spec, training=True, method="topk-marginal")  # MAP forward
    assert torch.equal(d.selected().float(), brute)


def test_range_constraint_slots_and_map():
    spec = GroupCapacity(12, None, 4, 2, kmin=2, kmax=5)  # 3 groups of 4, at most 2 per group
    r = torch.randn(400, 12, generator=torch.Generator().manual_seed(10)) - 0.3
    out = probmoe.route(r, constraint=spec, training=False)
    assert out.indices.shape == (400, 5) and out.config.kmax == 5 and out.config.kmin == 2
    allowed = models(spec)
    want = allowed[(r.double() @ allowed.T).argmax(-1)]  # the MAP: the largest sum of logits
    assert torch.equal(out.selected().double(), want)
    assert set(out.counts.tolist()) >= {2, 5}
    unused = ~out.mask
    assert (out.indices.sort(dim=-1).values.diff(dim=-1) > 0).all()  # the contract: distinct, unused ones too
    assert bool((out.weights[unused] == 0).all())


@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_extreme_logits_never_violate(scale):
    spec = GroupLimited(64, 8, 8, 2, capacity=5)
    r = torch.randn(1024, 64, generator=torch.Generator().manual_seed(11)) * scale
    r[::4, 16:24] = -torch.inf
    r[1::4, ::3] = -torch.inf
    r.requires_grad_()
    for training in (True, False):
        out = probmoe.route(r, constraint=spec, training=training)
        chosen = out.selected()
        assert bool(satisfies(chosen, spec).all()) and not chosen[r.detach() == -torch.inf].any()
        assert bool(torch.isfinite(out.weights).all())
    out.weights.sum().backward()
    assert bool(torch.isfinite(r.grad).all())


def test_sigmoid_scores_and_normalize():
    spec = GroupLimited(32, 4, 8, 2)
    r = torch.randn(50, 32, generator=torch.Generator().manual_seed(12)).requires_grad_()
    out = probmoe.route(r, constraint=spec, scores="sigmoid", normalize=True, training=True)
    p = torch.sigmoid(r).gather(-1, out.indices)
    torch.testing.assert_close(out.weights, p / p.sum(-1, keepdim=True))
    torch.testing.assert_close(out.probs, torch.sigmoid(r))
    plain = probmoe.route(r, k=4, scores="sigmoid", training=False)  # exactly-k eval: top-k of sigmoid(r)
    torch.testing.assert_close(plain.weights, torch.sigmoid(r).topk(4).values)


def test_router_with_a_constraint():
    spec = GroupLimited(16, 4, 4, 2)
    router = probmoe.ProbMoERouter(8, 16, constraint=spec, scores="sigmoid")
    assert router.top_k == 4 and router.config.constraint == spec and "GroupLimited" in repr(router)
    h = torch.randn(3, 5, 8)
    router.eval()
    logits, w, idx = router(h)
    assert logits.shape == (15, 16) and w.shape == idx.shape == (15, 4)
    assert torch.equal(router.last_routing.selected().float(), circuits.compile_circuit(spec).map(logits))
    router.train()
    logits, w, idx = router(h)
    w.sum().backward()
    assert router.weight.grad.abs().sum() > 0
    assert bool(satisfies(router.last_routing.selected(), spec).all())


def test_any_compiled_circuit(tmp_path):
    c, allowed = cnf_constraint(tmp_path)
    c.validate = True
    config = RoutingConfig(6, constraint=c)
    assert config.constraint is c and (config.kmin, config.kmax) == (1, 5)  # the CNF's smallest and largest models
    r = torch.randn(200, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(13))
    out = probmoe.route(r, config, training=False)
    assert torch.equal(out.selected().double(), allowed[(r @ allowed.T).argmax(-1)])
    drawn = probmoe.route(r, config, training=True).selected().double()
    mask_counts(drawn, allowed)  # asserts that every draw is a model of the CNF
    assert c.validate and c.device == torch.device("cpu")  # the user's circuit is left as it was
    d = SubsetDistribution(r, constraint=c)
    torch.testing.assert_close(d.mean, exact(r, allowed).marginals, atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="cardinality_probs needs a constraint spec"):
        _ = d.cardinality_probs
    with pytest.raises(ValueError, match="cannot be written to a dict"):
        config.to_dict()
    # a compiled group circuit is kept as its spec, which has a dict form
    g = RoutingConfig(16, constraint=circuits.compile_circuit(GroupLimited(16, 4, 4, 2)))
    assert g.constraint == GroupLimited(16, 4, 4, 2)


@pytest.mark.parametrize(
    "config",
    [
        RoutingConfig(64, constraint=GroupLimited(64, 8, 8, 4)),
        RoutingConfig(
            64,
            constraint=GroupCapacity(64, None, [8] * 4 + [16] * 2, 3, kmin=2, kmax=8),
            scores="sigmoid",
            normalize=True,
            grad="paper",
            method="topk-marginal",
        ),
        RoutingConfig(64, constraint=GroupLimited(64, 8, 8, 4, capacity=3)),
    ],
    ids=str,
)
def test_config_round_trips_through_json(config):
    data = json.loads(json.dumps(config.to_dict()))
    assert RoutingConfig.from_dict(data) == config
    assert data["constraint"]["type"] in ("GroupLimited", "GroupCapacity")


def test_cardinality_specs_become_sizes():
    assert RoutingConfig(64, constraint=circuits.ExactlyK(64, 8)) == RoutingConfig(64, k=8)
    assert RoutingConfig(64, constraint=circuits.RangeK(64, 2, 8), backend="dp") == RoutingConfig(
        64, kmin=2, kmax=8, backend="dp"
    )
    assert RoutingConfig(64, k=8, constraint=GroupLimited(64, 8, 8, 4)).k == 8  # agreeing sizes are fine


BAD = [
    (dict(num_experts=32, constraint=GroupLimited(64, 8, 8, 4)), "over n = 64 variables, but there are N = 32"),
    (dict(num_experts=64, constraint=GroupLimited(64, 8, 8, 4), k=4), "k = 4 disagrees with constraint"),
    (dict(num_experts=64, constraint=GroupLimited(64, 8, 8, 4), kmax=9), "kmax = 9 disagrees"),
    (dict(num_experts=64, constraint=GroupLimited(64, None, 8, 4, kmax=4)), "allows subsets of 0 experts"),
    (dict(num_experts=64, constraint="groups"), "constraint must be a circuits.Circuit or a spec"),
    (dict(num_experts=64, constraint=GroupLimited(64, 8, 8, 4), scores="relu"), "scores must be one of"),
]


@pytest.mark.parametrize("fields,match", BAD)
def test_bad_configs(fields, match):
    with pytest.raises(ValueError, match=match):
        RoutingConfig(**fields)


def test_bad_inputs_elsewhere(tmp_path):
    c, _ = cnf_constraint(tmp_path)
    with pytest.raises(ValueError, match="circuit over 6 variables, but there are N = 8"):
        probmoe.route(torch.randn(4, 8), constraint=c, training=True)
    with pytest.raises(ValueError, match="algorithm 'dp' handles k, kmin/kmax, GroupLimited and GroupCapacity; "):
        SubsetDistribution(torch.randn(4, 6), constraint=c, algorithm="dp")
    with pytest.raises(ValueError, match="constraint CnfFile.* needs algorithm 'circuit'"):
        probmoe.RoutingConfig(6, constraint=c.spec, algorithm="dp")
    with pytest.raises(ValueError, match="k = 3 disagrees"):
        SubsetDistribution(torch.randn(4, 16), 3, constraint=GroupLimited(16, 4, 4, 2))
    r = torch.randn(5, 16)
    r[3] = -torch.inf
    r[3, [0, 1]] = 0.0  # 2 experts above -inf: fewer than 4
    with pytest.raises(ValueError, match=r"row \(3,\) have only 2 experts above -inf"):
        probmoe.route(r, constraint=GroupLimited(16, 4, 4, 2), training=True)
    r[3] = -torch.inf
    r[3, [0, 4, 8, 12]] = 0.0  # 4 experts, one per group: 4 of them need 4 groups, only 2 allowed
    with pytest.raises(ValueError, match="unsatisfiable at row 3: no subset of its 4 finite logits satisfies it"):
        probmoe.route(r, constraint=GroupLimited(16, 4, 4, 2), training=True)
    probmoe.route(r, constraint=GroupLimited(16, 4, 4, 4), training=True)  # feasible with 4 groups
    config = RoutingConfig(16, constraint=GroupLimited(16, 4, 4, 2))
    for data, match in [
        ({**config.to_dict(), "constraint": {"type": "GroupLimited"}}, "constraint: a GroupLimited"),
        (
            {**config.to_dict(), "constraint": {**config.to_dict()["constraint"], "n": 8}},
            "constraint: groups must sum to n = 8",
        ),
        ({**config.to_dict(), "k": 5, "kmin": 5, "kmax": 5}, "k = 5 disagrees"),
    ]:
        with pytest.raises(ValueError, match=match):
            RoutingConfig.from_dict(data)


def test_normalized_weights_stay_finite_when_every_used_score_underflows():
    r = torch.tensor([[100.0, -1000, -1000, -1000, -100, -100, -100, -100]])
    out = probmoe.route(r, constraint=circuits.GroupLimited(8, 4, 2, 1), training=False, normalize=True)
    assert torch.equal(out.weights, torch.zeros(1, 4))  # the MAP excludes the argmax: softmax 0 there
    out = probmoe.route(torch.full((1, 8), -120.0), k=3, scores="sigmoid", training=False, normalize=True)
    assert torch.equal(out.weights, torch.zeros(1, 3))
    r = torch.full((2, 8), -120.0, requires_grad=True)
    out = probmoe.route(
        r,
        constraint=circuits.GroupLimited(8, 3, 4, 2),
        scores="sigmoid",
        training=True,
        normalize=True,
        generator=torch.Generator().manual_seed(0),
    )
    out.weights.sum().backward()
    assert torch.isfinite(out.weights).all() and torch.isfinite(r.grad).all()
