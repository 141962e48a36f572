"""Expert parallelism around the ProbMoE router: the per-rank sampling generator, the EP degree check,
and torchtitan's own EP sharding applied to one model (its ``parallelize``), also on a CPU.

Draws under data parallelism (``probmoe.integrations.scale_out``): a router with ``seed`` s draws on
global rank r from a generator seeded s · 1,000,003 + r, so a run repeats its draws and two
data-parallel ranks (which see different tokens, EP ranks included: torchtitan's EP borrows the
data-parallel ranks) draw independently. Ranks that see the same tokens (tensor parallelism) would
need the same seed: not supported here (the router needs plain, not DTensor, hidden states).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from probmoe.integrations.scale_out import rank_generator, rank_seed  # noqa: F401 (re-exported)


def check_expert_parallel(num_experts: int, ep_degree: int, where: str = "") -> None:
    """ValueError unless ``ep_degree`` >= 1 divides ``num_experts`` (each EP rank holds E / EP experts)."""
    if not isinstance(ep_degree, int) or ep_degree < 1:
        raise ValueError(f"expert_parallel_degree must be an int >= 1, got {ep_degree!r}")
    if num_experts % ep_degree:
        at = f" of {where}" if where else ""
        raise ValueError(
            f"expert_parallel_degree = {ep_degree} must divide num_experts = {num_experts}{at} "
            f"(each EP rank holds num_experts / expert_parallel_degree experts)"
        )


def is_expert_parameter(p: torch.Tensor) -> bool:
    """Whether ``p`` is sharded over the expert-parallel ranks (a DTensor on a mesh with an "ep" axis):
    its gradient already sums the tokens of every rank (the all-to-all brought them), so it needs no
    data-parallel reduction, where a dense parameter's does."""
    mesh = getattr(p, "device_mesh", None)
    return mesh is not None and "ep" in (mesh.mesh_dim_names or ())


def use_cpu_device() -> None:
    """Make torchtitan 0.3.0 build its meshes and token exchanges on the CPU (gloo). Without an
    accelerator it assumes "cuda" (``torchtitan.tools.utils.get_device_info``), which fails in
    ``ParallelDims.build_mesh``; this sets the module-level ``device_type`` / ``device_module`` of
    the modules that read them to the CPU's. For tests and CPU runs only."""
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.models.common.token_dispatcher as token_dispatcher
    import torchtitan.tools.utils as tool_utils

    for module in (tool_utils, parallel_dims, token_dispatcher, dist_utils):
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = torch.cpu


def expert_parallel(
    model: torch.nn.Module,
    model_config,
    ep_degree: int,
    *,
    dp_shard: int | None = None,
    spmd_backend: str = "partial_dtensor",
):
    """Shard the routed experts of a built ``model`` over ``ep_degree`` ranks with torchtitan's own
    plan (``set_moe_sharding_config`` on every ``MoE.Config`` of ``model_config`` must have been
    applied before building: ``expert_parallel_config``), through ``Module.parallelize``; returns
    the ``ParallelDims``. Needs torch.distributed initialised; ``dp_shard`` defaults to the world size.
    The experts become DTensors sharded on dim 0; the dispatcher exchanges tokens by all-to-all."""
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.parallel_dims import ParallelDims

    world = dist.get_world_size()
    for fqn, moe in _moe_configs(model_config):
        check_expert_parallel(moe.num_experts, ep_degree, fqn or "the MoE")
    dist_utils.set_spmd_backend(spmd_backend)
    dims = ParallelDims(
        dp_replicate=1,
        dp_shard=world if dp_shard is None else dp_shard,
        cp=1,
        tp=1,
        pp=1,
        ep=ep_degree,
        world_size=world,
        spmd_backend=spmd_backend,
    )
    dims.build_mesh()
    model.parallelize(dims)
    return dims


def expert_parallel_config(model_config, ep_degree: int) -> None:
    """Prepare ``model_config`` for ``expert_parallel``: check that ``ep_degree`` divides every MoE's
    experts, use the all-to-all token dispatcher, and set torchtitan's MoE sharding configs."""
    import spmd_types as spmd
    from torchtitan.models.common.moe_sharding import set_moe_sharding_config
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    for fqn, moe in _moe_configs(model_config):
        check_expert_parallel(moe.num_experts, ep_degree, fqn or "the MoE")
        old = moe.routed_experts.token_dispatcher
        moe.routed_experts.token_dispatcher = AllToAllTokenDispatcher.Config(
            num_experts=old.num_experts, top_k=old.top_k
        )
        set_moe_sharding_config(
            moe,
            enable_ep=ep_degree > 1,
            enable_sp=False,
            expert_param_layout={"w1_EFD": spmd.S(1), "w2_EDF": spmd.S(2), "w3_EFD": spmd.S(1)},
        )


def _moe_configs(model_config):
    from torchtitan.models.common.moe import MoE

    return [(fqn, cfg) for fqn, cfg, _, _ in model_config.traverse(MoE.Config)]
