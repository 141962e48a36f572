"""Inputs that were taken silently or refused late (issue 48, point 8): --batch-size with a
--global-batch-size it disagrees with, a --seed no RNG takes, and probmoe-launch with no arguments;
each is one line naming the flags and what is allowed, status 2, before any model is built."""

import json

import pytest

pytest.importorskip("transformers")

from probmoe.cli import launch, train
from probmoe.experiments import config_parser, memory_plan, trainer
from probmoe.experiments.run_config import OptimOptions, TrainConfig

QA = [{"question": f"{i}+{i}?", "answer": f"{2 * i}"} for i in range(4)]
SEED_RANGE = "must be an integer from 0 to 4294967295"


@pytest.fixture
def base(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in QA), encoding="utf-8")
    return ["--model", "tiny-olmoe", "--data", str(data), "--output-dir", str(tmp_path / "run"), "--no-progress"]


@pytest.fixture
def no_model(monkeypatch):
    """Building a model fails the test: the refusals come before it."""

    def built(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(trainer.Trainer, "_build_model", built)


def refused(capsys, argv) -> str:
    """The one line ``probmoe-train argv`` ends with (status 2)."""
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_batch_size_the_global_batch_size_disagrees_with_is_refused(base, capsys, no_model, tmp_path):
    err = refused(capsys, [*base, "--batch-size", "2", "--global-batch-size", "3"])
    assert err.startswith(
        "probmoe-train: error: --batch-size 2 and --global-batch-size 3 disagree: 3 over 1 process(es) x "
        "--grad-accum 1 is --batch-size 3; give one of the two"
    ), err
    err = refused(capsys, [*base, "--plan", "--batch-size", "4", "--global-batch-size", "4", "--grad-accum", "2"])
    assert "--batch-size 4 and --global-batch-size 4 disagree" in err and "is --batch-size 2" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "given, per_process",
    [
        ({"batch_size": 2, "global_batch_size": 8, "grad_accum": 2}, 2),  # 8 over 2 processes x 2 micro-batches
        ({"global_batch_size": 12}, 6),
        ({"batch_size": 3}, 3),
        ({}, 8),  # neither: the default
    ],
)
def test_a_batch_size_that_agrees_or_is_left_out_is_taken(given, per_process):
    assert memory_plan.per_process_batch(OptimOptions(**given), world_size=2) == per_process


def test_plan_takes_the_global_batch_size(capsys):
    argv = ["--model", "tiny-olmoe", "--plan", "--batch-size", "2", "--global-batch-size", "4", "--grad-accum", "2"]
    assert train.main(argv) == 0
    assert "1 process(es), batch 2 x 1024" in capsys.readouterr().out


def test_the_config_file_of_a_global_batch_run_reads_back(tmp_path):
    """config.yaml holds the resolved --batch-size beside --global-batch-size; they agree."""
    cfg = config_parser.parse(TrainConfig, train.parser(), ["--model", "tiny-olmoe", "--global-batch-size", "4"])
    cfg.optim.batch_size = memory_plan.per_process_batch(cfg.optim, 1)  # as the Trainer resolves it
    config_parser.write(cfg, str(tmp_path / "config.yaml"))
    written = (tmp_path / "config.yaml").read_text()
    assert "batch-size: 4\n" in written and "global-batch-size: 4\n" in written
    again = config_parser.parse(TrainConfig, train.parser(), ["--config", str(tmp_path / "config.yaml")])
    assert memory_plan.per_process_batch(again.optim, 1) == 4


@pytest.mark.parametrize("seed", [str(2**70), str(2**32), "-1", "2**70"])
def test_a_seed_out_of_range_fails_at_parsing_naming_the_range(base, capsys, no_model, seed, tmp_path):
    err = refused(capsys, [*base, "--seed", seed])
    shown = repr(seed) if "*" in seed else seed
    assert err == f"probmoe-train: error: argument --seed: {SEED_RANGE}, got {shown} (see probmoe-train --help)\n"
    config = tmp_path / "run.yaml"
    config.write_text(f"seed: {2**70}\n")
    err = refused(capsys, [*base, "--config", str(config)])
    assert f"--config {str(config)!r}: seed: {SEED_RANGE}, got {2**70}" in err
    assert not (tmp_path / "run").exists()


def test_the_largest_seed_trains(base):
    """The top of the range is one every RNG the run seeds takes (Python's, NumPy's, torch's)."""
    assert train.main([*base, "--seed", str(2**32 - 1), "--max-steps", "1", "--batch-size", "2"]) == 0


def test_probmoe_eval_takes_the_same_seed_range(capsys):
    from probmoe.cli import evaluate

    with pytest.raises(SystemExit) as e:
        evaluate.main(["--checkpoint", "x", "--tasks", "mmlu", "--seed", str(2**40)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument --seed: {SEED_RANGE}, got {2**40}" in err and err.count("\n") == 1


def test_probmoe_launch_without_arguments_is_a_one_line_usage_error(capsys):
    assert launch.main([]) == 2
    err = capsys.readouterr().err
    assert err == (
        "probmoe-launch: error: give torchrun's options and what to run: probmoe-launch [torchrun options] "
        "(-m MODULE | SCRIPT) [ARGS...] (see torchrun --help)\n"
    )


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--nproc_per_node", "2"], "the following arguments are required: training_script"),
        (["--no-such-option", "1", "-m", "probmoe.cli.train"], "unrecognized arguments: --no-such-option"),
    ],
)
def test_torchruns_own_argument_errors_are_one_line(capsys, argv, says):
    assert launch.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"probmoe-launch: error: {says}") and "usage" not in err, err
