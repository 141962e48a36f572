"""torchtitan's own entry with ProbMoE routing: ``torchrun -m torchtitan.train --module
probmoe.integrations.torchtitan --config ...`` (torchtitan 0.3.0). The config functions swap every
router and keep the rest of torchtitan's configs; the tiny one trains 4 steps under EP = 2 on gloo,
2 CPU processes, through torchtitan's own trainer (slow: about a minute on 2 cores)."""

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("torchdata")  # torchtitan's dataloader

from torchtitan.config import ConfigManager
from torchtitan.models.common.attention import FlexAttention
from torchtitan.models.common.moe import MoE, TokenChoiceTopKRouter
from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel
from torchtitan.models.qwen3.config_registry import qwen3_moe_debug

from probmoe.integrations.torchtitan import ProbMoERouter
from probmoe.integrations.torchtitan import config_registry as registry
from probmoe.integrations.torchtitan.cpu import CPUMemoryMonitor
from probmoe.integrations.torchtitan.trainer import ProbMoETrainer

ROOT = Path(__file__).resolve().parents[2]


def routers(config):
    return [cfg for _, cfg, _, _ in config.model_spec.model.traverse(TokenChoiceTopKRouter.Config)]


@pytest.mark.parametrize(
    "ours,theirs",
    [(registry.probmoe_qwen3_moe_debug, qwen3_moe_debug), (registry.probmoe_deepseek_v3_debug, deepseek_v3_debugmodel)],
    ids=["qwen3-moe", "deepseek-v3"],
)
def test_the_debug_configs_are_torchtitans_routed_by_probmoe(ours, theirs):
    got, want = ours(), theirs()
    assert isinstance(got, ProbMoETrainer.Config) and got.training.disable_cuda_graphs
    mine, stock = routers(got), routers(want)
    assert len(mine) == len(stock) > 0
    for new, old in zip(mine, stock):
        assert type(new) is ProbMoERouter.Config and (new.kmin, new.seed) == (registry.KMIN, registry.SEED)
        for f in fields(old):  # param_init: partials made anew each call, equal in repr only
            assert repr(getattr(new, f.name)) == repr(getattr(old, f.name)), f.name
    for name in ("training", "optimizer", "lr_scheduler", "parallelism", "dataloader", "checkpoint"):
        if name == "training":
            want.training.disable_cuda_graphs = True
        assert getattr(got, name) == getattr(want, name), name


def test_the_cli_loads_the_tiny_config():
    """What ``torchrun -m torchtitan.train`` does with its arguments, before training."""
    config = ConfigManager().parse_args(
        ["--module", "probmoe.integrations.torchtitan", "--config", "probmoe_qwen3_moe_tiny"]
        + ["--parallelism.expert_parallel_degree", "2", "--training.steps", "3"]
    )
    assert isinstance(config, ProbMoETrainer.Config)
    assert (config.parallelism.expert_parallel_degree, config.training.steps) == (2, 3)
    assert config.parallelism.spmd_backend == "partial_dtensor"
    assert not list(config.model_spec.model.traverse(FlexAttention.Config))  # no flex backward on the CPU
    for _, moe, _, _ in config.model_spec.model.traverse(MoE.Config):
        assert type(moe.router) is ProbMoERouter.Config and (moe.router.kmin, moe.router.top_k) == (1, 4)
        assert moe.routed_experts.token_dispatcher.top_k == 4 and moe.load_balance_coeff  # aux-free on


def test_cpu_memory_monitor():
    monitor = CPUMemoryMonitor()
    stats = monitor.get_peak_stats()
    assert 0.01 < stats.max_reserved_gib < monitor.device_capacity_gib  # this process's peak RSS
    assert stats.max_active_pct == stats.max_reserved_pct == 100 * stats.max_reserved_gib / monitor.device_capacity_gib


def tiny_assets(folder: Path) -> tuple[Path, Path]:
    """A byte-level BPE tokenizer (vocabulary 300 < the model's 512) and 64 lines of arithmetic text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    lines = [f"{a} plus {b} is {a + b}, and {a} times {b} is {a * b}." for a in range(8) for b in range(8)]
    data, tok = folder / "data", folder / "tokenizer"
    data.mkdir()
    tok.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer.train_from_iterator(
        lines, trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet, special_tokens=specials)
    )
    tokenizer.save(str(tok / "tokenizer.json"))
    (tok / "tokenizer_config.json").write_text(json.dumps({"bos_token": specials[0], "eos_token": specials[1]}))
    return tok, data


@pytest.mark.slow
def test_torchtitan_train_runs_probmoe_with_ep2_on_gloo(tmp_path):
    tok, data = tiny_assets(tmp_path)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "torchtitan.train", "--module", "probmoe.integrations.torchtitan"]
    command += ["--config", "probmoe_qwen3_moe_tiny", "--parallelism.expert_parallel_degree", "2"]
    command += ["--hf_assets_path", str(tok), "--dataloader.dataset_path", str(data)]
    command += ["--dump_folder", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    log = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)
    assert run.returncode == 0, log[-4000:]
    assert log.count("ProbMoE: 2 MoE layers count used slots only") == 2  # each rank's 2 layers
    losses = [float(x) for x in re.findall(r"step:\s+\d+\s+loss:\s+([-\d.e+]+)", log)]
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses)  # 4 steps, logged by both ranks
    assert losses[-1] < losses[0]
