"""A patched model under the Hugging Face training stack: transformers.Trainer (gradient
checkpointing, the aux loss, checkpoints and save_model with probmoe_routing.json) and
trl.SFTTrainer, with RoutingStatsCallback putting the routing statistics into the logs.
Tiny random models on the CPU, a few steps each."""

import math

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")  # transformers.Trainer needs it

from transformers import Trainer, TrainingArguments  # noqa: E402

import probmoe.integrations.transformers as pt  # noqa: E402
from probmoe.experiments.tokenizer import VOCAB_SIZE, byte_tokenizer  # noqa: E402
from probmoe.integrations.transformers.callback import RoutingStatsCallback  # noqa: E402
from probmoe.integrations.transformers.testing import tiny_model  # noqa: E402

KEYS = ("routing/experts_per_token", "routing/load_cv", "routing/max_vio", "routing/entropy")
COMMON = dict(
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    seed=0,
    logging_steps=1,
    learning_rate=3e-3,
    dataloader_num_workers=0,
    per_device_train_batch_size=4,
)


def token_data(rows=16, length=16):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 40, (rows, length), generator=g)  # a small alphabet: learnable in a few steps
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})


def train_logs(trainer):
    return [entry for entry in trainer.state.log_history if "loss" in entry]


def check_stats(logs, kmin, kmax, n=8, aux=True):
    for entry in logs:
        assert all(key in entry for key in KEYS), entry
        assert kmin <= entry["routing/experts_per_token"] <= kmax
        assert 0 <= entry["routing/load_cv"] <= math.sqrt(n - 1)  # the CV of N counts is at most sqrt(N - 1)
        assert 0 <= entry["routing/max_vio"] <= n - 1
        assert 0 < entry["routing/entropy"] <= 1
        if aux:  # N · Σ f_i P_i with Σ f_i <= kmax, Σ P_i = 1
            assert 0 < entry["routing/aux_loss"] <= n * kmax


def test_trainer_with_gradient_checkpointing_aux_loss_and_reload(tmp_path):
    model = pt.patch_model(tiny_model("olmoe"), "probmoe", aux_loss=0.01, generator=torch.Generator().manual_seed(1))
    model.config.output_router_logits = True  # the aux loss enters the Trainer's loss
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=4,
        gradient_checkpointing=True,
        save_strategy="steps",
        save_steps=2,
        **COMMON,
    )
    trainer = Trainer(model=model, args=args, train_dataset=token_data())
    callback = RoutingStatsCallback(per_layer=True).attach(trainer)
    assert trainer.callback_handler.callbacks[0] is callback
    trainer.train()
    assert model.is_gradient_checkpointing

    logs = train_logs(trainer)
    assert len(logs) == 4 and all(math.isfinite(e["loss"]) for e in logs)
    assert logs[-1]["loss"] < logs[0]["loss"] - 0.1, [e["loss"] for e in logs]
    check_stats(logs, 2, 2)
    assert all(e["routing/experts_per_token"] == 2.0 for e in logs)  # exactly k = 2
    assert {"routing/layer0/load_cv", "routing/layer1/entropy"} <= set(logs[-1])
    layers = [logs[-1][f"routing/layer{i}/max_vio"] for i in range(2)]
    assert logs[-1]["routing/max_vio"] == pytest.approx(sum(layers) / 2)

    # the Trainer's loss is the LM loss plus aux_loss times the load-balancing loss
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    model.train()
    loss, out = trainer.compute_loss(model, inputs, return_outputs=True)
    lm = model.loss_function(out.logits, inputs["labels"], model.vocab_size)
    assert out.aux_loss > 0
    torch.testing.assert_close(loss, lm + 0.01 * out.aux_loss)

    for checkpoint in ("checkpoint-2", "checkpoint-4"):  # every checkpoint carries the routing
        assert (tmp_path / "run" / checkpoint / pt.SETTINGS_FILENAME).is_file()
    trainer.save_model(str(tmp_path / "final"))
    reloaded = pt.from_pretrained(tmp_path / "final")
    assert reloaded.probmoe_plan == model.probmoe_plan
    x = torch.tensor(token_data(2)["input_ids"])
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(x).logits, model.eval()(x).logits, rtol=0, atol=0)


