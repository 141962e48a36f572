"""probmoe-train: every family and method trains, the log holds what it should, resume is exact,
and bad input stops the command before any training."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")

from gsm8k_data import write

from probmoe.cli import analyze, evaluate, train
from probmoe.experiments import state


def run(*argv):
    return train.main([*map(str, argv), "--no-progress"])


def weights(path):
    return load_file(os.path.join(path, "model.safetensors"))


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write(tmp_path_factory.mktemp("data"), "train.jsonl", 16)


def test_cli_methods_and_backends_are_their_homes():
    import circuits
    import probmoe.integrations.transformers as pt

    for command in (train, evaluate, analyze):
        choices = {a.dest: a.choices for a in command.parser()._actions}
        assert tuple(choices["method"]) == pt.ALL_METHODS and tuple(choices["algorithm"]) == circuits.ALGORITHMS


@pytest.mark.parametrize(
    "model,method,top_k",
    [
        ("tiny-olmoe", "probmoe", 2),
        ("tiny-qwen2-moe", "probmoe", 2),
        ("tiny-qwen3-moe", "probmoe", 2),
        ("tiny-mixtral", "probmoe", 2),
        ("tiny-deepseek-v3", "probmoe-grouped", 3),
    ],
)
def test_each_family_trains_and_saves_a_loadable_checkpoint(tmp_path, data, model, method, top_k):
    import probmoe.integrations.transformers as pt

    out = tmp_path / "run"
    assert (
        run(
            "--model",
            model,
            "--data",
            data,
            "--output-dir",
            out,
            "--max-steps",
            2,
            "--batch-size",
            2,
            "--method",
            method,
        )
        == 0
    )
    log = [json.loads(line) for line in open(out / "train_log.jsonl")]
    assert log[0]["event"] == "start" and [r["step"] for r in log[1:]] == [1, 2]
    for r in log[1:]:
        assert r["loss"] > 0 and r["tokens_per_s"] > 0 and r["lr"] > 0 and r["answer_tokens"] > 0
        assert len(r["routing"]) == 2 and all(layer["experts_per_token"] == top_k for layer in r["routing"])
    from transformers import AutoModelForCausalLM

    loaded, stock = pt.from_pretrained(str(out)).eval(), AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert loaded.probmoe_plan.method == method
    ids = torch.randint(3, 259, (2, 12))
    if method == "probmoe":
        assert torch.equal(loaded(ids).logits, stock(ids).logits)  # Exact-k MAP at eval is the stock top-k


@pytest.mark.parametrize(
    "method",
    [
        "conventional",
        "probmoe",
        "probmoe-dynamic",
        # test_transformers_deepseek.py trains the other methods in the default run; by probmoe-train, slow
        *(
            pytest.param(m, marks=pytest.mark.slow)
            for m in ("frozen", "densemixer", "sample-dense-ste", "topk-marginal")
        ),
    ],
)
def test_every_method_reduces_the_loss_on_a_repeated_batch(tmp_path, method):
    lines = write(tmp_path, "train.jsonl", 2)
    out = tmp_path / "run"
    run(
        "--model",
        "tiny-olmoe",
        "--data",
        lines,
        "--output-dir",
        out,
        "--method",
        method,
        "--max-steps",
        8,
        "--batch-size",
        2,
        "--lr",
        "3e-3",
        "--lr-schedule",
        "constant",
    )
    losses = [r["loss"] for r in map(json.loads, open(out / "train_log.jsonl")) if "loss" in r]
    assert losses[-1] < losses[0] - 0.05, losses


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_resume_is_exact(tmp_path, data):
    """6 uninterrupted steps = stop after 3, then resume to 6 (bit for bit), with sampled Dynamic-k
    routing from the router generators, gradient accumulation and a decaying LR with warm-up."""
    common_args = [
        "--model",
        "tiny-qwen2-moe",
        "--data",
        data,
        "--batch-size",
        2,
        "--grad-accum",
        2,
        "--method",
        "probmoe-dynamic",
        "--lr-schedule",
        "linear",
        "--warmup-steps",
        2,
        "--max-steps",
        6,
    ]
    run(*common_args, "--output-dir", tmp_path / "a", "--save-every", 3)
    run(*common_args, "--output-dir", tmp_path / "b", "--stop-after", 3)
    assert not (tmp_path / "b" / "model.safetensors").exists()  # stopped: only the checkpoint
    run(*common_args, "--output-dir", tmp_path / "b", "--resume", "latest")
    assert max_diff(weights(tmp_path / "a"), weights(tmp_path / "b")) == 0
    assert max_diff(weights(tmp_path / "a"), weights(tmp_path / "a" / "checkpoint-000003")) > 0
    log_b = [json.loads(line) for line in open(tmp_path / "b" / "train_log.jsonl")]
    assert [r.get("event") for r in log_b if "event" in r] == ["start", "resume"]
    assert [r["step"] for r in log_b if "loss" in r] == [1, 2, 3, 4, 5, 6]
    # from a checkpoint of another folder into a new one
    run(*common_args, "--output-dir", tmp_path / "c", "--resume", tmp_path / "a" / "checkpoint-000003")
    assert max_diff(weights(tmp_path / "a"), weights(tmp_path / "c")) == 0


def test_resume_refuses_other_settings_and_damaged_state(tmp_path, data, capsys):
    args = ["--model", "tiny-olmoe", "--data", data, "--batch-size", 2]
    run(*args, "--max-steps", 2, "--save-every", 1, "--output-dir", tmp_path / "a")
    ckpt = tmp_path / "a" / "checkpoint-000002"
    with pytest.raises(SystemExit) as e:
        run(*args, "--max-steps", 2, "--output-dir", tmp_path / "b", "--resume", ckpt, "--lr", "0.5")
    assert e.value.code == 2 and "--lr: checkpoint 0.001, now 0.5" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a linear schedule over 2 steps does not continue to 3
        run(*args, "--max-steps", 3, "--output-dir", tmp_path / "b", "--resume", ckpt)
    assert (
        "the learning-rate schedule's steps (--max-steps or --epochs): checkpoint 2, now 3" in capsys.readouterr().err
    )

    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "a").rglob("*")}
    with pytest.raises(SystemExit):  # the same folder again without --resume
        run(*args, "--max-steps", 2, "--output-dir", tmp_path / "a")
    assert "is not empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # an older checkpoint into its own folder would overwrite the newer
        run(*args, "--max-steps", 2, "--output-dir", tmp_path / "a", "--resume", tmp_path / "a" / "checkpoint-000001")
    assert "not its newest checkpoint" in capsys.readouterr().err
    assert before == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "a").rglob("*")}  # nothing touched
    for name in ("model.safetensors", state.STATE):
        damaged = tmp_path / f"damaged-{name}"
        shutil.copytree(ckpt, damaged)
        with open(damaged / name, "ab") as f:
            f.write(b"tampered")
        with pytest.raises(SystemExit):
            run(*args, "--max-steps", 2, "--output-dir", tmp_path / "c", "--resume", damaged)
        assert f"{name} is missing or does not match its checksum" in capsys.readouterr().err
    (ckpt / state.MANIFEST).write_text("{not json")
    with pytest.raises(SystemExit):
        run(*args, "--max-steps", 2, "--output-dir", tmp_path / "c", "--resume", ckpt)
    assert "unreadable" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_bf16_and_gradient_checkpointing_train(tmp_path, data):
    run(
        "--model",
        "tiny-qwen3-moe",
        "--data",
        data,
        "--output-dir",
        tmp_path / "r",
        "--max-steps",
        2,
        "--batch-size",
        2,
        "--bf16",
        "--gradient-checkpointing",
    )
    losses = [r["loss"] for r in map(json.loads, open(tmp_path / "r" / "train_log.jsonl")) if "loss" in r]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


def _bad(tmp_path, capsys, *argv):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        run("--model", "tiny-olmoe", "--output-dir", out, "--max-steps", 1, *argv)
    assert e.value.code == 2
    assert not out.exists(), "the command wrote before it checked its input"
    return capsys.readouterr().err


def test_resume_refuses_the_same_file_read_as_another_format(tmp_path, capsys):
    """A file with the fields of two formats, trained as question/answer, resumed as plain text:
    other examples, so refused with the difference named."""
    path = tmp_path / "both.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"what is {i} + 1?", "answer": f"{i + 1}", "text": f"{i} plus one is {i + 1}"})
            + "\n"
            for i in range(16)
        )
    )
    args = ["--model", "tiny-olmoe", "--data", path, "--batch-size", 2, "--max-steps", 2, "--save-every", 1]
    run(*args, "--output-dir", tmp_path / "a", "--data-format", "question-answer", "--stop-after", 1)
    with pytest.raises(SystemExit) as e:
        run(*args, "--output-dir", tmp_path / "a", "--resume", "latest", "--data-format", "text")
    assert e.value.code == 2
    assert "--data-format: checkpoint 'question-answer', now 'text'" in capsys.readouterr().err


def test_resume_refuses_other_balancing(tmp_path, data, capsys):
    """The balancing option and its rate change the trajectory: a resume must match them."""
    args = [
        "--model",
        "tiny-olmoe",
        "--data",
        data,
        "--batch-size",
        2,
        "--max-steps",
        2,
        "--save-every",
        1,
        "--output-dir",
        tmp_path / "a",
        "--balance",
        "aux-free",
    ]
    run(*args, "--balance-rate", "0.01", "--stop-after", 1)
    with pytest.raises(SystemExit) as e:
        run(*args, "--balance-rate", "0.02", "--resume", "latest")
    assert e.value.code == 2
    assert "--balance-rate: checkpoint 0.01, now 0.02" in capsys.readouterr().err


def test_a_changed_max_steps_on_resume_is_named_by_its_flags(tmp_path, data, capsys):
    """The learning-rate schedule's length is the fingerprint's ``schedule_steps``; the user typed
    --max-steps (issue 42, point 5.9)."""
    args = [
        "--model",
        "tiny-olmoe",
        "--data",
        data,
        "--batch-size",
        2,
        "--save-every",
        1,
        "--output-dir",
        tmp_path / "a",
    ]
    run(*args, "--max-steps", 2, "--stop-after", 1)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run(*args, "--max-steps", 3, "--resume", "latest")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "the learning-rate schedule's steps (--max-steps or --epochs): checkpoint 2, now 3" in err
    assert "schedule_steps" not in err


def test_flag_errors_name_flags_not_the_python_arguments(tmp_path, capsys, data):
    """patch_model's messages name its arguments (balance_rate, balance='aux-free'); the command's
    line names the flags; --stop-after past the last step is refused, not accepted silently."""
    err = _bad(tmp_path, capsys, "--data", data, "--balance-rate", "0.01")
    assert "--balance-rate applies only with --balance aux-free" in err and "balance_rate" not in err
    err = _bad(tmp_path, capsys, "--data", data, "--stop-after", 5)
    assert "--stop-after must be between 1 and the run's last step 1 (--max-steps), got 5" in err


def test_bad_input_is_refused_before_training(tmp_path, capsys, data):
    assert "does not exist" in _bad(tmp_path, capsys, "--data", tmp_path / "missing.jsonl")
    (tmp_path / "noq.jsonl").write_text('{"question": "q", "answer": "a"}\n{"answer": "4"}\n')
    assert "noq.jsonl:2" in _bad(tmp_path, capsys, "--data", tmp_path / "noq.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert "holds no records" in _bad(tmp_path, capsys, "--data", tmp_path / "empty.jsonl")
    assert "invalid choice" in _bad(tmp_path, capsys, "--data", data, "--method", "top1")
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text('{"model_type": "llama"}')
    err = _bad(tmp_path, capsys, "--data", data, "--model", llama)
    assert "'llama'" in err and "olmoe" in err and "mixtral" in err
    assert "is not" in _bad(tmp_path, capsys, "--data", data, "--model", "tiny-gpt")
    assert "kmin must be <= kmax" in _bad(
        tmp_path, capsys, "--data", data, "--method", "probmoe-dynamic", "--kmin", 2, "--kmax", 1
    )
    assert "k must be in [1, 8]" in _bad(tmp_path, capsys, "--data", data, "--k", 9)
    assert "fewer than one global batch" in _bad(tmp_path, capsys, "--data", data, "--batch-size", 17)
    assert "--batch-size" in _bad(tmp_path, capsys, "--data", data, "--batch-size", 0)
    (tmp_path / "latin1.jsonl").write_bytes(b'{"question": "caf\xe9", "answer": "1"}\n')
    assert "not UTF-8" in _bad(tmp_path, capsys, "--data", tmp_path / "latin1.jsonl")
    assert "leaves no answer token" in _bad(tmp_path, capsys, "--data", data, "--max-length", 5)
