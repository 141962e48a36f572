"""Auxiliary-loss-free balancing (DeepSeek-V3): the bias enters the selection only, moves by
γ · sign(mean load − load) after each step, balances a router skewed to a few experts, and comes
back with a checkpoint and a probmoe-train resume."""

import json

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.balance import selection_bias
from probmoe.integrations.transformers.controls import after_step
from probmoe.integrations.transformers.model import patched_gates
from probmoe.integrations.transformers.testing import tiny_model


def ids(seed=0, shape=(4, 16)):
    return torch.randint(3, 256, shape, generator=torch.Generator().manual_seed(seed))


def skewed(model, offsets=(3.0, 3.0)):
    """Routers that prefer the first experts: their logits get ``offsets`` through a constant input
    feature (a pre-hook sets the router input's feature 0 to 1; the weight's column 0 holds the
    offsets, 0 for the others), so most tokens pick them."""

    def constant_feature(_, args):
        h = args[0].clone()
        h[..., 0] = 1.0
        return (h, *args[1:])

    for gate in patched_gates(model):
        with torch.no_grad():
            gate.weight[:, 0] = 0.0
            gate.weight[: len(offsets), 0] = torch.tensor(offsets)
        gate.register_forward_pre_hook(constant_feature)
    return model


def load_cv(model):
    cvs = []
    for s in pt.router_stats(model):
        load = s["expert_counts"].float()
        cvs.append(float(load.std(unbiased=False) / load.mean()))
    return sum(cvs) / len(cvs)


@pytest.mark.parametrize("method,offset,rate", [("conventional", 1.0, 0.005), ("probmoe", 3.0, 0.02)])
def test_load_cv_falls_with_aux_free_balancing_and_not_without(method, offset, rate):
    """From routers skewed to 2 of 8 experts, 50 steps (training forwards, no weight update, so only
    the bias can move the routing) bring the load's coefficient of variation below half its start
    with balance="aux-free"; without it the CV stays. (γ in the bias's units: softmax scores for
    top-k routing, logits for ProbMoE; a γ as large as the gap between the tokens' scores makes all
    tokens switch at once and the load swing.)"""
    cv = {}
    for balance in (None, "aux-free"):
        kwargs = {"balance": balance, "balance_rate": rate} if balance else {}
        model = skewed(
            pt.patch_model(tiny_model("olmoe"), method, generator=torch.Generator().manual_seed(0), **kwargs),
            (offset, offset),
        ).train()
        history = []
        for step in range(50):
            model(ids(step, (2, 16)))
            after_step(model)
            history.append(load_cv(model))
        cv[balance] = history
    assert cv[None][0] > 1.0 and cv["aux-free"][0] == pytest.approx(cv[None][0], rel=0.2)
    assert sum(cv["aux-free"][-5:]) / 5 < 0.5 * cv["aux-free"][0]
    assert sum(cv[None][-5:]) / 5 > 0.8 * cv[None][0]


def test_bias_update_rule_and_selection_only():
    """b_i moves by γ · sign(mean load − load_i) of the step's loads; the bias changes which
    experts are chosen but the weights stay the unbiased softmax at them."""
    model = pt.patch_model(tiny_model("olmoe"), "conventional", balance="aux-free", balance_rate=0.5).train()
    x = ids()
    model(x)
    loads = [g.probmoe_load.clone() for g in patched_gates(model)]
    assert all(float(load.sum()) == 2 * x.numel() for load in loads)  # top-2 of every token
    after_step(model)
    for gate, load in zip(patched_gates(model), loads):
        torch.testing.assert_close(gate.probmoe_bias, 0.5 * torch.sign(load.mean() - load), rtol=0, atol=0)
        assert float(gate.probmoe_load.sum()) == 0
    gate = patched_gates(model)[0]
    h = torch.randn(5, 64)
    with torch.no_grad():
        logits, weights, idx = gate(h)
        probs = torch.softmax(logits.float(), -1)
        assert torch.equal(idx, torch.topk(probs + gate.probmoe_bias, 2).indices)
        torch.testing.assert_close(weights.float(), probs.gather(-1, idx), rtol=0, atol=0)