def test_trainer_dynamic_k_with_gradient_accumulation(tmp_path):
    model = pt.patch_model(tiny_model("qwen3_moe"), "probmoe-dynamic", kmin=1, kmax=2, aux_loss=0.01)
    model.config.output_router_logits = True
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, gradient_accumulation_steps=2, save_strategy="no", **COMMON
    )
    trainer = Trainer(model=model, args=args, train_dataset=token_data(), callbacks=[RoutingStatsCallback()])
    forwards = []
    model.register_forward_hook(lambda *_: forwards.append(1))
    trainer.train()
    logs = train_logs(trainer)
    assert len(logs) == 2 and len(forwards) == 4  # two micro-batches per step, each counted in the stats
    check_stats(logs, 1, 2)
    assert any(e["routing/experts_per_token"] < 2 for e in logs)  # dynamic-k uses fewer than kmax
    assert logs[-1]["loss"] != logs[0]["loss"]


def test_callback_statistics_equal_the_analysis_metrics_on_real_tokens():
    from transformers import TrainerState

    from probmoe.analysis import metrics

    model = pt.patch_model(tiny_model("qwen3_moe"), "probmoe-dynamic", kmin=1, kmax=2, aux_loss=0.01)
    model.config.output_router_logits = True
    callback = RoutingStatsCallback(per_layer=True)
    callback.on_train_begin(None, None, None, model=model)
    x = torch.randint(3, 256, (3, 8), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(x)
    mask[0, :3] = 0  # left padding: left out of the statistics
    model.train()
    records = []
    for _ in range(2):  # two forwards before one log: their tokens pooled
        out = model(x, attention_mask=mask, labels=x, output_router_logits=True)
        keep = mask.reshape(-1).bool()
        records.append(
            [
                (torch.softmax(logits.detach().float(), -1)[keep], s["selected"][keep], out.aux_loss.item())
                for logits, s in zip(out.router_logits, pt.router_stats(model))
            ]
        )
    with torch.no_grad():
        model.eval()(x, attention_mask=mask)  # eval forwards are not counted
    state, logs = TrainerState(), {"loss": 1.0}
    state.log_history.append(dict(logs, step=0))
    callback.on_log(None, state, None, logs=logs)
    assert state.log_history[-1] == dict(logs, step=0)
    for layer in range(2):
        probs = torch.cat([r[layer][0] for r in records])
        selected = torch.cat([r[layer][1] for r in records])
        want = metrics.layer_summary(probs, selected)
        assert logs[f"routing/layer{layer}/experts_per_token"] == pytest.approx(want["cardinality_mean"])
        assert logs[f"routing/layer{layer}/load_cv"] == pytest.approx(want["load_cv"])
        assert logs[f"routing/layer{layer}/max_vio"] == pytest.approx(want["max_vio"])
        assert logs[f"routing/layer{layer}/entropy"] == pytest.approx(want["token_entropy"])
    assert logs["routing/aux_loss"] == pytest.approx(sum(r[0][2] for r in records) / 2)
    layers = [logs[f"routing/layer{i}/entropy"] for i in range(2)]
    assert logs["routing/entropy"] == pytest.approx(sum(layers) / 2)
    empty = {"loss": 1.0}
    callback.on_log(None, state, None, logs=empty)  # nothing routed since the last log: nothing added
    assert empty == {"loss": 1.0}
    callback.on_train_end(None, None, None)


def test_callback_needs_a_patched_model_and_warns_without_router_logits():
    callback = RoutingStatsCallback()
    with pytest.raises(ValueError, match="needs a model patched with"):
        callback.on_train_begin(None, None, None, model=tiny_model("olmoe"))
    model = pt.patch_model(tiny_model("olmoe"), "probmoe", aux_loss=0.01)
    with pytest.warns(UserWarning, match="config.output_router_logits is False"):
        callback.on_train_begin(None, None, None, model=model)
    callback.on_train_end(None, None, None)
    assert not model._forward_hooks and not model._forward_pre_hooks
    with pytest.raises(ValueError, match="per_layer must be True or False"):
        RoutingStatsCallback(per_layer="yes")


def test_sft_trainer_prompt_completion(tmp_path):
    trl = pytest.importorskip("trl")
    tokenizer = byte_tokenizer()
    model = pt.patch_model(tiny_model("olmoe", vocab_size=VOCAB_SIZE), "probmoe", aux_loss=0.01)
    model.config.output_router_logits = True
    rows = [{"prompt": f"{a}+{b}=", "completion": f"{a + b}."} for a in range(4) for b in range(4)]
    args = trl.SFTConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=4,
        max_length=32,
        save_strategy="no",
        gradient_checkpointing=True,
        **COMMON,
    )
    trainer = trl.SFTTrainer(
        model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer
    )
    RoutingStatsCallback().attach(trainer)
    assert "forward" in vars(model)  # trl's fused LM head replaces the forward (docs/transformers.md)
    trainer.train()
    logs = train_logs(trainer)
    assert len(logs) == 4 and all(math.isfinite(e["loss"]) for e in logs)
    assert logs[-1]["loss"] < logs[0]["loss"], [e["loss"] for e in logs]
    check_stats(logs, 2, 2, aux=False)  # the load-balancing loss is trl's own here: its "aux_loss" key
    assert all(e["aux_loss"] > 0 for e in logs)
    trainer.save_model(str(tmp_path / "final"))
    reloaded = pt.from_pretrained(tmp_path / "final")
    assert reloaded.probmoe_plan == model.probmoe_plan
    with pytest.raises(ValueError, match="del model.forward"):
        pt.unpatch_model(model)
    del model.forward
    assert not pt.is_patched(pt.unpatch_model(model))


