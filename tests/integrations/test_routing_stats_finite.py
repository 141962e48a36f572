"""Every logged routing statistic is a number or absent, never NaN (issue 42, point 4), for layers
that route no token: a ReMoE layer whose ReLU router sends no token anywhere, an aux-free layer
that saw no token in a step, and a batch whose tokens are all padding."""

import math

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

import probmoe.integrations.transformers as pt
from probmoe.experiments.trainer import routing_summary
from probmoe.integrations.transformers import losses
from probmoe.integrations.transformers.callback import RoutingStatsCallback
from probmoe.integrations.transformers.controls import after_step
from probmoe.integrations.transformers.model import patched_gates
from probmoe.integrations.transformers.testing import tiny_model


def all_numbers(stats: dict) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in stats.values())


class _State:
    log_history, global_step = [], 1


def logged(model, *forwards) -> dict:
    """What RoutingStatsCallback (per layer) and RoutingControlCallback's after_step log after ``forwards``."""
    callback = RoutingStatsCallback(per_layer=True)
    callback.on_train_begin(None, None, None, model=model)
    for ids, mask in forwards:
        model(ids, attention_mask=mask, labels=ids, output_router_logits=True)
    logs = {}
    callback.on_log(None, _State(), None, logs=logs)
    callback.on_train_end(None, None, None)
    logs.update(after_step(model))
    return logs


def test_remoe_layer_routing_no_token():
    model = pt.patch_model(tiny_model("olmoe"), "remoe", l1_coef=1e-3).train()
    with torch.no_grad():
        patched_gates(model)[1].weight.zero_()  # logits 0: ReLU 0, no expert for any token
    ids = torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    logs = logged(model, (ids, torch.ones_like(ids)))
    assert all_numbers(logs), logs
    assert "routing/layer1/load_cv" not in logs and "routing/layer1/max_vio" not in logs  # no balance to speak of
    assert logs["routing/layer1/experts_per_token"] == 0 and "routing/layer0/load_cv" in logs
    summary = routing_summary(model, torch.ones_like(ids))
    assert all(all_numbers({k: v for k, v in s.items() if k != "layer"}) for s in summary)
    assert "load_cv" not in summary[1] and summary[1]["experts_per_token"] == 0


def test_aux_free_layer_that_saw_no_token():
    """A step in which layer 1's router counted no token (its load all zero): balance_load_cv is
    the mean over the other layers, not NaN; with no token anywhere it is absent."""
    model = pt.patch_model(tiny_model("qwen3_moe"), "conventional", balance="aux-free").train()
    ids = torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    model(ids)
    patched_gates(model)[1].probmoe_load.zero_()
    out = after_step(model)
    assert all_numbers(out) and out["balance_load_cv"] > 0, out
    assert after_step(model) == {}  # no forward since: absent


def test_all_padding_batch():
    """Every token masked: the aux loss and z-loss are 0, and the statistics of that forward absent."""
    model = pt.patch_model(tiny_model("olmoe"), "probmoe", z_loss=1e-3).train()
    ids = torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    none = torch.zeros_like(ids)
    logs = logged(model, (ids, none))
    assert all_numbers(logs), logs
    logits = [torch.randn(16, 8)]
    assert float(losses.load_balancing_loss(logits, [torch.ones(16, 8, dtype=torch.bool)], none)) == 0.0
    assert float(losses.router_z_loss(logits, none)) == 0.0
    assert all(set(s) == {"layer"} for s in routing_summary(model, none))
