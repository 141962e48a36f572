"""The models ``probmoe-train`` fine-tunes: built-in tiny ones, or local checkpoint directories.

``--model tiny-olmoe | tiny-qwen2-moe | tiny-qwen3-moe | tiny-mixtral | tiny-deepseek-v3`` builds a
randomly initialised model of that family (the integration's tiny configs: hidden 64, 2 layers, 8
experts, top-2; DeepSeek-V3 top-3 from at most 2 of 4 groups) with the byte-level tokenizer (``tokenizer``) and room for GSM8K-length texts.
A directory is checked (config.json readable, a supported MoE model type, a tokenizer) before
any weights are loaded.
"""

from __future__ import annotations

import json
import os

import torch

TINY = {"tiny-olmoe": "olmoe", "tiny-qwen2-moe": "qwen2_moe", "tiny-qwen3-moe": "qwen3_moe",
        "tiny-mixtral": "mixtral", "tiny-deepseek-v3": "deepseek_v3"}
MAX_POSITIONS = 2048  # the tiny models' context: every GSM8K question + answer fits, in bytes


def check_checkpoint(path: str, flag: str = "--model") -> str:
    """The model type of the checkpoint directory ``path``; ValueError (naming ``flag`` and the path)
    if it is not a directory with a readable config.json of a supported model type."""
    from probmoe.integrations.transformers import ALL_FAMILIES

    if not os.path.isdir(path):
        allowed = f"one of {sorted(TINY)} or a local checkpoint directory" if flag == "--model" else \
            "a local checkpoint directory"
        raise ValueError(f"{flag} must be {allowed}; {path!r} is not")
    config_path = os.path.join(path, "config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{flag} {path!r}: config.json is missing or unreadable ({e})") from None
    if model_type not in ALL_FAMILIES:
        raise ValueError(f"{flag} {path!r} is a {model_type!r} model; supported model types: "
                         f"{', '.join(ALL_FAMILIES)}")
    return model_type


def load_tokenizer(path: str, flag: str = "--model"):
    """The tokenizer of ``--model`` (the byte tokenizer for the tiny ones), with a pad token
    (eos where the tokenizer has none: padding is masked anyway); ValueError without eos."""
    from transformers import AutoTokenizer

    from .tokenizer import byte_tokenizer

    if path in TINY:
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


def load_model(path: str, seed: int, dtype: torch.dtype = torch.float32):
    """The model of ``--model``: a tiny built-in one initialised under ``seed``, or the checkpoint
    directory ``path`` (stock or saved by a patched model; any probmoe routing settings beside it
    are the caller's business)."""
    from transformers import AutoModelForCausalLM

    from probmoe.integrations.transformers.testing import tiny_model

    from .tokenizer import VOCAB_SIZE

    if path in TINY:
        return tiny_model(TINY[path], seed=seed, vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_POSITIONS).to(dtype)
    check_checkpoint(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