def test_probmoe_bias_shifts_the_distribution_and_keeps_unbiased_weights():
    """ProbMoE with a bias: the subsets come from P(S) ∝ exp Σ (r + b), the weights are π(r) at S,
    and the router gradient is Eq. 7's through the shifted distribution's marginals."""
    import probmoe

    model = pt.patch_model(
        tiny_model("olmoe"), "probmoe", balance="aux-free", generator=torch.Generator().manual_seed(3)
    ).train()
    gate = patched_gates(model)[0]
    with torch.no_grad():
        gate.probmoe_bias.copy_(torch.tensor([4.0, -4.0, 0, 0, 0, 0, 0, 0]))
    h = torch.randn(400, 64, generator=torch.Generator().manual_seed(1))
    logits, weights, idx = gate(h)
    probs = torch.softmax(logits.float(), -1)
    torch.testing.assert_close(weights.float(), probs.gather(-1, idx), rtol=1e-6, atol=0)
    selected = torch.zeros(400, 8).scatter(1, idx, 1.0)
    assert selected[:, 0].mean() > 0.95 and selected[:, 1].mean() < 0.02  # the bias moved the draws
    # the gradient: that of (stopgrad(z - m) + m) ⊙ π(r), m the marginals at r + b
    w = gate.weight.detach().clone().requires_grad_(True)
    r = h @ w.T
    m = probmoe.SubsetDistribution(r + gate.probmoe_bias, k=2).mean
    z = selected
    want = ((z - m).detach() + m) * torch.softmax(r, -1)
    g_out = torch.randn(400, 2, generator=torch.Generator().manual_seed(2))
    (want.gather(-1, idx) * g_out).sum().backward()
    gate.weight.grad = None
    (weights * g_out).sum().backward()
    torch.testing.assert_close(gate.weight.grad, w.grad, rtol=1e-4, atol=1e-6)


def test_deepseek_v3_uses_its_own_bias_buffer():
    model = pt.patch_model(tiny_model("deepseek_v3"), "probmoe-grouped", balance="aux-free").train()
    x = ids()
    model(x, labels=x).loss.backward()
    after_step(model)
    gates = patched_gates(model)
    assert all(selection_bias(g) is g.e_score_correction_bias and "probmoe_bias" not in g._buffers for g in gates)
    assert all(g.e_score_correction_bias.abs().sum() > 0 for g in gates)
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in model.state_dict()


def test_bad_balance_arguments():
    with pytest.raises(ValueError, match="balance must be one of"):
        pt.patch_model(tiny_model("olmoe"), "probmoe", balance="loss-free")
    with pytest.raises(ValueError, match="balance_rate applies only with balance='aux-free'"):
        pt.patch_model(tiny_model("olmoe"), "probmoe", balance_rate=1e-3)
    with pytest.raises(ValueError, match="balance_rate must be a finite number > 0"):
        pt.patch_model(tiny_model("olmoe"), "probmoe", balance="aux-free", balance_rate=0.0)
    with pytest.raises(ValueError, match="has no top-k selection to bias"):
        pt.patch_model(tiny_model("olmoe"), "sparsemixer", balance="aux-free")


def test_bias_round_trips_through_a_checkpoint(tmp_path):
    model = pt.patch_model(tiny_model("qwen3_moe"), "conventional", balance="aux-free", balance_rate=0.1).train()
    x = ids()
    model(x, labels=x).loss.backward()
    after_step(model)
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / pt.SETTINGS_FILENAME).read_text())
    assert (data["options"]["balance"], data["options"]["balance_rate"]) == ("aux-free", 0.1)
    reloaded = pt.from_pretrained(tmp_path)
    assert reloaded.probmoe_plan == model.probmoe_plan
    for a, b in zip(patched_gates(model), patched_gates(reloaded)):
        assert a.probmoe_bias.abs().sum() > 0 and torch.equal(a.probmoe_bias, b.probmoe_bias)
    with torch.no_grad():
        assert torch.equal(reloaded.eval()(x).logits, model.eval()(x).logits)


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_probmoe_train_resume_keeps_the_bias(tmp_path):
    """probmoe-train --balance aux-free: stopped after 2 steps and resumed to 4, the bias and the
    losses are those of an uninterrupted run; the log holds the load's CV."""
    from gsm8k_data import write

    from probmoe.cli import train

    data = write(tmp_path, "train.jsonl", 8)

    def run(out, *extra):
        return train.main(
            [
                "--model",
                "tiny-olmoe",
                "--data",
                str(data),
                "--output-dir",
                str(out),
                "--batch-size",
                "2",
                "--no-progress",
                "--method",
                "probmoe",
                "--balance",
                "aux-free",
                "--balance-rate",
                "0.05",
                "--max-steps",
                "4",
                *map(str, extra),
            ]
        )

    assert run(tmp_path / "whole") == 0
    assert run(tmp_path / "parts", "--stop-after", 2) == 0
    assert run(tmp_path / "parts", "--resume", "latest") == 0
    logs = {
        n: [r for r in map(json.loads, open(tmp_path / n / "train_log.jsonl")) if "loss" in r]
        for n in ("whole", "parts")
    }
    assert [r["loss"] for r in logs["whole"]] == [r["loss"] for r in logs["parts"]]
    assert all("balance_load_cv" in r for r in logs["whole"])
    whole, parts = pt.from_pretrained(tmp_path / "whole"), pt.from_pretrained(tmp_path / "parts")
    for a, b in zip(patched_gates(whole), patched_gates(parts)):
        assert a.probmoe_bias.abs().sum() > 0 and torch.equal(a.probmoe_bias, b.probmoe_bias)
