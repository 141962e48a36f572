"""Logs that say what happened (issue 42, point 5.10): after a resume from an earlier checkpoint
train_log.jsonl holds each step once (the superseded records kept beside it); the router terms
added to the loss are ``router_loss`` / ``train/router_loss``, not a second ``aux_loss``; ReMoE's
eval line names no top-k it does not run."""

import json
import shutil

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from probmoe.cli import train
from probmoe.experiments import checkpoints, tracking

QA = [{"question": f"{i}+{i}?", "answer": f"{2 * i}"} for i in range(4)]


def records(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_a_resume_leaves_each_step_once_in_the_log(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in QA), encoding="utf-8")
    out = tmp_path / "run"
    args = [
        "--model",
        "tiny-olmoe",
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--max-steps",
        "4",
        "--batch-size",
        "2",
        "--save-every",
        "2",
        "--no-progress",
    ]
    assert train.main([*args, "--stop-after", "3"]) == 0
    shutil.rmtree(out / "checkpoint-000003")  # as if the run had died after step 3, before its checkpoint
    before = records(out / "train_log.jsonl")
    assert [r["step"] for r in before if "event" not in r] == [1, 2, 3]
    assert train.main([*args, "--resume", "latest"]) == 0
    log = records(out / "train_log.jsonl")
    assert [r["step"] for r in log if "event" not in r] == [1, 2, 3, 4]
    resume = [r for r in log if r.get("event") == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == 2 and resume[0]["superseded_steps"] == 1
    (old,) = records(out / "train_log.superseded.jsonl")
    assert old == before[-1]  # the first run's step 3, kept
    assert all("router_loss" in r and "aux_loss" not in r for r in log if "event" not in r)


def test_the_trackers_name_the_weighted_router_terms_apart_from_routing_aux_loss():
    assert tracking.TRAIN_KEYS["router_loss"] == "train/router_loss"
    assert "train/aux_loss" not in tracking.TRAIN_KEYS.values()


def test_remoe_is_described_without_a_top_k():
    import probmoe.integrations.transformers as pt
    from probmoe.integrations.transformers.testing import tiny_model

    model = tiny_model("olmoe")
    pt.patch_model(model, "remoe")
    line = checkpoints.describe(model)
    assert line == "remoe (ReLU gates: any number of experts per token, trained towards 2 on average)"
    conventional = tiny_model("olmoe")
    pt.patch_model(conventional, "conventional")
    assert checkpoints.describe(conventional) == "conventional (top-2)"
