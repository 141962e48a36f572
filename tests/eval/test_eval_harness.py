"""probmoe-eval --tasks and the ``probmoe`` harness model: tiny OLMoE, task YAML over local JSON, offline."""

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

from probmoe.cli import evaluate
from probmoe.eval import harness

PROBLEMS = [(1, 2), (3, 4), (5, 6), (12, 7)]
TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
{extra}"""
MC = """output_type: multiple_choice
doc_to_text: "Question: {{q}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
GEN = """output_type: generate_until
doc_to_text: "Question: {{q}}\\nAnswer:"
doc_to_target: "{{choices[0]}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny OLMoE saved with ProbMoE exact-2 routing, and a folder of three tasks: multiple choice
    (log-likelihood), generation, and generation marked unsafe (as MBPP is)."""
    import probmoe.integrations.transformers as pt
    from probmoe.experiments.tokenizer import VOCAB_SIZE, byte_tokenizer
    from probmoe.integrations.transformers.testing import tiny_model

    root = tmp_path_factory.mktemp("harness")
    model = tiny_model("olmoe", seed=0, vocab_size=VOCAB_SIZE, max_position_embeddings=256)
    pt.patch_model(model, "probmoe", k=2)
    model.save_pretrained(root / "ckpt")
    byte_tokenizer().save_pretrained(root / "ckpt")
    tasks = root / "tasks"
    tasks.mkdir()
    with open(tasks / "arith.json", "w") as f:
        for a, b in PROBLEMS:
            f.write(
                json.dumps({"q": f"{a} plus {b}?", "choices": [str(a + b), str(a * b), f"{a}{b} apples"], "label": 0})
                + "\n"
            )
    for name, extra in (("tiny_mc", MC), ("tiny_gen", GEN), ("tiny_unsafe", "unsafe_code: true\n" + GEN)):
        (tasks / f"{name}.yaml").write_text(TASK.format(name=name, data=tasks / "arith.json", extra=extra))
    return root


def _run(setup, out, *extra):
    return evaluate.main(
        [
            "--checkpoint",
            str(setup / "ckpt"),
            "--include-path",
            str(setup / "tasks"),
            "--device",
            "cpu",
            "--output",
            str(out),
            "--batch-size",
            "3",
            "--log-samples",
            *extra,
        ]
    )


def _loglikelihoods(folder) -> list[float]:
    rows = [json.loads(line) for line in (folder / "samples_tiny_mc.jsonl").read_text().splitlines()]
    return [r[0] for row in sorted(rows, key=lambda r: r["doc_id"]) for r in row["filtered_resps"]]


@pytest.fixture(scope="module")
def saved(setup):
    """Both tasks with the saved routing (exact-2 MAP)."""
    out = setup / "saved"
    assert _run(setup, out, "--tasks", "tiny_mc,tiny_gen") == 0
    return out


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_tasks_write_the_harness_results_and_routing_statistics(saved, setup):
    results = json.loads((saved / "results.json").read_text())
    assert set(results["results"]) == {"tiny_mc", "tiny_gen"}
    assert 0 <= results["results"]["tiny_mc"]["acc,none"] <= 1
    assert 0 <= results["results"]["tiny_gen"]["exact_match,none"] <= 1
    assert results["n-samples"]["tiny_mc"]["effective"] == len(PROBLEMS)
    routing = json.loads((saved / "routing.json").read_text())
    assert routing["routing"] == "probmoe (k=2)" and routing["checkpoint"] == str(setup / "ckpt")
    stats = routing["routing_statistics"]
    assert stats["tokens"] > 0 and len(stats["layers"]) == 2
    for layer in stats["layers"]:  # exact-2 MAP: every token, every layer, exactly 2 experts
        assert layer["experts_per_token"] == 2 and layer["cardinality_hist"][2] == stats["tokens"]
    gen = [json.loads(line) for line in (saved / "samples_tiny_gen.jsonl").read_text().splitlines()]
    assert len(gen) == len(PROBLEMS) and all(isinstance(row["resps"][0][0], str) for row in gen)


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_the_routing_rule_changes_what_the_model_computes(saved, setup):
    """Exact-1 MAP scores the same choices differently from exact-2; exact-2 given on the command line
    reproduces the saved routing exactly; the stock top-2 router reads the same experts as exact-2 MAP
    (MAP of exactly-k is the top k) but weighs them as the stock model does."""
    base = _loglikelihoods(saved)
    runs = {}
    for name, flags in (("k1", ["--method", "probmoe", "--k", "1"]), ("k2", ["--method", "probmoe", "--k", "2"])):
        assert _run(setup, setup / name, "--tasks", "tiny_mc", *flags) == 0
        runs[name] = _loglikelihoods(setup / name)
    assert len(base) == 3 * len(PROBLEMS)
    assert runs["k2"] == base
    assert all(abs(a - b) > 1e-4 for a, b in zip(runs["k1"], base))
    routing = json.loads((setup / "k1" / "routing.json").read_text())
    assert routing["routing_statistics"]["experts_per_token"] == 1