ACCELERATE_CPU = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
num_machines: 1
num_processes: 2
mixed_precision: "no"
use_cpu: true
"""


@pytest.mark.slow
def test_accelerate_launch_two_cpu_processes(tmp_path):
    """tools/hf_trainer_example.py under `accelerate launch` with 2 gloo processes (DDP: accelerate
    turns FSDP on only on GPU-type devices, docs/transformers.md), then the saved model reloads."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "cpu.yaml").write_text(ACCELERATE_CPU)
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(tmp_path / "cpu.yaml"),
        str(root / "tools" / "hf_trainer_example.py"),
        "--output",
        str(tmp_path / "run"),
        "--steps",
        "3",
        "--gradient-checkpointing",
    ]
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    logs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"')]
    train = [entry for entry in logs if "loss" in entry]
    assert [entry["step"] for entry in train] == [1, 2, 3]  # printed by rank 0 only: one distributed run
    assert all(entry["routing/experts_per_token"] == 2.0 and entry["routing/aux_loss"] > 0 for entry in train)
    reloaded = pt.from_pretrained(tmp_path / "run" / "final")
    assert reloaded.probmoe_plan.method == "probmoe" and reloaded.probmoe_plan.options.aux_loss == 0.01


def test_a_layer_that_routes_no_token_has_no_load_statistics():
    """ReMoE can switch a whole layer off (every ReLU gate 0): its experts per token is 0 and it has
    no load balance, so the callback and probmoe-train's step record leave load_cv and max_vio out
    for it (the means are over the other layers) instead of failing."""
    from transformers import TrainerState

    from probmoe.experiments.trainer import routing_summary

    model = pt.patch_model(tiny_model("qwen3_moe"), "remoe")
    with torch.no_grad():
        model.model.layers[1].mlp.gate.weight.zero_()  # ReLU(0) = 0: no expert for any token
    callback = RoutingStatsCallback(per_layer=True)
    callback.on_train_begin(None, None, None, model=model)
    x = torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(x)
    model.train()(x, attention_mask=mask)
    records = routing_summary(model, mask)
    assert records[1] == {"layer": records[1]["layer"], "experts_per_token": 0.0}
    assert records[0]["experts_per_token"] > 0 and {"load_cv", "max_vio"} <= records[0].keys()
    logs = {"loss": 1.0}
    callback.on_log(None, TrainerState(), None, logs=logs)
    assert logs["routing/layer1/experts_per_token"] == 0 and "routing/layer1/load_cv" not in logs
    assert logs["routing/load_cv"] == logs["routing/layer0/load_cv"]
    assert logs["routing/experts_per_token"] == pytest.approx(logs["routing/layer0/experts_per_token"] / 2)
    callback.on_train_end(None, None, None)
