"""One word per concept (issue 47): the training ``estimator`` and the exact ``algorithm``; their old
names ``method`` and ``backend`` still work everywhere they were accepted, with a
DeprecationWarning, and files read from disk take the old keys silently."""

import dataclasses
import warnings

import pytest
import torch

import probmoe
from probmoe import RoutingConfig


def _logits(seed=0):
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(seed), requires_grad=True)


def test_config_takes_the_old_words_with_a_warning():
    new = RoutingConfig(8, k=2, estimator="topk-marginal", algorithm="dp")
    with pytest.warns(DeprecationWarning, match=r"method= is deprecated, use estimator="):
        old = RoutingConfig(8, k=2, method="topk-marginal", backend="dp")
    assert old == new and (old.estimator, old.algorithm) == ("topk-marginal", "dp")
    with pytest.warns(DeprecationWarning, match=r"RoutingConfig.backend is deprecated, use .algorithm"):
        assert new.backend == "dp"
    with pytest.warns(DeprecationWarning, match=r"RoutingConfig.method is deprecated, use .estimator"):
        assert new.method == "topk-marginal"


def test_config_refuses_both_words_and_unknown_keywords():
    with pytest.raises(ValueError, match="give estimator= only"):
        RoutingConfig(8, k=2, estimator="probmoe", method="probmoe")
    with pytest.raises(ValueError, match="method must be one of"), pytest.warns(DeprecationWarning):
        RoutingConfig(8, k=2, method="dense")  # named as the caller named it
    with pytest.raises(TypeError, match="unexpected keyword argument 'estimtor'"):
        RoutingConfig(8, k=2, estimtor="probmoe")
    with pytest.raises(ValueError, match="estimator must be one of"):
        RoutingConfig(8, k=2, estimator="remoe")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        RoutingConfig(8, k=2, algorithm="c")


def test_the_renamed_fields_have_no_class_default():
    """dynamo before torch 2.13 builds a frozen dataclass by passing every field's class default as
    a keyword, so a default "circuit" for algorithm would meet backend= as both words given (a
    compiled route with backend= failed on torch 2.11): the defaults live in ``__init__`` alone."""
    fields = {f.name: f for f in dataclasses.fields(RoutingConfig)}
    for name in ("estimator", "algorithm"):
        assert fields[name].default is dataclasses.MISSING and fields[name].default_factory is dataclasses.MISSING
    assert (RoutingConfig(8, k=2).estimator, RoutingConfig(8, k=2).algorithm) == ("probmoe", "circuit")


def test_dicts_write_the_new_words_and_read_the_old_ones_silently():
    config = RoutingConfig(8, kmin=1, kmax=4, estimator="sample-dense-ste", algorithm="dp")
    data = config.to_dict()
    assert data["estimator"] == "sample-dense-ste" and data["algorithm"] == "dp"
    assert "method" not in data and "backend" not in data
    old = {("method" if k == "estimator" else "backend" if k == "algorithm" else k): v for k, v in data.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RoutingConfig.from_dict(old) == RoutingConfig.from_dict(data) == config
    with pytest.raises(ValueError, match="'method' is the old name of 'estimator'"):
        RoutingConfig.from_dict({**data, "method": "probmoe"})


@pytest.mark.parametrize("training", [True, False])
def test_route_and_the_router_take_the_old_words(training):
    r = _logits()
    new = probmoe.route(
        r, k=2, training=training, estimator="topk-marginal", algorithm="dp", generator=torch.Generator().manual_seed(1)
    )
    with pytest.warns(DeprecationWarning, match="backend= is deprecated, use algorithm="):
        old = probmoe.route(
            r, k=2, training=training, method="topk-marginal", backend="dp", generator=torch.Generator().manual_seed(1)
        )
    assert torch.equal(old.indices, new.indices) and torch.equal(old.weights, new.weights)
    assert old.config == new.config
    with pytest.warns(DeprecationWarning, match="method= is deprecated"):
        router = probmoe.ProbMoERouter(4, 8, k=2, method="topk-marginal")
    assert router.config.estimator == "topk-marginal"
    assert "estimator='topk-marginal', algorithm='circuit'" in router.extra_repr()


def test_distribution_takes_the_old_word():
    r = _logits().detach()
    with pytest.warns(DeprecationWarning, match="backend= is deprecated, use algorithm="):
        old = probmoe.SubsetDistribution(r, k=2, backend="dp")
    new = probmoe.SubsetDistribution(r, k=2, algorithm="dp")
    assert new.algorithm == "dp" and torch.equal(old.mean, new.mean)
    with pytest.warns(DeprecationWarning, match="SubsetDistribution.backend is deprecated"):
        assert new.backend == "dp"
    assert "algorithm='dp'" in repr(new)


def test_the_warning_points_at_the_caller():
    with pytest.warns(DeprecationWarning) as record:
        probmoe.route(_logits(), k=2, training=False, backend="dp")
    assert record[0].filename == __file__


def test_scale_out_routers_take_the_old_words():
    pytest.importorskip("triton")  # torchtitan imports it, also on CPU
    titan = pytest.importorskip("probmoe.integrations.torchtitan", exc_type=ImportError)
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.moe import TokenChoiceTopKRouter

    base = TokenChoiceTopKRouter.Config(num_experts=8, gate=Linear.Config(in_features=4, out_features=8), top_k=2)
    with pytest.warns(DeprecationWarning, match="method= is deprecated"):
        cfg = titan.use_probmoe(base, method="topk-marginal", backend="dp")
    config = titan.router.routing_config(cfg)
    assert (config.k, config.estimator, config.algorithm) == (2, "topk-marginal", "dp")
    with pytest.raises(ValueError, match="method must be one of"), pytest.warns(DeprecationWarning):
        titan.use_probmoe(base, method="dense")


def test_old_constant_names_are_the_new_ones():
    assert probmoe.METHODS is probmoe.ESTIMATORS == ("probmoe", "topk-marginal", "sample-dense-ste")
    assert probmoe.BACKENDS is probmoe.ALGORITHMS == ("circuit", "dp")
