"""tools/dynamic_diff.py (tab:dynamic_diff): Dynamic-k minus Exact-k exact match and the fraction of
experts, per data set, as Markdown, CSV and JSON."""

import csv
import importlib
import json
import os
import sys

import pytest

pytest.importorskip("transformers")

from gsm8k_data import write

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools")
sys.path.insert(0, TOOLS)  # the tool imports dynamic_k_study from beside it, as when run as a script
dynamic_diff = importlib.import_module("dynamic_diff")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny OLMoE checkpoints (8 experts, top-2) saved with ProbMoE exact-2 and with Dynamic-k in [1, 2]."""
    import probmoe.integrations.transformers as pt
    from probmoe.experiments.tokenizer import VOCAB_SIZE, byte_tokenizer
    from probmoe.integrations.transformers.testing import tiny_model

    root = tmp_path_factory.mktemp("diff")
    for seed, (name, method, kwargs) in enumerate(
        (("exact", "probmoe", {}), ("dynamic", "probmoe-dynamic", {"kmin": 1, "kmax": 2}))
    ):
        model = tiny_model("olmoe", seed=seed, vocab_size=VOCAB_SIZE, max_position_embeddings=1024)
        pt.patch_model(model, method, **kwargs)
        model.save_pretrained(root / name)
        byte_tokenizer().save_pretrained(root / name)
    return root


def _args(root, data, out, *extra):
    return [
        "--dataset",
        f"GSM={data}",
        "--exact",
        f"GSM={root / 'exact'}",
        "--dynamic",
        f"GSM={root / 'dynamic'}",
        "--max-new-tokens",
        "3",
        "--device",
        "cpu",
        "--output",
        str(out),
        *extra,
    ]


def test_the_table_from_one_command(checkpoints, monkeypatch, capsys):
    """Exact matches fixed by a stand-in scorer (tiny random models answer nothing), the experts per
    token measured: the cell is 100 * (dynamic - exact) and dynamic / exact experts per token."""
    data = write(checkpoints, "test.jsonl", 2)
    k_study = importlib.import_module("dynamic_k_study")  # what the tool imports (maybe loaded by another test)
    scored, generate = [], k_study.gsm8k_scores

    def scores(model, tokenizer, records, args):
        scored.append(model.probmoe_plan.method)
        generate(model, tokenizer, records, args)  # the real generation, routed and tallied
        em = {"probmoe": 0.5, "probmoe-dynamic": 0.25}[model.probmoe_plan.method]
        return {"exact_match_flexible": em, "exact_match_strict": em / 2}

    monkeypatch.setattr(k_study, "gsm8k_scores", scores)
    out = checkpoints / "table"
    assert dynamic_diff.main(_args(checkpoints, data, out, "--limit", "2")) == 0
    assert scored == ["probmoe", "probmoe-dynamic"]  # each with the routing it was saved with
    with open(out / "dynamic_diff.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["dataset"] == "GSM" and row["problems"] == "2"
    assert row["exact_routing"].startswith("probmoe") and row["dynamic_routing"] == "probmoe-dynamic (kmin=1, kmax=2)"
    assert float(row["em_difference_pp"]) == pytest.approx(-25.0)
    assert float(row["exact_experts_per_token"]) == 2.0  # exactly k = 2 on every token
    dynamic = float(row["dynamic_experts_per_token"])
    assert 1.0 <= dynamic <= 2.0
    assert float(row["fraction_of_experts"]) == pytest.approx(dynamic / 2)
    md = (out / "dynamic_diff.md").read_text()
    assert f"| GSM | -25.00 ({100 * dynamic / 2:.2f}%) |" in md and md in capsys.readouterr().out
    result = json.loads((out / "dynamic_diff.json").read_text())
    assert result["rows"][0]["em_difference_pp"] == pytest.approx(-25.0) and result["limit"] == 2


def test_real_scores_and_bad_input(checkpoints, capsys):
    data = write(checkpoints, "test.jsonl", 1)
    out = checkpoints / "real"
    assert dynamic_diff.main(_args(checkpoints, data, out)) == 0
    with open(out / "dynamic_diff.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["em_difference_pp"]) == pytest.approx(100 * (float(row["dynamic_em"]) - float(row["exact_em"])))
    for extra, message in (
        ([], "already holds"),  # the folder of the run above
        (["--dataset", f"LAW={data}", "--overwrite"], "--exact must name one checkpoint for each --dataset"),
        (["--exact", "GSM", "--overwrite"], "--exact must be NAME=VALUE"),
    ):
        with pytest.raises(SystemExit) as e:
            dynamic_diff.main(_args(checkpoints, data, out, *extra))
        assert e.value.code == 2 and message in capsys.readouterr().err
