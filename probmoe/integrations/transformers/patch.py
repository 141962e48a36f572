"""``patch_model`` / ``unpatch_model`` / ``from_pretrained`` / ``router_stats``.

Patching changes classes, never modules or parameters: each MoE block's ``gate`` becomes a
``PatchedGate`` subclass of its own router class, dynamic-k experts become ``SkippingExperts``,
and the top-level model a same-named subclass that adds the aux losses and the settings file.
Unpatching sets the classes back and removes every added attribute, so the model routes as stock
again, bit for bit.
"""

from __future__ import annotations

import os

import torch

from circuits import checks

from .. import final_model
from ..routing_options import RoutingOptions
from . import experts as experts_mod
from . import gate as gate_mod
from . import model as model_mod
from . import runtime_state, settings, trainer_resume
from .families import family_of
from .methods import make_plan
from .weights_file import check_weights_files


def is_patched(model) -> bool:
    """Whether ``model`` is patched by ``patch_model`` (its class is a ``PatchedModel``)."""
    return isinstance(model, model_mod.PatchedModel)


def patch_model(
    model,
    method: str | None = None,
    *,
    options: RoutingOptions | None = None,
    generator: torch.Generator | None = None,
    **values,
):
    """Patch every MoE block of a transformers 5.x ``olmoe``, ``qwen2_moe``, ``qwen3_moe``,
    ``mixtral`` or ``deepseek_v3`` model in place to route by ``method``; returns the model.

    The routing is ``options`` (a ``RoutingOptions``, ``probmoe.integrations.routing_options``), or
    ``method`` and the options' fields as keywords (``patch_model(model, "probmoe-dynamic", kmin=1,
    kmax=4)``): the keywords are the fields, whose defaults, checks and help are declared there. In
    short:

    method: "conventional", "frozen", "densemixer", "probmoe", "probmoe-dynamic",
        "sample-dense-ste", "topk-marginal", "defaultmoe", "sparsemixer" or "remoe" (see
        docs/transformers.md for what each does; "sparsemixer" and "remoe" are not defined for
        ``deepseek_v3``); for ``deepseek_v3`` also "probmoe-grouped": exactly k experts from at
        most ``topk_group`` of the ``n_group`` expert groups, the model's own limit
        (docs/constraints.md).
    k: experts per token of the exactly-k ProbMoE methods (default: the model's
        ``num_experts_per_tok``); kmin, kmax: the range of "probmoe-dynamic" (default 1 and the
        model's top-k).
    backend, grad: as for ``probmoe.RoutingConfig`` (ProbMoE methods only).
    aux_loss, z_loss: coefficients of the load-balancing loss on the experts actually used and of
        the router z-loss, added to the loss when router logits are output (None: the config's
        ``router_aux_loss_coef`` / ``router_z_loss_coef`` (0 where it has none; for "remoe",
        whose L1 penalty balances the load, aux_loss 0); 0: off).
    l1_coef, l1_rate: ReMoE's initial L1 coefficient λ₀ (default 1e-8) and the factor α (> 1,
        default 1.2) it is multiplied or divided by after each step (``controls.after_step``);
        l1_layers: "sum" (default: λ times each layer's penalty, as the official code) or "mean"
        (λ/L times each, L the MoE layers: the paper's formula).
    jitter_eps: SparseMixer's band half-width ε (> 0; default 0.01, GRIN-MoE's).
    balance: "aux-free" for DeepSeek-V3's auxiliary-loss-free balancing (every method but
        "sparsemixer" and "remoe"): a per-expert bias b added to the selection scores only,
        b_i += balance_rate · sign(mean load − load_i) after each step (``controls.after_step``;
        ``balance``); balance_rate γ defaults to 1e-3.
    generator: a ``torch.Generator`` for the ProbMoE draws (default: the global RNG).

    Patching an already patched model with the same settings returns it unchanged; with other
    settings it is a ValueError (``unpatch_model`` first). A transformers release whose model
    layout lacks a class, attribute or config field patching uses is a ``families.LayoutError``
    naming the family and what is missing, raised before the model is changed.
    """
    family = family_of(model)
    plan = make_plan(model.config, family, method, options=options, **values)
    checks.generator(generator)
    if is_patched(model):
        if model.probmoe_plan == plan and model.probmoe_generator is generator:
            return model
        raise ValueError(
            f"model is already patched with method {model.probmoe_plan.method!r} and other settings; "
            "call unpatch_model(model) before patching it again"
        )
    blocks = family.blocks(model)
    if not blocks:
        raise ValueError(f"model has no {family.block_class.__name__} to patch")
    names = {id(m): name for name, m in model.named_modules()}
    for block in blocks:  # the layout patching relies on, checked before anything changes
        family.check_block(block, names[id(block)])
    model_mod.model_class(type(model), model_mod.is_causal_lm(model))  # LayoutError if its forward lacks what is used
    requires_grad = {}
    for block in blocks:
        gate_mod.install(block.gate, plan, family, generator, len(blocks))
        if plan.experts_kind is not None:
            experts_mod.install(
                block.experts,
                plan.experts_kind,
                slots=plan.top_k,
                num_experts=plan.num_experts,
                hidden=block.gate.weight.shape[1],
            )
        if not plan.rules.trains_router:  # only the routers: Qwen2-MoE's shared_expert_gate stays trainable
            requires_grad[id(block.gate.weight)] = block.gate.weight.requires_grad
            block.gate.weight.requires_grad_(False)
    model_mod.install(model)
    model.probmoe_plan, model.probmoe_family, model.probmoe_generator = plan, family, generator
    model.probmoe_requires_grad = requires_grad
    model.probmoe_last_z_loss = None
    trainer_resume.install_if_imported()
    return model