def test_routing_tally_counts_real_tokens_only(setup):
    """Right-padded log-likelihood batches: the tally's histograms equal those of each request run alone."""
    from lm_eval.api.instance import Instance

    lm = harness.ProbMoELM(str(setup / "ckpt"), method="probmoe-dynamic", kmin=1, kmax=2, device="cpu", batch_size=4)
    pairs = [
        ("Question: 1 plus 2?\nAnswer:", " 3 apples"),
        ("Q:", " no"),
        ("Question: what is twelve?", " 12"),
        ("Hi", " there, friend"),
    ]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    lm.loglikelihood(requests, disable_tqdm=True)
    batched = lm.tally.summary()
    expected = torch.zeros(2, 9, dtype=torch.long)
    for context, continuation in pairs:
        ids = lm.tok_encode(context + continuation)[:-1]
        with torch.no_grad():
            lm.tally.paused = True
            lm.model(torch.tensor([ids]))
            lm.tally.paused = False
        from probmoe.integrations.transformers import router_stats

        for layer, s in enumerate(router_stats(lm.model)):
            expected[layer] += torch.bincount(s["experts_per_token"].long(), minlength=9)
    assert batched["tokens"] == int(expected[0].sum())
    assert [layer["cardinality_hist"] for layer in batched["layers"]] == expected.tolist()
    assert expected[:, 1].sum() > 0 and expected[:, 2].sum() > 0  # both cardinalities occur: a real check


@pytest.mark.slow
def test_registered_with_the_harness(setup):
    import lm_eval
    from lm_eval.api.registry import get_model

    assert get_model("probmoe") is harness.ProbMoELM
    manager = harness.task_manager(["tiny_mc"], str(setup / "tasks"))
    results = lm_eval.simple_evaluate(
        model="probmoe",
        model_args=f"checkpoint={setup / 'ckpt'},method=conventional",
        tasks=["tiny_mc"],
        task_manager=manager,
        limit=2,
        device="cpu",
        batch_size=2,
    )
    assert results["config"]["model"] == "probmoe" and 0 <= results["results"]["tiny_mc"]["acc,none"] <= 1


