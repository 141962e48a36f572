"""RoutingConfig (validated once, round-trips through a dict) and GeneratorReplay (checkpoint)."""

import json

import pytest
import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

import probmoe
from probmoe import RoutingConfig
from probmoe.replay import GeneratorReplay, in_backward


def test_resolves_sizes_and_defaults():
    c = RoutingConfig(64, k=8)
    assert (c.kmin, c.kmax, c.k, c.exact_k) == (8, 8, 8, True)
    assert (c.method, c.backend, c.grad, c.normalize) == ("probmoe", "circuit", "exact", False)
    d = RoutingConfig(64, kmax=8)
    assert (d.kmin, d.kmax, d.k, d.exact_k) == (1, 8, None, False)
    assert RoutingConfig(64, kmin=4).kmax == 64
    assert c.describe() == "k=8" and d.describe() == "kmin=1, kmax=8"


@pytest.mark.parametrize(
    "config",
    [
        RoutingConfig(64, k=8),
        RoutingConfig(64, kmin=4, kmax=8, method="topk-marginal", backend="dp"),
        RoutingConfig(3, k=3, grad="paper", normalize=True),
    ],
)
def test_round_trips_through_json(config):
    assert RoutingConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(num_experts=0, k=1), r"num_experts must be in \[1, "),
        (dict(num_experts=8, k=9), r"k must be in \[1, 8\]"),
        (dict(num_experts=8, k=0), r"k must be in \[1, 8\]"),
        (dict(num_experts=8), "pass k"),
        (dict(num_experts=8, k=2, kmax=4), "either k"),
        (dict(num_experts=8, kmin=5, kmax=4), "kmin must be <= kmax"),
        (dict(num_experts=8, k=2.0), "k must be an integer"),
        (dict(num_experts=8, k=2, method="dense"), "method must be one of"),
        (dict(num_experts=8, k=2, backend="gpu"), "backend must be one of"),
        (dict(num_experts=8, k=2, grad="simple"), "grad must be one of"),
        (dict(num_experts=8, k=2, normalize=1), "normalize must be True or False"),
        (dict(num_experts=8, k=9, kmin=9, kmax=9), r"k must be in \[1, 8\]"),  # a tampered to_dict
    ],
)
def test_bad_fields(fields, match):
    with pytest.raises(ValueError, match=match):
        RoutingConfig(**fields)
    with pytest.raises(ValueError, match=match):
        RoutingConfig.from_dict(fields)


@pytest.mark.parametrize(
    "data, match",
    [
        ([8, 2], "must be a dict"),
        ({"num_experts": 8, "k": 2, "top_k": 2}, r"unknown routing config keys \['top_k'\]"),
        ({"k": 2}, "needs num_experts"),
    ],
)
def test_from_dict_trusts_nothing(data, match):
    with pytest.raises(ValueError, match=match):
        RoutingConfig.from_dict(data)


def test_route_and_router_take_a_config():
    torch.manual_seed(0)
    r = torch.randn(50, 8)
    config = RoutingConfig(8, kmin=1, kmax=3, normalize=True)
    a = probmoe.route(r, config, training=True, generator=torch.Generator().manual_seed(1))
    b = probmoe.route(r, kmin=1, kmax=3, normalize=True, training=True, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights) and a.config == config
    router = probmoe.ProbMoERouter(16, 8, config=config)
    assert router.config is config and router.top_k == 3
    assert probmoe.ProbMoERouter(16, 8, kmin=1, kmax=3, normalize=True).config == config
    with pytest.raises(ValueError, match="either config or its fields"):
        probmoe.route(r, config, k=2, training=True)
    with pytest.raises(ValueError, match="either config or its fields"):
        probmoe.ProbMoERouter(16, 8, config=config, method="probmoe")
    with pytest.raises(ValueError, match="config.num_experts = 8, but there are 6 experts"):
        probmoe.route(r[:, :6], config, training=True)
    with pytest.raises(ValueError, match="config must be a probmoe.RoutingConfig"):
        probmoe.route(r, {"num_experts": 8, "k": 2}, training=True)


def test_distribution_from_config():
    r = torch.randn(5, 8, dtype=torch.float64)
    d = probmoe.SubsetDistribution.from_config(r, RoutingConfig(8, kmin=2, kmax=4, backend="dp", grad="paper"))
    want = probmoe.SubsetDistribution(r, kmin=2, kmax=4, backend="dp", grad="paper")
    assert (d.kmin, d.kmax, d.backend, d.grad) == (2, 4, "dp", "paper")
    torch.testing.assert_close(d.mean, want.mean)
    with pytest.raises(ValueError, match="logits have N = 8 experts but config.num_experts = 6"):
        probmoe.SubsetDistribution.from_config(r, RoutingConfig(6, k=2))


def test_replay_outside_backward_uses_the_generator():
    replay, gen = GeneratorReplay(depth=3), torch.Generator().manual_seed(0)
    assert not in_backward()
    for _ in range(5):
        torch.manual_seed(7)  # the same key every time, but no backward: never a replay
        assert replay.generator(gen) is gen
        torch.rand(1, generator=gen)
    assert len(replay) == 1
    for _ in range(5):
        replay.generator(gen)
    assert len(replay) == 3  # only the last `depth` states are kept


def test_replay_inside_backward_returns_the_saved_state():
    """A call inside a backward whose global RNG state matches an earlier forward's gets a copy
    of the generator in that forward's state (what checkpoint recomputation needs)."""
    replay, gen = GeneratorReplay(), torch.Generator().manual_seed(0)
    torch.manual_seed(5)
    assert replay.generator(gen) is gen
    first = torch.rand(4, generator=gen)
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(in_backward())
            torch.manual_seed(5)
            got = replay.generator(gen)
            seen.append((got is not gen, torch.equal(torch.rand(4, generator=got), first)))
            return g

    Probe.apply(torch.ones(1, requires_grad=True)).sum().backward()
    assert seen == [True, (True, True)]


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_replay_under_checkpoint_draws_the_same_subsets(use_reentrant):
    """(test_router.py checks the gradients with checkpoint's default early stop.)"""
    router = probmoe.ProbMoERouter(16, 8, kmin=1, kmax=3, generator=torch.Generator().manual_seed(3))
    h = torch.randn(64, 16, requires_grad=True)
    with set_checkpoint_early_stop(False):
        y = checkpoint(lambda x: router(x)[1].sum(), h, use_reentrant=use_reentrant)
    first = router.last_routing
    with set_checkpoint_early_stop(False):  # recompute the whole forward, to the last line
        y.backward()  # recomputes the forward, which sets last_routing again
    assert router.last_routing is not first
    assert torch.equal(router.last_routing.selected(), first.selected())
