"""A damaged final model is not loaded silently (issue 48, point 2): one flipped byte in
model.safetensors of a finished run, and from_pretrained, probmoe-eval, probmoe-analyze and
probmoe-train --model refuse it in one line naming the file and its recorded sha256 (status 2 for
the commands), before anything is written; a whole one loads, each file hashed once."""

import json
import os
import shutil

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from probmoe.cli import analyze, evaluate, train
from probmoe.integrations import final_model
from probmoe.integrations.transformers import from_pretrained

QA = [{"question": f"{i}+{i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"} for i in range(4)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run's output folder and the data it trained on."""
    root = tmp_path_factory.mktemp("finished")
    data = root / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in QA), encoding="utf-8")
    out = root / "run"
    argv = ["--model", "tiny-olmoe", "--data", str(data), "--output-dir", str(out)]
    assert train.main([*argv, "--max-steps", "1", "--batch-size", "2", "--no-progress"]) == 0
    return out, data


@pytest.fixture
def flipped(finished, tmp_path):
    """A copy of the finished run with one byte of model.safetensors' tensor data flipped."""
    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    with open(out / "model.safetensors", "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x01]))
    return out


def says(out) -> str:
    return (
        f"{out / 'model.safetensors'} does not match its recorded sha256 in final_model.json (damaged or "
        "modified since it was written); rerun the run's probmoe-train command with --resume latest to write "
        "the final model again"
    )


def refused(capsys, main, argv, prog) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"{prog}: error: "), err
    return err


def test_from_pretrained_refuses_a_flipped_byte(flipped):
    with pytest.raises(ValueError) as e:
        from_pretrained(flipped)
    assert str(e.value) == says(flipped)


def test_probmoe_eval_refuses_a_flipped_byte(flipped, finished, capsys):
    argv = ["--checkpoint", str(flipped), "--data", str(finished[1]), "--limit", "1", "--no-progress"]
    assert says(flipped) in refused(capsys, evaluate.main, argv, "probmoe-eval")
    assert sorted(os.listdir(flipped)) == sorted(os.listdir(finished[0]))  # no eval folder


def test_probmoe_analyze_refuses_a_flipped_byte(flipped, finished, capsys, tmp_path):
    argv = ["--checkpoint", str(flipped), "--data", str(finished[1]), "--output", str(tmp_path / "a")]
    assert says(flipped) in refused(capsys, analyze.main, [*argv, "--limit", "1", "--no-progress"], "probmoe-analyze")
    assert not (tmp_path / "a").exists()


def test_probmoe_train_refuses_a_flipped_byte_as_its_model(flipped, finished, capsys, tmp_path):
    argv = ["--model", str(flipped), "--data", str(finished[1]), "--output-dir", str(tmp_path / "again")]
    assert says(flipped) in refused(capsys, train.main, [*argv, "--max-steps", "1"], "probmoe-train")
    assert not (tmp_path / "again").exists()


@pytest.mark.parametrize("damage", ["missing", "malformed"])
def test_a_missing_file_or_a_damaged_record_is_refused(finished, tmp_path, damage):
    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    if damage == "missing":
        os.remove(out / "config.json")
        expected = f"{out / 'config.json'} is missing, though final_model.json beside it records its sha256"
    else:
        (out / "final_model.json").write_text('{"format": "probmoe-final-model", "sha256": {}}')
        expected = f"{out / 'final_model.json'} is malformed: the final model beside it cannot be checked"
    with pytest.raises(ValueError) as e:
        final_model.verify(out)
    assert str(e.value).startswith(expected), str(e.value)


def test_a_whole_final_model_loads_hashing_each_file_once(finished, capsys, monkeypatch, tmp_path):
    hashed = []
    original = final_model.sha256_file
    monkeypatch.setattr(
        final_model, "sha256_file", lambda path: hashed.append(os.path.basename(path)) or original(path)
    )
    out, data = finished
    argv = ["--checkpoint", str(out), "--data", str(data), "--limit", "1", "--max-new-tokens", "2"]
    assert evaluate.main([*argv, "--output", str(tmp_path / "eval"), "--no-progress"]) == 0
    recorded = json.loads((out / "final_model.json").read_text())["sha256"]
    assert sorted(hashed) == sorted(recorded) and "model.safetensors" in hashed
