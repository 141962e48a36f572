"""probmoe-train --plan (no weights, no data), the refusal of a model that cannot fit, and the plan
against the measured peak memory of a real run on the CPU (tools/memory_plan_check.py)."""

import os
import sys

import pytest

pytest.importorskip("transformers")

from probmoe.cli import train
from probmoe.experiments import memory_plan, models

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))


def test_plan_prints_exact_state_bytes_for_olmoe(capsys):
    assert (
        train.main(
            [
                "--model",
                "olmoe-1b-7b-shape",
                "--plan",
                "--world-size",
                "8",
                "--global-batch-size",
                "64",
                "--bf16",
                "--gradient-checkpointing",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    P = 6_919_161_856
    assert "6.919 B parameters" in out and "8 process(es), batch 8 x 1024" in out
    assert f"parameters    {memory_plan.gib(4 * P):>14}" in out  # DDP: fp32 parameters
    assert f"optimizer     {memory_plan.gib(12 * P):>14}{memory_plan.gib(12 * -(-P // 8)):>14}" in out
    assert "DDP: fits on none of" in out and "FSDP: fits on 40 GB, 80 GB, 141 GB GPUs" in out


def test_plan_estimate_terms():
    shape = memory_plan.shape_of(models.empty_model(models.model_config("qwen1.5-moe-a2.7b-shape")))
    assert shape.params == 14_315_784_192 and shape.layers == 24 and shape.shared_width == 5632
    kw = dict(batch_size=1, max_length=512, method="probmoe")
    ddp = memory_plan.estimate(shape, world_size=8, fsdp=False, **kw)
    fsdp = memory_plan.estimate(shape, world_size=8, fsdp=True, **kw)
    assert ddp.parameters == 4 * shape.params and ddp.optimizer == (8 + 4) * shape.params  # + foreach step
    stored = 4 * -(-shape.params // 8)
    assert fsdp.parameters == stored + 4 * (shape.root_params + 2 * shape.layer_params)
    assert fsdp.gradients == stored + 4 * (shape.root_params + shape.layer_params)
    assert fsdp.activations == ddp.activations
    dense = memory_plan.estimate(shape, world_size=8, fsdp=True, **{**kw, "method": "densemixer"})
    assert dense.activations > fsdp.activations  # every expert on every token
    ckpt = memory_plan.estimate(shape, world_size=8, fsdp=True, checkpointing=True, **kw)
    assert ckpt.activations < fsdp.activations


def test_a_model_that_cannot_fit_is_refused_before_loading(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n' * 8)
    with pytest.raises(SystemExit) as e:
        train.main(
            [
                "--model",
                "deepseek-v3-shape",
                "--data",
                str(data),
                "--output-dir",
                str(tmp_path / "o"),
                "--device",
                "cpu",
                "--max-steps",
                "1",
                "--batch-size",
                "1",
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and "will not fit" in err and "add --fsdp" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_plan_against_measured_peak_on_cpu():
    """One process, tiny-olmoe, 32 × 256 tokens: the measured peak growth of the resident set lies
    within [0.8, 1.5] of the plan (measured 1.07-1.15 on the 2-core AMD EPYC; docs/reports/experiments-commands-epyc-2026-11.md)."""
    from memory_plan_check import measure

    data = "/work/shared/data/gsm8k/train.jsonl"
    if not os.path.isfile(data):
        pytest.skip("needs the shared GSM8K data")
    r = measure("tiny-olmoe", "probmoe", 32, 256, 2, data)
    assert 0.8 <= r["measured"] / r["plan"] <= 1.5, r


def test_plan_with_one_process_says_why_fsdp_needs_more(capsys):
    for world, noted in ((1, True), (8, False)):
        assert train.main(["--model", "olmoe-1b-7b-shape", "--plan", "--world-size", str(world)]) == 0
        out = capsys.readouterr().out
        ddp, fsdp = (float(x) for x in next(l for l in out.splitlines() if l.startswith("total")).split()[1::2])
        assert (fsdp > ddp) == noted  # one process: nothing sharded, the gathered copies on top
        assert ("with one process FSDP shards nothing" in out) == noted