@pytest.mark.slow
def test_the_harness_command_line_finds_the_model(setup):
    """``python -m probmoe.eval.harness`` is lm_eval's command line with ``probmoe`` registered."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        "HF_DATASETS_OFFLINE": "1",
    }
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "probmoe.eval.harness",
            "run",
            "--model",
            "probmoe",
            "--model_args",
            f"checkpoint={setup / 'ckpt'},method=probmoe,k=1",
            "--tasks",
            "tiny_mc",
            "--include_path",
            str(setup / "tasks"),
            "--device",
            "cpu",
            "--batch_size",
            "2",
            "--limit",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(setup),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "|tiny_mc|" in run.stdout and "probmoe (" in run.stdout


@pytest.mark.slow  # about 12 s: the harness indexes its task YAML for each refusal
def test_bad_input_is_refused(setup, capsys):
    cases = [
        (["--tasks", "tiny_mcq"], "unknown task(s) 'tiny_mcq' (did you mean tiny_mc"),
        (["--tasks", "tiny_mc,"], "comma-separated list"),
        (["--tasks", "tiny_unsafe"], "unsafe"),
        (["--tasks", "tiny_mc", "--data", "x.jsonl"], "either --data"),
        (
            ["--tasks", "tiny_mc", "--max-new-tokens", "8", "--skip-generation"],
            "--max-new-tokens, --skip-generation apply to --data (GSM8K) only",
        ),
    ]
    for flags, message in cases:
        with pytest.raises(SystemExit) as e:
            _run(setup, setup / "bad", *flags)
        assert e.value.code == 2
        assert message in capsys.readouterr().err, flags
    with pytest.raises(SystemExit):
        evaluate.main(
            ["--checkpoint", str(setup / "ckpt"), "--tasks", "tiny_mc", "--include-path", str(setup / "none")]
        )
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_no_progress_silences_the_harness_bars(setup, capsys):
    from transformers.utils import logging

    errs = {}
    for flag in ([], ["--no-progress"]):
        logging.enable_progress_bar()  # as in a fresh process
        assert _run(setup, setup / f"quiet{len(flag)}", "--tasks", "tiny_mc,tiny_gen", *flag) == 0
        errs[bool(flag)] = capsys.readouterr().err
    logging.enable_progress_bar()
    assert "Running loglikelihood requests" in errs[False] and "it/s" in errs[False]  # the bars looked for
    assert "it/s" not in errs[True] and "%|" not in errs[True], errs[True]


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_a_task_whose_data_cannot_be_downloaded_is_one_line(setup, capsys, monkeypatch):
    """Without network, a Hub task (the README's mmlu) fails in datasets with a ConnectionError."""
    from probmoe.eval import harness

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'cais/mmlu' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(harness, "evaluate", offline)
    with pytest.raises(SystemExit) as e:
        _run(setup, setup / "offline", "--tasks", "tiny_mc")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "could not download a task's data (Couldn't reach 'cais/mmlu'" in err
    assert "Traceback" not in err


def _remote_task(folder):
    folder.mkdir()
    (folder / "remote_mc.yaml").write_text(
        "task: remote_mc\ndataset_path: nobody-here/no-such-data-set\ntest_split: test\n" + MC
    )
    return folder


def test_offline_a_task_whose_data_is_not_cached_is_one_error_at_once(setup, tmp_path, monkeypatch):
    """Without a network (here: told so) a Hub data set that is not cached is a ValueError at once
    (issue 42, point 5.4: `--tasks mmlu` offline retried for 49 s first); a local one builds; the
    process's offline settings are restored after."""
    import os

    from lm_eval.tasks import TaskManager

    before = {name: os.environ.get(name) for name in harness.OFFLINE}
    manager = TaskManager(
        include_path=[str(_remote_task(tmp_path / "remote")), str(setup / "tasks")], include_defaults=False
    )
    monkeypatch.setattr(harness, "hub_unreachable", lambda timeout=3.0: "huggingface.co:443: no network in this test")
    with harness.offline_when_unreachable() as why:
        assert why == "huggingface.co:443: no network in this test" and os.environ["HF_HUB_OFFLINE"] == "1"
        harness.check_data(["tiny_mc"], manager, why)  # local data: fine offline
        with pytest.raises(
            ValueError,
            match=r"^--tasks remote_mc: a task's data is not in the local cache and the "
            r"Hugging Face Hub cannot be reached \(huggingface.co:443: no network",
        ):
            harness.check_data(["remote_mc"], manager, why)
    assert {name: os.environ.get(name) for name in harness.OFFLINE} == before
    monkeypatch.undo()  # the real check: an offline setting is reason enough, no connection is tried
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert harness.hub_unreachable() == "HF_DATASETS_OFFLINE is set"


@pytest.mark.slow
def test_the_command_fails_before_the_model_loads(setup, tmp_path, monkeypatch, capsys):
    """The same through probmoe-eval --tasks: one line, status 2, no model loaded, nothing written
    (slow: the harness indexes its own tasks first, 1-2 minutes on 2 busy cores)."""
    tasks = _remote_task(tmp_path / "remote")
    monkeypatch.setattr(harness, "hub_unreachable", lambda timeout=3.0: "huggingface.co:443: no network in this test")
    monkeypatch.setattr(harness, "ProbMoELM", lambda *a, **k: pytest.fail("the model loaded before the data check"))
    with pytest.raises(SystemExit) as e:
        evaluate.main(
            [
                "--checkpoint",
                str(setup / "ckpt"),
                "--tasks",
                "remote_mc",
                "--include-path",
                str(tasks),
                "--output",
                str(tmp_path / "out"),
                "--no-progress",
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert (
        "--tasks remote_mc: a task's data is not in the local cache and the Hugging Face Hub cannot be reached "
        "(huggingface.co:443: no network in this test;" in err
    )
    assert not (tmp_path / "out").exists()
