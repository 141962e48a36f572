"""Loading a trained model for evaluation or analysis, with the routing it was trained with or another.

A directory saved by a patched model (``probmoe_routing.json`` beside it) comes back with its
routing (``probmoe.integrations.transformers.from_pretrained``); a stock checkpoint is patched
with ``"conventional"`` (stock routing, so the router statistics are there). ``method`` (and
k/kmin/kmax) replaces the routing: the paper's training/inference-mismatch table evaluates every
model with one inference rule, e.g. Dynamic-k MAP (``routing``: a ``RoutingOptions``). Every check (the config, the model type,
the safetensors headers, and the sha256 of each file a ``final_model.json`` beside them records)
runs before any weights are read; a file that fails while loading all the same is named in a
ValueError.
"""

from __future__ import annotations

import os

import torch

from probmoe.integrations import final_model
from probmoe.integrations.routing_options import RoutingOptions

from . import models


def check(path: str, flag: str = "--checkpoint") -> str:
    """The model type of checkpoint directory ``path`` (``models.check_checkpoint``), its weight
    files' headers checked too; ValueError naming the directory or the damaged file."""
    from probmoe.integrations.transformers.weights_file import check_weights_files

    model_type = models.check_checkpoint(path, flag)
    check_weights_files(path)
    return model_type


def load(
    path: str,
    *,
    routing: RoutingOptions | None = None,
    device="cpu",
    dtype: torch.dtype = torch.float32,
    **values,
):
    """(model in eval mode on ``device`` with weights in ``dtype``, tokenizer) from checkpoint
    ``path``, routed by ``routing`` (or by the options its fields name as keywords: ``method=...``,
    ``k=...``); its method None: the saved routing."""
    from transformers import AutoModelForCausalLM

    import probmoe.integrations.transformers as pt

    check(path)
    routing = RoutingOptions.given(routing, **({"method": None, **values} if routing is None else values))
    if routing.method is None and routing != RoutingOptions(method=None):
        raise ValueError("--k/--kmin/--kmax/--backend/--grad need --method")
    tokenizer = models.load_tokenizer(path, "--checkpoint")
    from safetensors import SafetensorError

    try:
        if os.path.isfile(os.path.join(path, pt.SETTINGS_FILENAME)):
            model = pt.from_pretrained(path, dtype=dtype)
            if routing.method is not None:
                pt.unpatch_model(model)
        else:  # from_pretrained verifies final_model.json itself (once per load)
            final_model.verify(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            if routing.method is None:
                routing = RoutingOptions("conventional")
    except (SafetensorError, OSError) as e:  # what the header check cannot see, e.g. no weights file at all
        raise ValueError(
            f"--checkpoint {path!r}: the weights cannot be loaded ({str(e).strip().splitlines()[0]})"
        ) from None
    if routing.method is not None:
        pt.patch_model(model, options=routing)
    return model.to(device).eval(), tokenizer


def describe(model) -> str:
    """The routing a loaded model runs: ``probmoe-dynamic (kmin=1, kmax=2)``; ReMoE's ReLU gates
    have no fixed count (its eval line reports the experts per token it ran)."""
    plan = model.probmoe_plan
    return plan.rules.describe(plan.routing, plan.top_k)
