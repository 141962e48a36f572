"""``probmoe-train --plan``: per-GPU memory of a run under DDP and under FSDP, before any weights load.

The model is built on the meta device (no memory), so the parameter counts are exact for any size.
Per process, with P parameters, W processes and b bytes per stored parameter (4 fp32, 2 bf16):

    DDP   parameters P·b, gradients P·b (views into DDP's buckets), AdamW state 2·P·b plus its
          step's temporaries (torch's multi-tensor AdamW on CUDA: about P·b more; one tensor at
          a time on the CPU: twice the largest tensor)
    FSDP  parameters P/W·b + the unsharded working set in the compute dtype (the root's
          embeddings, final norm and LM head, kept gathered, and two decoder layers: the one
          running and the one prefetched), gradients P/W·b + the root's and one layer's unreduced
          gradients, AdamW state 2·P/W·b and its step's temporaries (as DDP's, on 1/W)
    activations (both) per micro-batch of B·L tokens: what autograd keeps per decoder layer
          (``layer_activation_bytes``; with activation checkpointing only each layer's input plus
          one layer recomputed), plus the logits and their fp32 log-softmax and gradient.

The total adds all four, an upper bound: the gradients and the activations of one step never
peak together. Not counted: the CUDA context and allocator fragmentation (``RESERVE``: 2 GiB is
kept free on every GPU) and the routing circuits (kilobytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from probmoe.methods import get_method

GPUS_GB = (24, 40, 80, 141)
RESERVE = 2 * 2**30  # CUDA context + fragmentation, kept free on each GPU


@dataclass(frozen=True)
class Shape:
    """What the estimate needs from a config: sizes of one decoder layer and of the whole model."""

    params: int  # all parameters
    root_params: int  # outside the decoder layers: embeddings, final norm, LM head
    layer_params: int  # the largest decoder layer
    largest_tensor: int  # elements of the largest parameter
    layers: int
    hidden: int
    heads: int
    kv_width: int  # key + value width per token (heads · head dims)
    experts: int
    top_k: int
    expert_width: int  # one routed expert's intermediate size
    shared_width: int  # the shared experts' intermediate size in all (0: none)
    vocab: int


def shape_of(model) -> Shape:
    """The ``Shape`` of a (meta) ``*ForCausalLM``."""
    from probmoe.integrations.transformers.families import family_of

    c = model.config
    layers = list(model.model.layers)
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    total = sum(p.numel() for p in model.parameters())
    experts = family_of(model).num_experts(c)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if getattr(c, "kv_lora_rank", None):  # MLA: keys (nope + rope) and values per head
        kv = c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)
    else:
        kv = 2 * c.num_key_value_heads * head_dim
    expert_width = getattr(c, "moe_intermediate_size", None) or c.intermediate_size
    shared = getattr(c, "shared_expert_intermediate_size", 0) or (getattr(c, "n_shared_experts", 0) or 0) * expert_width
    return Shape(
        params=total,
        root_params=total - sum(sizes),
        layer_params=max(sizes),
        largest_tensor=max(p.numel() for p in model.parameters()),
        layers=len(layers),
        hidden=c.hidden_size,
        heads=c.num_attention_heads,
        kv_width=kv,
        experts=int(experts),
        top_k=c.num_experts_per_tok,
        expert_width=expert_width,
        shared_width=shared,
        vocab=c.vocab_size,
    )


def experts_per_token(shape: Shape, method: str, k: int | None, kmax: int | None) -> int:
    """Experts each token runs through in training under ``method`` (``Method.experts_per_token``)."""
    return get_method(method).experts_per_token(shape.experts, k or shape.top_k, kmax or shape.top_k)


def layer_activation_bytes(
    shape: Shape, tokens: int, seq_len: int, experts: int, act_bytes: int, attention_scores: bool
) -> int:
    """Bytes autograd keeps for one decoder layer's backward over ``tokens`` tokens: norms and
    residuals (4 H), q/k/v and the attention output (2 H + kv), the routing (logits, probabilities,
    weights: 3 N in fp32), each of ``experts`` experts' input, gate/up, activation and product
    (H + 4 I), the shared expert likewise; the attention probabilities (heads · L per token) when
    ``attention_scores`` (the math attention of the CPU; flash attention on a GPU keeps none)."""
    s = shape
    per_token = (
        act_bytes
        * (
            6 * s.hidden
            + s.kv_width
            + experts * (s.hidden + 4 * s.expert_width)
            + (s.hidden + 4 * s.shared_width if s.shared_width else 0)
        )
        + 4 * 3 * s.experts
    )
    if attention_scores:
        per_token += act_bytes * s.heads * seq_len
    return tokens * per_token


@dataclass(frozen=True)
class Estimate:
    parameters: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations


def estimate(
    shape: Shape,
    *,
    world_size: int,
    fsdp: bool,
    batch_size: int,
    max_length: int,
    method: str,
    k: int | None = None,
    kmax: int | None = None,
    param_bytes: int = 4,
    compute_bytes: int | None = None,
    checkpointing: bool = False,
    attention_scores: bool = False,
    foreach: bool = True,
) -> Estimate:
    """Per-process bytes of one run (see the module docstring). ``compute_bytes``: the activations'
    and FSDP's unsharded parameters' bytes per value (2 under bf16; default ``param_bytes``);
    ``foreach``: AdamW's multi-tensor step (torch's default on CUDA), else one tensor at a time
    (the CPU's)."""
    compute_bytes = compute_bytes or param_bytes
    P = shape.params
    stored = -(-P // world_size) if fsdp else P  # ceil: FSDP pads the last shard
    # unsharded at once: the root (kept gathered through the step) and the running and prefetched
    # layers' parameters; the root's and one layer's gradients before their reduce-scatter
    gathered = (shape.root_params + min(2, shape.layers) * shape.layer_params) * compute_bytes if fsdp else 0
    unreduced = (shape.root_params + shape.layer_params) * compute_bytes if fsdp else 0
    tokens = batch_size * max_length
    layer = layer_activation_bytes(
        shape, tokens, max_length, experts_per_token(shape, method, k, kmax), compute_bytes, attention_scores
    )
    kept = shape.layers * tokens * shape.hidden * compute_bytes + layer if checkpointing else shape.layers * layer
    logits = tokens * shape.vocab * (compute_bytes + 3 * 4)  # logits, fp32 copy, log-softmax, its gradient
    # the step's temporaries: foreach, about one more copy of the (local) parameters; one tensor at a
    # time, two of the largest local tensor (the denominator and the update)
    largest = -(-shape.largest_tensor // world_size) if fsdp else shape.largest_tensor
    step = stored * param_bytes if foreach else 2 * largest * param_bytes
    return Estimate(
        parameters=stored * param_bytes + gathered,
        gradients=stored * param_bytes + unreduced,
        optimizer=2 * stored * param_bytes + step,
        activations=kept + logits,
    )


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def fits(total: int, gpus=GPUS_GB) -> list[int]:
    """The GPU sizes (GB, 10^9 bytes as sold) whose memory less ``RESERVE`` holds ``total`` bytes."""
    return [g for g in gpus if total <= g * 10**9 - RESERVE]


def report(name: str, shape: Shape, *, world_size: int, method: str, **kwargs) -> str:
    """The table ``--plan`` prints: DDP and FSDP side by side, and which GPU sizes each fits."""
    rows = {
        mode: estimate(shape, world_size=world_size, fsdp=mode == "FSDP", method=method, **kwargs)
        for mode in ("DDP", "FSDP")
    }
    lines = [
        f"memory plan: {name}, {shape.params / 1e9:.3f} B parameters ({shape.layers} layers), {method}, "
        f"{world_size} process(es), batch {kwargs['batch_size']} x {kwargs['max_length']} tokens per process",
        f"{'per GPU':<14}{'DDP':>14}{'FSDP':>14}",
    ]
    for field in ("parameters", "gradients", "optimizer", "activations", "total"):
        lines.append(f"{field:<14}{gib(getattr(rows['DDP'], field)):>14}{gib(getattr(rows['FSDP'], field)):>14}")
    for mode, row in rows.items():
        ok = fits(row.total)
        lines.append(
            f"{mode}: fits on "
            + (", ".join(f"{g} GB" for g in ok) if ok else f"none of {', '.join(f'{g} GB' for g in GPUS_GB)}")
            + " GPUs"
        )
    if world_size == 1:
        lines.append(
            "note: with one process FSDP shards nothing, so it needs more than DDP: the whole model "
            "stored, plus the gathered copies of the root and two layers and their unreduced gradients; "
            "it saves memory from two processes on"
        )
    return "\n".join(lines)


def per_process_batch(optim, world_size: int) -> int:
    """The examples per process per micro-batch of ``optim`` (an ``OptimOptions``): its --batch-size,
    or --global-batch-size split over ``world_size`` processes and --grad-accum micro-batches.
    ValueError (saying what to change) when that does not divide evenly, or when both are given and
    disagree."""
    if optim.global_batch_size is None:
        return optim.batch_size
    global_batch, grad_accum = optim.global_batch_size, optim.grad_accum
    per, rest = divmod(global_batch, world_size * grad_accum)
    if rest or per == 0:
        raise ValueError(
            f"--global-batch-size {global_batch} does not split over {world_size} process(es) x "
            f"--grad-accum {grad_accum}: use a multiple of {world_size * grad_accum}, or change "
            "--nproc_per_node / --grad-accum"
        )
    if optim.batch_size is not None and optim.batch_size != per:
        raise ValueError(
            f"--batch-size {optim.batch_size} and --global-batch-size {global_batch} disagree: "
            f"{global_batch} over {world_size} process(es) x --grad-accum {grad_accum} is --batch-size {per}; "
            "give one of the two"
        )
    return per


def for_run(cfg, world_size: int, device_type: str) -> tuple[Shape, dict]:
    """(``Shape`` of ``cfg.model.name`` built on the meta device, the ``estimate`` arguments of ``cfg``)."""
    import torch

    from . import models

    dtype = getattr(torch, cfg.model.param_dtype)
    shape = shape_of(models.empty_model(models.model_config(cfg.model.name, cfg.model.layers), dtype))
    param_bytes = dtype.itemsize
    return shape, dict(
        batch_size=cfg.optim.batch_size,
        max_length=cfg.data.max_length,
        method=cfg.routing.method,
        k=cfg.routing.k,
        kmax=cfg.routing.kmax,
        param_bytes=param_bytes,
        compute_bytes=2 if cfg.run.bf16 else param_bytes,
        checkpointing=cfg.model.gradient_checkpointing,
        attention_scores=device_type == "cpu",
        foreach=device_type == "cuda",
    )


def device_bytes(world) -> tuple[int, str]:
    """(bytes one process may use, what they are): the GPU's memory less ``RESERVE``, or on the CPU
    the machine's memory shared by the processes of this node."""
    import os

    import torch

    if world.device.type == "cuda":
        total = torch.cuda.get_device_properties(world.device).total_memory
        return total - RESERVE, f"this GPU's {gib(total)}"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return total // local, f"{gib(total)} of memory shared by {local} process(es)"


def check_fits(cfg, world) -> None:
    """ValueError, before any weights load, when the parameters, gradients and AdamW state alone (the
    exact part of the estimate) exceed what one process may use; says what to change."""
    shape, kwargs = for_run(cfg, world.size, world.device.type)
    row = estimate(shape, world_size=world.size, fsdp=cfg.run.fsdp, **kwargs)
    state = row.parameters + row.gradients + row.optimizer
    limit, what = device_bytes(world)
    if state <= limit:
        return
    mode = "FSDP" if cfg.run.fsdp else "DDP"
    sharded = estimate(shape, world_size=world.size, fsdp=True, **kwargs)
    hint = (
        "add --fsdp ("
        + gib(sharded.parameters + sharded.gradients + sharded.optimizer)
        + " per process at this world size) or start more processes"
        if not cfg.run.fsdp
        else "start more processes"
    )
    raise ValueError(
        f"--model {cfg.model.name} will not fit: parameters, gradients and AdamW state need "
        f"{gib(state)} per process under {mode} with {world.size} process(es), more than {what}; "
        f"{hint}, or use --param-dtype bfloat16 (see --plan)"
    )
