"""Resuming from a checkpoint by ``load_state_dict``: the checkpoint's expert keys back in the model's layout.

transformers 5.x keeps a MoE layer's experts fused in the model, but ``save_pretrained`` writes
them per expert, undoing the conversion mapping ``from_pretrained`` applies when it loads::

    in the model (what load_state_dict expects)       in model.safetensors (what save_pretrained writes)
    <layer>.mlp.experts.gate_up_proj  [N, 2I, H]       <layer>.mlp.experts.<e>.gate_proj.weight  [I, H]
                                                       <layer>.mlp.experts.<e>.up_proj.weight    [I, H]
    <layer>.mlp.experts.down_proj     [N, H, I]        <layer>.mlp.experts.<e>.down_proj.weight  [H, I]

(Mixtral: ``block_sparse_moe.`` for ``mlp.``, its router included, and ``w1`` / ``w3`` / ``w2``.)
``Trainer`` resumes (``_load_from_checkpoint``; ``_load_best_model``; ``load_sharded_checkpoint``,
shard by shard) with plain ``model.load_state_dict(state_dict, strict=False)`` and no conversion:
the experts stay as initialised, with a warning about missing and unexpected keys
(huggingface/transformers#48805, open on every 5.x release up to ``TESTED``).

``to_model_layout`` applies the installed release's own conversion mapping (the one
``from_pretrained`` applies) to such a state dict; a patched model's ``load_state_dict`` calls it
(``model.PatchedModel``), so ``Trainer``, trl's ``SFTTrainer`` and a plain
``model.load_state_dict(safetensors.torch.load_file(...))`` resume exactly. A state dict already in
the model's layout (accelerate's ``save_state``, which writes ``model.state_dict()`` as it is, or a
fixed transformers) passes unchanged, so the workaround is inert where it is not needed. A sharded
checkpoint converts shard by shard; ``save_pretrained`` may put a layer's ``gate_proj`` and
``up_proj`` (one fused tensor) in different shards: what a shard lacks is taken from the model's
current values (the next shard then overwrites them).

``FIXED_IN`` is the first transformers release whose Trainer converts by itself (None: none yet);
from it on ``needed`` is False and nothing is converted. tests/integrations/test_trainer_resume.py checks the
installed release for the bug and says when ``FIXED_IN`` must be set.
"""

from __future__ import annotations

import copy

import torch

from .version import release

ISSUE = "huggingface/transformers#48805"
FIXED_IN: tuple[int, ...] | None = None  # the first release that fixes ISSUE (None: none yet)


def needed(version: str) -> bool:
    """Whether ``to_model_layout`` must convert under transformers ``version``."""
    return FIXED_IN is None or release(version) < FIXED_IN


def _transforms(model) -> tuple[list, list]:
    """(renamings, converters) of the conversion mapping ``save_pretrained`` reverted, as
    transformers' ``revert_weight_conversion`` picks it: the one the model was loaded with, else the
    registered one without prefix changes (copies: matching marks them used)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange, WeightConverter, WeightRenaming

    transforms = getattr(model, "_weight_conversions", None)
    if transforms is None:
        transforms = get_model_conversion_mapping(model, add_legacy=False)
        transforms = [t for t in transforms if not isinstance(t, PrefixChange)]
    transforms = copy.deepcopy(list(transforms))
    return (
        [t for t in transforms if isinstance(t, WeightRenaming)],
        [t for t in transforms if isinstance(t, WeightConverter)],
    )


def to_model_layout(model, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` (as ``save_pretrained`` wrote it, or already in the model's layout) with
    every key the model lacks renamed and converted as ``from_pretrained`` would; keys that still
    match nothing are kept as they are (``load_state_dict`` reports them as unexpected). Returns
    ``state_dict`` itself when every key is the model's."""
    from transformers.core_model_loading import dot_natural_key, rename_source_key

    own = model.state_dict()
    if all(key in own for key in state_dict):
        return state_dict
    renamings, converters = _transforms(model)
    by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
    out, groups = {}, {}  # groups: the model's key -> [(checkpoint key, source pattern, tensor)]
    for key, tensor in sorted(state_dict.items(), key=lambda kv: dot_natural_key(kv[0])):  # experts in order
        target, pattern = (key, None) if key in own else rename_source_key(key, renamings, converters)
        if target not in own:
            out[key] = tensor
        elif pattern is None:
            out[target] = tensor
        else:
            groups.setdefault(target, []).append((key, pattern, tensor))
    for target, sources in groups.items():
        converter = by_pattern[sources[0][1]]
        sources = _completed(model, converter, target, sources, own, renamings, converters)
        out.update(_convert(model, converter, target, sources))
    return out


def _convert(model, converter, target: str, sources: list) -> dict[str, torch.Tensor]:
    instance = copy.deepcopy(converter)
    for key, pattern, tensor in sources:
        instance.add_tensor(target, key, pattern, tensor)
    values = instance.convert(target, model=model, config=model.config)
    return {name: value[0] if isinstance(value, list) else value for name, value in values.items()}


def _completed(model, converter, target: str, sources: list, own: dict, renamings: list, converters: list) -> list:
    """``sources`` and the checkpoint keys of ``target`` they lack (a shard can hold a layer's
    ``gate_proj`` but not its ``up_proj``), the latter taken from the model's current tensors
    written back to the checkpoint layout (views: ``revert_weight_conversion`` splits and unbinds),
    in key order, as ``_convert`` stacks them."""
    from transformers.core_model_loading import dot_natural_key, rename_source_key, revert_weight_conversion

    targets = [target.replace(converter.target_patterns[0], t) for t in converter.target_patterns]
    current = revert_weight_conversion(model, {t: own[t].detach() for t in targets})
    have = {key for key, _, _ in sources}
    if have >= set(current):
        return sources
    lacking = [
        (key, rename_source_key(key, renamings, converters)[1], tensor)
        for key, tensor in current.items()
        if key not in have
    ]
    return sorted(sources + lacking, key=lambda source: dot_natural_key(source[0]))
