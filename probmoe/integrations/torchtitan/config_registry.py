"""torchtitan's trainer with ProbMoE routing, from its own entry point (torchtitan 0.3.0):

    torchrun --nproc-per-node 2 -m torchtitan.train --module probmoe.integrations.torchtitan \\
        --config probmoe_qwen3_moe_debug --parallelism.expert_parallel_degree 2 --hf_assets_path DIR

``--module`` imports this module (``<module>.config_registry``); ``--config`` names one of the
functions below, which return torchtitan's own debug configs with every router swapped for
``ProbMoERouter`` (``use_probmoe``: Dynamic-k ``kmin``..top_k, a per-rank seed) and the trainer
made ``ProbMoETrainer`` (used-slot counts for the aux-free bias; the CPU where no accelerator is),
CUDA graphs off (torchtitan refuses them with its standard EP dispatcher; ProbMoE's routing was not
run under graph capture).
Every other option is torchtitan's and its CLI overrides it (``--training.steps``, ...).
"""

from __future__ import annotations

from dataclasses import fields, replace

from .swap import use_probmoe
from .tiny import tiny_qwen3_moe
from .trainer import ProbMoETrainer

KMIN, SEED = 1, 0


def probmoe_qwen3_moe_debug() -> ProbMoETrainer.Config:
    """torchtitan's ``qwen3_moe_debug`` (8 layers, 64 experts, top-8) routed by ProbMoE, Dynamic-k 1..8."""
    from torchtitan.models.qwen3.config_registry import qwen3_moe_debug

    return probmoe_trainer_config(qwen3_moe_debug())


def probmoe_deepseek_v3_debug() -> ProbMoETrainer.Config:
    """torchtitan's ``deepseek_v3_debugmodel`` routed by ProbMoE, Dynamic-k 1..its top_k."""
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel

    return probmoe_trainer_config(deepseek_v3_debugmodel())


def probmoe_qwen3_moe_tiny() -> ProbMoETrainer.Config:
    """``probmoe_qwen3_moe_debug`` shrunk to run on a CPU: torchtitan's Qwen3-MoE blocks, 2 layers, dim
    64, 8 experts, top-4 (Dynamic-k 1..4), vocabulary 512, sequences of 128, SDPA causal attention
    (torch's FlexAttention has no CPU backward; torchtitan then passes no document masks), torchtitan's
    CPU-ready ``partial_dtensor`` backend. Its tokenizer and data are the caller's (``--hf_assets_path``,
    ``--dataloader.dataset_path``: a folder of JSON lines with a "text" field, read as torchtitan's
    ``c4_test``)."""
    from torchtitan.models.qwen3.config_registry import qwen3_moe_debug

    vocab, seq_len = 512, 128
    model = tiny_qwen3_moe(vocab=vocab, dim=64, num_experts=8, top_k=4, max_seq_len=seq_len)
    config = qwen3_moe_debug()
    config.model_spec = replace(config.model_spec, model=model, flavor="probmoe_tiny")
    config.loss.loss_fn.global_vocab_size = vocab
    config.training.seq_len, config.training.local_batch_size, config.training.steps = seq_len, 2, 4
    config.parallelism.spmd_backend = "partial_dtensor"
    config.checkpoint.enable = False
    return probmoe_trainer_config(config)


def probmoe_trainer_config(config, *, kmin: int = KMIN, seed: int = SEED) -> ProbMoETrainer.Config:
    """A torchtitan ``Trainer.Config`` as a ``ProbMoETrainer.Config`` whose model is routed by
    ``ProbMoERouter`` (``use_probmoe(..., kmin=kmin, seed=seed)``, in place on its model config),
    CUDA graphs off."""
    use_probmoe(config.model_spec.model, kmin=kmin, seed=seed)
    config.training.disable_cuda_graphs = True
    return ProbMoETrainer.Config(**{f.name: getattr(config, f.name) for f in fields(config) if f.init})
