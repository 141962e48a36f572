"""A finished run's final model is checked as checkpoints are (issue 42, point 5.7): after a
completed run, a truncated model.safetensors (or a missing final_model.json) makes --resume latest
write the final model again from the last checkpoint, byte for byte, instead of reporting the run
complete; whole final files are left alone."""

import json
import os

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from probmoe.cli import train
from probmoe.experiments import state

QA = [{"question": f"{i}+{i}?", "answer": f"{2 * i}"} for i in range(4)]


@pytest.fixture
def finished(tmp_path):
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
        "2",
        "--batch-size",
        "2",
        "--no-progress",
    ]
    assert train.main(args) == 0
    return out, args


def test_the_final_files_are_vouched_for(finished):
    out, _ = finished
    final = json.loads((out / state.FINAL).read_text())
    assert final["step"] == 2 and "model.safetensors" in final["sha256"] and "config.json" in final["sha256"]
    assert state.check_final(str(out), 2) is None
    assert "for step 2, the last checkpoint for step 3" in state.check_final(str(out), 3)


@pytest.mark.parametrize("damage", ["truncate", "no-manifest"])
def test_resume_latest_rewrites_a_damaged_final_model(finished, capsys, damage):
    out, args = finished
    whole = (out / "model.safetensors").read_bytes()
    if damage == "truncate":
        with open(out / "model.safetensors", "r+b") as f:
            f.truncate(len(whole) // 2)
        why = "model.safetensors is missing or does not match its checksum in final_model.json (damaged or modified)"
    else:  # a run written before final_model.json existed, or one killed before it was written
        os.remove(out / state.FINAL)
        why = "final_model.json is missing or unreadable"
    capsys.readouterr()
    assert train.main([*args, "--resume", "latest"]) == 0
    err = capsys.readouterr().err
    last = out / "checkpoint-000002"
    assert f"the final model in {out} is damaged ({why}); writing it again from {last}" in err, err
    assert f"final model in {out}, written again from {last}" in err and "already complete" not in err
    assert (out / "model.safetensors").read_bytes() == whole
    assert state.check_final(str(out), 2) is None
    log = [json.loads(line) for line in open(out / "train_log.jsonl")]
    assert log[-1]["event"] == "repair" and [r["step"] for r in log if "event" not in r] == [1, 2]
    assert train.main([*args, "--resume", "latest"]) == 0  # now whole: nothing to do
    assert "already complete at step 2" in capsys.readouterr().err
