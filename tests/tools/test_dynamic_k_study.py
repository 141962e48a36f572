"""tools/dynamic_k_study.py (tab:dynamic_k_4_8) and probmoe-analyze's tokens.csv (tab:dynamic_expert_number)."""

import csv
import json

import pytest

pytest.importorskip("transformers")

from gsm8k_data import write
from tool_modules import load_tool

from probmoe.cli import analyze

study = load_tool("dynamic_k_study")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two tiny OLMoE checkpoints (8 experts, top-2): saved with ProbMoE exact-2 and with stock routing."""
    import probmoe.integrations.transformers as pt
    from probmoe.experiments.tokenizer import VOCAB_SIZE, byte_tokenizer
    from probmoe.integrations.transformers.testing import tiny_model

    root = tmp_path_factory.mktemp("dk")
    for seed, method in enumerate(("probmoe", "conventional")):
        model = tiny_model("olmoe", seed=seed, vocab_size=VOCAB_SIZE, max_position_embeddings=1024)
        pt.patch_model(model, method)
        model.save_pretrained(root / method)
        byte_tokenizer().save_pretrained(root / method)
    return root


def _rows(path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def test_every_checkpoint_under_one_dynamic_rule(checkpoints, capsys):
    data = write(checkpoints, "test.jsonl", 2)
    out = checkpoints / "study"
    args = [
        "--checkpoint",
        f"pm={checkpoints / 'probmoe'}",
        "--checkpoint",
        str(checkpoints / "conventional"),
        "--data",
        data,
        "--max-new-tokens",
        "3",
        "--device",
        "cpu",
        "--output",
        str(out),
    ]
    assert study.main(args) == 0
    rows = _rows(out / "study.csv")
    assert [r["run"] for r in rows] == ["pm", "conventional"]
    assert [r["trained with"] for r in rows] == ["probmoe", "conventional"]
    for r in rows:
        assert 4 <= float(r["experts/token"]) <= 8 and 0 <= float(r["exact_match_flexible"]) <= 1
        layers = [float(r["layer 0"]), float(r["layer 1"])]
        assert float(r["experts/token"]) == pytest.approx(sum(layers) / 2)
        assert int(r["tokens"]) > 2 * 20  # two prompts of GSM8K length, plus what was generated
    result = json.loads((out / "study.json").read_text())
    assert result["rule"] == "probmoe-dynamic (kmin=4, kmax=8)"
    assert "| pm | probmoe |" in (out / "study.md").read_text() and "| pm | probmoe |" in capsys.readouterr().out
    # the rule is the one given, whatever the checkpoint was saved with: kmin = kmax = 3 is exactly 3
    assert study.main([*args, "--kmin", "3", "--kmax", "3", "--overwrite"]) == 0
    for r in _rows(out / "study.csv"):
        assert float(r["layer 0"]) == float(r["layer 1"]) == 3


def test_study_refuses_bad_input(checkpoints, capsys):
    data = write(checkpoints, "test.jsonl", 1)
    base = ["--checkpoint", str(checkpoints / "probmoe"), "--output", str(checkpoints / "bad")]
    for flags, message in (
        (["--data", data, "--kmin", "5", "--kmax", "4"], "--kmin (5) must be <= --kmax (4)"),
        (["--data", data, "--include-path", "x"], "--include-path needs --tasks"),
        (["--data", str(checkpoints / "none.jsonl")], "does not exist"),
        ([], "one of the arguments --data --tasks is required"),
    ):
        with pytest.raises(SystemExit) as e:
            study.main([*base, *flags])
        assert e.value.code == 2 and message in capsys.readouterr().err, flags


@pytest.mark.slow  # about 12 s: probmoe-analyze draws its figures
def test_analyze_ranks_tokens_by_experts(checkpoints):
    """tokens.csv: ranked by mean experts, top/bottom 20% marked, and its counts and means add up to the
    experts per token of analysis.json."""
    data = write(checkpoints, "test.jsonl", 3)
    out = checkpoints / "analysis"
    assert (
        analyze.main(
            [
                "--checkpoint",
                str(checkpoints / "conventional"),
                "--data",
                data,
                "--output",
                str(out),
                "--method",
                "probmoe-dynamic",
                "--kmin",
                "1",
                "--kmax",
                "3",
                "--token-min-count",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    rows = _rows(out / "tokens.csv")
    means = [float(r["mean_experts"]) for r in rows]
    assert means == sorted(means, reverse=True) and means[0] > means[-1]
    assert [int(r["rank"]) for r in rows] == list(range(len(rows)))
    edge = round(0.2 * len(rows))
    assert {r["group"] for r in rows[:edge]} == {"top 20%"} and {r["group"] for r in rows[-edge:]} == {"bottom 20%"}
    assert all(r["group"] == "" for r in rows[edge:-edge])
    layers = json.loads((out / "analysis.json").read_text())["runs"]["conventional"]
    tokens = layers[0]["tokens"]
    assert sum(int(r["count"]) for r in rows) == tokens
    experts = sum(layer["cardinality_mean"] for layer in layers) / len(layers) * tokens
    assert sum(int(r["count"]) * float(r["mean_experts"]) for r in rows) == pytest.approx(experts, rel=1e-5)
    assert any(r["token"] == "\\n" for r in rows)  # the newline of "Question: ...\nAnswer:", escaped


@pytest.mark.slow  # about 15 s: two data sets routed, figures drawn
def test_analyze_compares_data_sets(checkpoints, capsys):
    """Repeated --data (Fig. 5 per data set): one run per checkpoint and data set, each routing only
    its own texts; the same file under two names routes the same tokens the same way."""
    test, train = write(checkpoints, "test.jsonl", 2), write(checkpoints, "train.jsonl", 3)
    out = checkpoints / "analysis-sets"
    assert (
        analyze.main(
            [
                "--checkpoint",
                f"pm={checkpoints / 'probmoe'}",
                "--data",
                f"gsm={test}",
                "--data",
                f"train={train}",
                "--data",
                f"again={test}",
                "--output",
                str(out),
                "--method",
                "probmoe-dynamic",
                "--kmin",
                "4",
                "--kmax",
                "8",
                "--no-progress",
            ]
        )
        == 0
    )
    result = json.loads((out / "analysis.json").read_text())
    assert list(result["runs"]) == ["pm on gsm", "pm on train", "pm on again"]
    assert result["records"] == {"gsm": 2, "train": 3, "again": 2}
    runs = result["runs"]
    assert runs["pm on gsm"] == runs["pm on again"] and runs["pm on gsm"] != runs["pm on train"]
    for layers in runs.values():
        assert all(4 <= layer["cardinality_mean"] <= 8 for layer in layers)
    assert {r["run"] for r in _rows(out / "analysis.csv")} == set(runs)
    with pytest.raises(SystemExit) as e:
        analyze.main(
            [
                "--checkpoint",
                str(checkpoints / "probmoe"),
                "--data",
                f"a={test}",
                "--data",
                f"a={train}",
                "--output",
                str(checkpoints / "x"),
            ]
        )
    assert e.value.code == 2 and "two data sets are named 'a'" in capsys.readouterr().err
