"""train -> eval -> analyze on a tiny model with real GSM8K lines, and the commands' bad input."""

import csv
import json

import pytest
import torch

pytest.importorskip("transformers")

from gsm8k_data import write

from probmoe.cli import analyze, evaluate, train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two tiny OLMoE runs on 8 GSM8K training problems: conventional and Dynamic-k."""
    root = tmp_path_factory.mktemp("e2e")
    data = write(root, "train.jsonl", 8)
    runs = {}
    for method in ("conventional", "probmoe-dynamic"):
        out = root / method
        assert (
            train.main(
                [
                    "--model",
                    "tiny-olmoe",
                    "--data",
                    data,
                    "--output-dir",
                    str(out),
                    "--method",
                    method,
                    "--max-steps",
                    "2",
                    "--batch-size",
                    "4",
                    "--no-progress",
                ]
            )
            == 0
        )
        runs[method] = out
    return root, runs


def test_eval_scores_greedy_generations_and_the_answer_loss(trained, capsys):
    root, runs = trained
    test = write(root, "test.jsonl", 6)
    out = root / "eval"
    assert (
        evaluate.main(
            [
                "--checkpoint",
                str(runs["conventional"]),
                "--data",
                test,
                "--max-new-tokens",
                "8",
                "--batch-size",
                "4",
                "--output",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problems"] == 6 and summary["routing"] == "conventional (top-2)"
    assert summary["answer_loss"] > 0 and summary["experts_per_token"] == 2
    assert 0 <= summary["exact_match_flexible"] <= 1 and "exact match" in printed
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["index"] for r in results] == list(range(6))
    gold = [json.loads(line)["answer"].split("#### ")[-1].strip() for line in open(test)]
    assert [r["reference"] for r in results] == [g.replace(",", "") for g in gold]
    assert sum(r["correct_flexible"] for r in results) / 6 == summary["exact_match_flexible"]


def test_eval_with_another_inference_rule(trained):
    """Dynamic-k MAP on a conventionally trained model: fewer experts per token than top-2 where
    logits are negative (the rule is clamp(#{r > 0}, kmin, kmax))."""
    root, runs = trained
    test = write(root, "test.jsonl", 4)
    out = root / "eval-dyn"
    evaluate.main(
        [
            "--checkpoint",
            str(runs["conventional"]),
            "--data",
            test,
            "--skip-generation",
            "--method",
            "probmoe-dynamic",
            "--kmin",
            "1",
            "--kmax",
            "2",
            "--output",
            str(out),
            "--no-progress",
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["routing"] == "probmoe-dynamic (kmin=1, kmax=2)"
    assert 1 <= summary["experts_per_token"] <= 2 and "exact_match_flexible" not in summary


def test_analyze_writes_json_csv_and_figures_side_by_side(trained):
    root, runs = trained
    data = write(root, "test.jsonl", 4)
    out = root / "analysis"
    assert (
        analyze.main(
            [
                "--checkpoint",
                f"conv={runs['conventional']}",
                "--checkpoint",
                str(runs["probmoe-dynamic"]),
                "--data",
                data,
                "--output",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    result = json.loads((out / "analysis.json").read_text())
    assert set(result["runs"]) == {"conv", "probmoe-dynamic"} and result["records"] == {"test-4": 4}
    assert result["routing"]["probmoe-dynamic"] == "probmoe-dynamic (kmin=1, kmax=2)"
    for _name, layers in result["runs"].items():
        assert len(layers) == 2
        for layer in layers:
            assert sum(layer["load"]) == round(layer["cardinality_mean"] * layer["tokens"])
            assert 1 <= layer["coverage"]["0.5"] <= layer["coverage"]["0.9"] <= layer["coverage"]["0.99"] <= 8
    assert all(layer["cardinality_mean"] == 2 for layer in result["runs"]["conv"])
    rows = list(csv.DictReader(open(out / "analysis.csv")))
    assert len(rows) == 4 and {r["run"] for r in rows} == {"conv", "probmoe-dynamic"}
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["cardinality.png", "concentration.png", "coverage.png", "frequency.png", "load.png"]
    assert all((out / p).stat().st_size > 10_000 for p in pngs)


def test_eval_and_analyze_refuse_bad_input(tmp_path, trained, capsys):
    root, runs = trained
    data = write(root, "test.jsonl", 2)
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--checkpoint", str(tmp_path / "none"), "--data", data])
    assert e.value.code == 2 and "--checkpoint must be a local checkpoint directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main(["--checkpoint", str(runs["conventional"]), "--data", data, "--kmax", "2"])
    assert "need --method" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        analyze.main(
            [
                "--checkpoint",
                str(runs["conventional"]),
                "--checkpoint",
                str(runs["conventional"]),
                "--data",
                data,
                "--output",
                str(tmp_path / "a"),
            ]
        )
    assert "two runs are named" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main(["--checkpoint", str(runs["conventional"]), "--data", str(tmp_path / "missing.jsonl")])
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    out = tmp_path / "again"
    args = [
        "--checkpoint",
        str(runs["conventional"]),
        "--data",
        data,
        "--skip-generation",
        "--output",
        str(out),
        "--no-progress",
    ]
    evaluate.main(args)
    with pytest.raises(SystemExit):  # earlier results are never replaced silently
        evaluate.main(args)
    assert "already holds results.jsonl, summary.json; pass --overwrite" in capsys.readouterr().err
    assert evaluate.main([*args, "--overwrite"]) == 0
    (tmp_path / "file").write_text("mine")
    with pytest.raises(SystemExit):
        analyze.main(["--checkpoint", str(runs["conventional"]), "--data", data, "--output", str(tmp_path / "file")])
    assert "exists and is not a directory" in capsys.readouterr().err and (tmp_path / "file").read_text() == "mine"
    assert torch.is_grad_enabled()


def test_deepseek_analysis_uses_its_sigmoid_scores(tmp_path):
    """DeepSeek-V3 gates with sigmoid scores: the analysed distribution is σ(r) normalised, not softmax(r)."""
    data = write(tmp_path, "train.jsonl", 4)
    train.main(
        [
            "--model",
            "tiny-deepseek-v3",
            "--data",
            data,
            "--output-dir",
            str(tmp_path / "ds"),
            "--method",
            "probmoe-grouped",
            "--max-steps",
            "1",
            "--batch-size",
            "4",
            "--no-progress",
        ]
    )
    from probmoe.experiments import capture, checkpoints, data

    model, tokenizer = checkpoints.load(str(tmp_path / "ds"))
    encoded = [data.encode(tokenizer, {"question": "1+1?", "answer": "2"}, 64)]
    (layer, *_) = capture.capture(model, tokenizer, encoded, 1, lambda x, desc: x)
    with torch.no_grad():
        logits = model(layer.token_ids[None], output_router_logits=True).router_logits[0].float()  # [T, N]
    scores = torch.sigmoid(logits)
    assert torch.allclose(layer.probs, scores / scores.sum(-1, keepdim=True), atol=1e-6)
    assert not torch.allclose(layer.probs, torch.softmax(logits, -1), atol=1e-3)


def test_commands_name_the_missing_extra(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a)
    )
    for main in (train.main, evaluate.main, analyze.main):
        with pytest.raises(SystemExit) as e:
            main(
                ["--model", "m", "--data", "d", "--output-dir", "o"]
                if main is train.main
                else ["--checkpoint", "c", "--data", "d", "--output", "o"]
            )
        assert e.value.code == 2 and "pip install 'probmoe[transformers]'" in capsys.readouterr().err
