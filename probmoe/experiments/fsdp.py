"""``probmoe-train --fsdp``: the model sharded over the ranks with torch's FSDP2 (``fully_shard``).

The model is built on the meta device on every rank, patched, given activation checkpointing,
then each decoder layer and the root are ``fully_shard``-ed, and only then do parameters get
storage: each rank holds 1/W of every parameter (``models.materialize``: rank 0 produces one
full tensor at a time, from the built-in initialiser or a checkpoint loaded by transformers in
the stored dtype, and scatters it). With ``--bf16`` the layers compute in bf16 from fp32 shards
and reduce gradients in fp32 (``MixedPrecisionPolicy``); gradients are averaged over ranks, as
DDP does, so the loss scaling of ``trainer`` holds unchanged.

Checkpoints: the model and AdamW shards go through ``torch.distributed.checkpoint`` (one
``__<rank>_0.distcp`` file per rank and ``.metadata``), resharded on load, with each rank's
routing state (``rank_routing_state``); the final model is
gathered to rank 0 and written by ``save_pretrained`` as a stock transformers checkpoint with
``probmoe_routing.json``.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

from . import models


def require_torchrun() -> None:
    """ValueError unless this process was started by torchrun (``WORLD_SIZE`` set)."""
    if "WORLD_SIZE" not in os.environ:
        raise ValueError(
            "--fsdp shards the model over processes: start it under torchrun, e.g. `torchrun "
            "--nproc_per_node 8 -m probmoe.cli.train ... --fsdp`, or drop --fsdp to train in one process"
        )


def shard(model, world, bf16: bool) -> None:
    """``fully_shard`` every decoder layer, then the root (embeddings, final norm, LM head), over
    all ranks; ``bf16``: bf16 compute with fp32 gradient reduction."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(world.device.type, (world.size,))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def weights_source(path: str, seed: int, dtype: torch.dtype, meta_model, layers: int | None, world, fresh: bool):
    """``name -> full CPU tensor`` for ``models.materialize`` (called on rank 0 only): the tiny
    model's weights, the published shape's initialiser, or the checkpoint's weights in ``dtype``
    (loaded once, on rank 0); None when not ``fresh`` (a resume reads every value from its shards)."""
    if not fresh:
        return None
    if path in models.SHAPES:
        return lambda name: models.initial_tensor(meta_model, name, seed)
    weights = models.load_model(path, seed, dtype, layers).state_dict() if world.main else {}
    return weights.__getitem__


def build(
    path: str,
    *,
    seed: int,
    dtype: torch.dtype,
    layers: int | None,
    world,
    patch,
    checkpointing: bool,
    bf16: bool,
    fresh: bool,
):
    """The sharded model on ``world.device``: meta build, ``patch(model)``, activation checkpointing,
    ``shard``, then ``materialize``; no rank holds all of it at any point (rank 0 one tensor at a
    time, plus the whole source model when it is a checkpoint or a tiny model)."""
    model = models.empty_model(models.model_config(path, layers), dtype)
    patch(model)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    shard(model, world, bf16)
    models.materialize(model, weights_source(path, seed, dtype, model, layers, world, fresh), world.device)
    return model


def save_shards(directory: str, model, optimizer) -> None:
    """Every rank writes its model and AdamW shards into ``directory`` (collective), and its own
    copy of the routing state (``rank_routing_state``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state, **rank_routing_state(model)}, checkpoint_id=directory)


def load_shards(directory: str, model, optimizer) -> None:
    """Read the shards ``save_shards`` wrote into ``model`` and ``optimizer`` (model and AdamW at
    any world size; the routing state per rank, at the world size that wrote it, which a resume
    checks)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state, **rank_routing_state(model)}
    old = _without_missing_routing_state(state, dcp.FileSystemReader(directory).read_metadata(), directory)
    dcp.load(state, checkpoint_id=directory)
    with warnings.catch_warnings():
        if old:  # the model's hint about probmoe_state.safetensors: such a checkpoint has none
            warnings.filterwarnings("ignore", message=r".*\(routing state\) are not in the state dict")
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if "routing" in state:  # after set_state_dict, which sets rank 0's copy from the model shards
        from probmoe.integrations.transformers import runtime_state

        with torch.no_grad():
            for name, buf in runtime_state.state_buffers(model).items():
                buf.copy_(state["routing"][routing_key()][name])


def _without_missing_routing_state(state: dict, metadata, directory: str) -> bool:
    """Checkpoints written before the routing state went into the shards hold none of it: leave it
    out of ``state`` (the model's values stay: the initial ones) with one warning (rank 0), so such a
    checkpoint resumes (not exactly, as the warning says) instead of failing in the load. Any other
    missing key still fails there. Whether the checkpoint was such a one."""
    from probmoe.integrations.transformers import runtime_state

    stored = metadata.state_dict_metadata  # flattened keys: "model.<fqn>", "routing.rank<r>.<name>"
    missing = [key for key in state["model"] if runtime_state.is_state_key(key) and f"model.{key}" not in stored]
    if not missing:
        return False
    for key in missing:
        del state["model"][key]
    state.pop("routing", None)
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print(
            f"warning: {directory} was written before FSDP checkpoints kept the routing state "
            f"({len(missing)} buffers, e.g. {missing[0]}): it starts from its initial values, so this "
            "resume is not exact",
            file=sys.stderr,
        )
    return True


def routing_key() -> str:
    import torch.distributed as dist

    return f"rank{dist.get_rank()}"


def rank_routing_state(model) -> dict:
    """{"routing": {"rank<r>": {name: copy of the buffer}}} for this rank r, or {} for a model
    without routing state. The model shards hold one copy of it (the buffers are replicated, not
    sharded), but DefaultMoE's default outputs follow each rank's own tokens (FSDP, unlike DDP,
    never broadcasts buffers), so each rank keeps its own to resume exactly."""
    from probmoe.integrations.transformers import runtime_state

    buffers = runtime_state.state_buffers(model)
    if not buffers:
        return {}
    return {"routing": {routing_key(): {name: buf.detach().clone() for name, buf in buffers.items()}}}


def stock_architecture(model) -> str:
    """The stock class name config.json's ``architectures`` must hold (not FSDP's wrapper class)."""
    return model.probmoe_family.prefix + "ForCausalLM"


def save_config(directory: str, model) -> None:
    """config.json with the stock ``architectures`` (a probmoe name where no stock engine serves the
    rule: ``architecture``) and ``probmoe_routing.json`` (rank 0)."""
    from probmoe.integrations.transformers import architecture, settings

    model.config.architectures = [stock_architecture(model)]
    model.config.save_pretrained(directory)
    settings.write(directory, model.probmoe_plan, model.probmoe_family.model_type)
    architecture.write(directory, model.probmoe_plan, model.probmoe_family.model_type)


def save_final(directory: str, model, world) -> None:
    """Gather the full model to rank 0 (collective; on the CPU) and write it there as a stock
    transformers checkpoint with ``probmoe_routing.json``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if world.main:
        model.save_pretrained(directory, state_dict=full)
        save_config(directory, model)  # save_pretrained names FSDP's wrapper class in "architectures"
