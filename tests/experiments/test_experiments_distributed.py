"""probmoe-train under torchrun --nproc_per_node 2 (gloo, CPU): both ranks end with identical
parameters, and with deterministic routing they equal one process on the same global batch."""

import pytest
import torch

pytest.importorskip("transformers")

from gsm8k_data import write
from rank_runs import run_ranks

# Runs probmoe-train's Trainer on each rank, then saves that rank's parameters for the test.
RANK_SCRIPT = """
import os, sys, torch
from probmoe.cli import train
from probmoe.experiments.trainer import Trainer
holder = {}
original_run = Trainer.run
def run(self):
    record = original_run(self)
    torch.save({k: v.detach().clone() for k, v in self.net.state_dict().items()},
               os.path.join(sys.argv[1], f"params_rank{self.world.rank}.pt"))
    return record
Trainer.run = run
sys.exit(train.main(sys.argv[2:]))
"""


def launch(tmp_path, nproc, argv):
    run_ranks(tmp_path, nproc, RANK_SCRIPT, argv, torchrun_it=nproc > 1, timeout=300)
    return [torch.load(tmp_path / f"params_rank{r}.pt") for r in range(nproc)]


@pytest.mark.parametrize("method", [pytest.param("conventional", marks=pytest.mark.slow), "probmoe"])
def test_two_ranks_agree_and_match_one_process(tmp_path, method):
    data = write(tmp_path, "train.jsonl", 16)
    args = [
        "--model",
        "tiny-olmoe",
        "--data",
        data,
        "--method",
        method,
        "--max-steps",
        "3",
        "--aux-loss",
        "0",
        "--no-progress",
        "--seed",
        "3",
    ]
    (tmp_path / "ddp").mkdir()
    (tmp_path / "one").mkdir()
    ranks = launch(tmp_path / "ddp", 2, [*args, "--batch-size", "2", "--output-dir", str(tmp_path / "ddp" / "out")])
    for name in ranks[0]:
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # all-reduced gradients: identical steps
    log = (tmp_path / "ddp" / "out" / "train_log.jsonl").read_text().splitlines()
    assert len(log) == 4  # rank 0 alone logs: a start line and 3 steps
    if method != "conventional":
        return  # each rank draws its own routes: no single-process run takes the same steps
    (one,) = launch(tmp_path / "one", 1, [*args, "--batch-size", "4", "--output-dir", str(tmp_path / "one" / "out")])
    from probmoe.experiments.models import load_model

    initial = load_model("tiny-olmoe", seed=3).state_dict()
    moved = max((initial[k] - one[k]).abs().max().item() for k in one)
    diff = max((ranks[0][k] - one[k]).abs().max().item() for k in one)
    assert diff < 1e-5 and moved > 1e-3, (diff, moved)  # the same steps, and the steps did move
