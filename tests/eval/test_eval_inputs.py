"""probmoe-eval as a new user meets it (issue 42, point 5.2): answers without ``#### <number>`` are
refused in one line naming the file and line before any model loads, and a run that fails leaves
no partial results.jsonl to block the next one."""

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from probmoe.cli import evaluate, train
from probmoe.eval import generation
from probmoe.experiments import checkpoints

GOOD = [{"question": f"What is {i} plus {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(4)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalin")
    data = write_jsonl(root / "qa.jsonl", GOOD)
    out = root / "run"
    assert (
        train.main(
            [
                "--model",
                "tiny-olmoe",
                "--data",
                data,
                "--output-dir",
                str(out),
                "--max-steps",
                "1",
                "--batch-size",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    return out


def test_answers_without_a_gold_number_are_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    rows = [*GOOD[:2], {"question": "What is 2 plus 2?", "answer": "four"}]
    data = write_jsonl(tmp_path / "qa.jsonl", rows)
    monkeypatch.setattr(checkpoints, "load", lambda *a, **k: pytest.fail("the model loaded before the data check"))
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as e:
        evaluate.main(
            ["--checkpoint", str(tmp_path / "no-such-run"), "--data", data, "--output", str(out), "--no-progress"]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert f"--data {data}:3: exact match needs the answer to end in '#### <number>'" in err and "'four'" in err
    assert not out.exists()


def test_skip_generation_needs_no_gold_number(tmp_path, trained, capsys):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": "What is 2 plus 2?", "answer": "four"}])
    out = tmp_path / "eval"
    assert (
        evaluate.main(
            ["--checkpoint", str(trained), "--data", data, "--output", str(out), "--skip-generation", "--no-progress"]
        )
        == 0
    )
    assert json.loads((out / "summary.json").read_text())["problems"] == 1


def test_a_failed_run_leaves_no_partial_results(tmp_path, trained, monkeypatch):
    data = write_jsonl(tmp_path / "qa.jsonl", GOOD)
    original, calls = generation.score, []

    def fails_on_the_third(record, completion):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("scoring failed")
        return original(record, completion)

    monkeypatch.setattr(generation, "score", fails_on_the_third)
    out = tmp_path / "eval"
    args = [
        "--checkpoint",
        str(trained),
        "--data",
        data,
        "--output",
        str(out),
        "--batch-size",
        "2",
        "--max-new-tokens",
        "4",
        "--no-progress",
    ]
    with pytest.raises(RuntimeError, match="scoring failed"):
        evaluate.main(args)
    assert not (out / "results.jsonl").exists() and not (out / "summary.json").exists()
    monkeypatch.undo()
    assert evaluate.main(args) == 0  # the rerun is not blocked by the failed run's files
    assert len((out / "results.jsonl").read_text().splitlines()) == 4
