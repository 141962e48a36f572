"""The models ``probmoe-train`` fine-tunes: built-in ones, or local checkpoint directories.

``--model tiny-olmoe | tiny-qwen2-moe | tiny-qwen3-moe | tiny-mixtral | tiny-flex-olmo | tiny-deepseek-v3``
(one per row of ``probmoe.integrations.model_families``) builds a
randomly initialised model of that family (the integration's tiny configs: hidden 64, 2 layers, 8
experts, top-2; DeepSeek-V3 top-3 from at most 2 of 4 groups) with the byte-level tokenizer
(``tokenizer``) and room for GSM8K-length texts. ``--model olmoe-1b-7b-shape`` and the other
published shapes (``shapes``) build the real configuration with random weights, on the meta device
first and then one tensor at a time, so that the whole model never exists twice; ``--layers N``
sets the depth of either kind. A directory is checked (config.json readable, a supported MoE model
type, a tokenizer) before any weights are loaded, and loads in the dtype asked (bf16 without an
fp32 copy).
"""

from __future__ import annotations

import json
import os
import zlib

import torch

from probmoe.integrations.model_families import TABLE

from .shapes import SHAPES, shape_config

TINY = {facts.tiny_name: name for name, facts in TABLE.items()}  # "tiny-olmoe" -> "olmoe", ...
BUILT_IN = (*TINY, *SHAPES)
MAX_POSITIONS = 2048  # the tiny models' context: every GSM8K question + answer fits, in bytes
INIT_CHUNK = 1 << 24  # values drawn at once by ``initial_tensor`` (64 MiB in fp32)


def check_checkpoint(path: str, flag: str = "--model") -> str:
    """The model type of the checkpoint directory ``path``; ValueError (naming ``flag`` and the path)
    if it is not a directory with a readable config.json of a supported model type."""
    from probmoe.integrations.transformers import ALL_FAMILIES

    if not os.path.isdir(path):
        allowed = (
            f"one of {list(BUILT_IN)} or a local checkpoint directory"
            if flag == "--model"
            else "a local checkpoint directory"
        )
        raise ValueError(f"{flag} must be {allowed}; {path!r} is not")
    config_path = os.path.join(path, "config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{flag} {path!r}: config.json is missing or unreadable ({e})") from None
    if model_type not in ALL_FAMILIES:
        raise ValueError(f"{flag} {path!r} is a {model_type!r} model; supported model types: {', '.join(ALL_FAMILIES)}")
    return model_type


def load_tokenizer(path: str, flag: str = "--model"):
    """The tokenizer of ``--model`` (the byte tokenizer for the tiny ones), with a pad token
    (eos where the tokenizer has none: padding is masked anyway); ValueError without eos."""
    from transformers import AutoTokenizer

    from .tokenizer import byte_tokenizer

    if path in BUILT_IN:
        return byte_tokenizer()
    check_checkpoint(path, flag)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{flag} {path!r} has no loadable tokenizer ({e})") from None
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{flag} {path!r}: its tokenizer has no eos token (the answers end with one)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def model_config(path: str, layers: int | None = None):
    """The transformers config of ``--model`` (no weights); ``layers`` (``--layers``) sets the number of
    decoder layers of a built-in model."""
    from transformers import AutoConfig

    from probmoe.integrations.transformers.testing import tiny_config

    from .tokenizer import VOCAB_SIZE

    if layers is not None and layers < 1:
        raise ValueError(f"--layers must be >= 1, got {layers}")
    if path in SHAPES:
        return shape_config(path, layers)
    if path in TINY:
        depth = {} if layers is None else {"num_hidden_layers": layers}
        if TINY[path] == "deepseek_v3" and layers is not None:
            depth["first_k_dense_replace"] = min(1, layers - 1)
        return tiny_config(TINY[path], vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_POSITIONS, **depth)
    check_checkpoint(path)
    if layers is not None:
        raise ValueError(f"--layers applies to the built-in models only, not to the checkpoint {path!r}")
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"--model {path!r}: config.json does not load ({e})") from None


def empty_model(config, dtype: torch.dtype = torch.float32):
    """A ``*ForCausalLM`` of ``config`` with every parameter and buffer on the meta device (no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def initial_tensor(model, name: str, seed: int) -> torch.Tensor:
    """The initial value of parameter or persistent buffer ``name`` of the meta model ``model``, drawn
    on the CPU from a generator seeded by ``seed`` and the name alone (the same on any rank and at any
    world size): transformers' rule (``_init_weights``) of normal(0, initializer_range) weights,
    norms at 1, biases and buffers at 0, the embedding's padding row at 0."""
    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    meta = getattr(owner, leaf)
    kind = type(owner).__name__
    if "Norm" in kind and leaf == "weight":
        return torch.ones(meta.shape, dtype=meta.dtype)
    if leaf == "bias" or leaf in dict(owner.named_buffers(recurse=False)):
        return torch.zeros(meta.shape, dtype=meta.dtype)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    value = torch.empty(meta.shape, dtype=meta.dtype)
    rows = max(1, INIT_CHUNK // max(1, value[0].numel()))  # drawn in fp32 a block of rows at a time
    for start in range(0, value.shape[0], rows):
        block = value[start : start + rows]
        block.copy_(torch.empty(block.shape).normal_(0.0, model.config.initializer_range, generator=generator))
    if isinstance(owner, torch.nn.Embedding) and owner.padding_idx is not None:
        value[owner.padding_idx] = 0
    return value


@torch.no_grad()
def materialize(model, source, device: torch.device) -> None:
    """Give the meta model ``model`` real storage on ``device`` and fill it: every parameter and
    persistent buffer from ``source(name) -> full tensor`` (one at a time, on the CPU; a sharded
    DTensor parameter keeps only its shard, scattered from rank 0, where ``source`` is called: the
    other ranks never hold the full tensor; ``source`` None: left unset, for a caller that loads
    every value next), the non-persistent buffers (rotary frequencies) by transformers' own
    initialiser, a patched model's routing state at its initial values (``runtime_state.reset``;
    a resume loads it next)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    from probmoe.integrations.transformers import runtime_state

    persistent = set(model.state_dict())
    model.to_empty(device=device)
    runtime_state.reset(model)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if source is None or name not in persistent or runtime_state.is_state_key(name):
            continue
        if isinstance(tensor, DTensor):
            full = source(name) if tensor.device_mesh.get_rank() == 0 else torch.empty(tensor.shape, dtype=tensor.dtype)
            shard = distribute_tensor(full.to(device, tensor.dtype), tensor.device_mesh, tensor.placements)
            tensor.to_local().copy_(shard.to_local())
            del full, shard  # one full tensor at a time
        else:
            tensor.copy_(source(name))
    for module in model.modules():
        if module._non_persistent_buffers_set and not list(module.parameters(recurse=False)):
            model._init_weights(module)  # recomputes non-persistent buffers (the rotary inv_freq)


def load_model(path: str, seed: int, dtype: torch.dtype = torch.float32, layers: int | None = None):
    """The model of ``--model`` in ``dtype``: a tiny built-in one initialised under ``seed``, a published
    shape (weights from ``initial_tensor``), or the checkpoint directory ``path`` (stock or saved
    by a patched model; any probmoe routing settings beside it are the caller's business)."""
    from transformers import AutoModelForCausalLM

    if path in TINY:
        config = model_config(path, layers)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return AutoModelForCausalLM.from_config(config).to(dtype)
    if path in SHAPES:
        model = empty_model(model_config(path, layers), dtype)
        materialize(model, lambda name: initial_tensor(model, name, seed), torch.device("cpu"))
        return model
    check_checkpoint(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