def unpatch_model(model):
    """Restore stock routing (classes, router ``requires_grad``); returns the model. ValueError
    if ``model`` is not patched."""
    if not is_patched(model):
        raise ValueError("model is not patched by probmoe.integrations.transformers.patch_model")
    if not model_mod.is_patched_class(type(model)):
        raise ValueError(
            f"model's class {type(model).__qualname__} was changed after patch_model (a wrapper such as "
            "FSDP's fully_shard subclasses it); unpatch the model before wrapping it"
        )
    if "forward" in vars(model):  # it would call the patched forward of a model no longer patched
        raise ValueError(
            "model.forward was replaced on the instance after patch_model (trl's SFTTrainer puts its "
            "fused LM head there); `del model.forward` before unpatch_model"
        )
    family = model.probmoe_family
    requires_grad = model.probmoe_requires_grad
    for block in family.blocks(model):
        if id(block.gate.weight) in requires_grad:
            block.gate.weight.requires_grad_(requires_grad[id(block.gate.weight)])
        if isinstance(block.gate, gate_mod.PatchedGate):
            gate_mod.uninstall(block.gate)
        experts_mod.uninstall(block.experts)
    model_mod.uninstall(model)
    return model


def router_stats(model) -> list[dict]:
    """Per patched MoE layer, what its router did in the last forward:

    {"layer": module name, "routing": probmoe.Routing or None (stock methods), "indices":
     [T, kmax], "mask": [T, kmax] bool, "expert_counts": [N] long (tokens per expert),
     "experts_per_token": [T] long, "selected": [T, N] bool}; an empty dict's fields are None
    before the first forward."""
    if not is_patched(model):
        raise ValueError("model is not patched by probmoe.integrations.transformers.patch_model")
    stats = []
    for name, module in model.named_modules():
        if isinstance(module, gate_mod.PatchedGate):
            rec = module.probmoe_last
            stats.append(
                {
                    "layer": name,
                    "routing": rec and rec.routing,
                    "indices": rec and rec.indices,
                    "mask": rec and rec.mask,
                    "expert_counts": rec and rec.counts,
                    "experts_per_token": rec and rec.experts_per_token,
                    "selected": rec and rec.selected,
                }
            )
    return stats


def from_pretrained(path, *, generator: torch.Generator | None = None, **kwargs):
    """Load a checkpoint saved from a patched model with transformers'
    ``AutoModelForCausalLM.from_pretrained(path, **kwargs)`` and patch the routing its
    ``probmoe_routing.json`` records. FileNotFoundError if the settings file is missing,
    ValueError if it is unreadable, tampered or does not match the checkpoint's config;
    ``weights_file.DamagedWeightsError`` (a ValueError) naming a truncated or corrupted
    ``*.safetensors`` file, before transformers reads it; ValueError naming a file that does not
    match its sha256 in the ``final_model.json`` beside it (a ``probmoe-train`` output folder:
    ``probmoe.integrations.final_model``), each file hashed once. The routing state a method trains with
    (ReMoE's λ, DefaultMoE's default outputs) comes back from ``probmoe_state.safetensors``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not os.path.isdir(os.fspath(path)):
        raise ValueError(f"path must be a local checkpoint directory written by save_pretrained, got {path!r}")
    data = settings.read(path)  # before loading any weights
    config = AutoConfig.from_pretrained(path)
    if config.model_type != data["model_type"]:
        raise ValueError(
            f"{data['path']} is for model type {data['model_type']!r} but config.json says {config.model_type!r}"
        )
    check_weights_files(path)  # the headers first: what they find is said more precisely
    final_model.verify(path)
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    family = family_of(model)
    if (family.num_experts(model.config), family.top_k(model.config)) != (data["num_experts"], data["top_k"]):
        raise ValueError(
            f"{data['path']} records {data['num_experts']} experts, top-{data['top_k']}, but the model "
            f"has {family.num_experts(model.config)}, top-{family.top_k(model.config)}"
        )
    patch_model(model, options=data["options"], generator=generator)
    runtime_state.load(model, path)
    if model.probmoe_plan.routing != data["routing"]:
        raise ValueError(
            f"{data['path']}: its routing config {data['routing']} does not match the model's "
            f"({model.probmoe_plan.routing})"
        )
    return model
