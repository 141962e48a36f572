"""The routing of a data set through a model, layer by layer, behind ``probmoe-analyze``.

The model runs teacher-forced over whole examples (``data.encode_all``: prompt and answer) in eval mode, so
each router routes as at inference (MAP for ProbMoE, top-k for the stock methods). For every
MoE layer and every real (non-pad) token we keep the routing probabilities (softmax(r); for a
family gating with sigmoid scores, DeepSeek-V3, the scores σ(r) normalised to sum to 1), the
experts used, and the token id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probmoe.scores import gate_scores

from . import data


@dataclass
class LayerRouting:
    """One MoE layer over T tokens: probs [T, N] float, selected [T, N] bool, token_ids [T] long."""

    name: str
    probs: torch.Tensor
    selected: torch.Tensor
    token_ids: torch.Tensor


def capture(model, tokenizer, encoded: list[data.Encoded], batch_size: int, progress) -> list[LayerRouting]:
    """Route the ``encoded`` examples through the patched ``model``; one ``LayerRouting`` per MoE layer."""
    from probmoe.integrations.transformers import router_stats

    kind = model.probmoe_family.scores
    probs, selected, ids, names = None, None, [], None
    with torch.no_grad():
        for start in progress(range(0, len(encoded), batch_size), desc="route"):
            batch = data.collate(encoded[start : start + batch_size], tokenizer.pad_token_id)
            batch = {key: value.to(model.device) for key, value in batch.items()}
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_router_logits=True)
            keep = batch["attention_mask"].reshape(-1).bool()  # [B·L]
            stats = router_stats(model)
            if probs is None:
                names = [s["layer"] for s in stats]
                probs, selected = [[] for _ in stats], [[] for _ in stats]
            for layer, (logits, s) in enumerate(zip(out.router_logits, stats)):
                scores = gate_scores(logits.float(), kind, normalized=True)  # [B·L, N]
                probs[layer].append(scores[keep].cpu())  # [T_b, N]
                selected[layer].append(s["selected"][keep].cpu())
            ids.append(batch["input_ids"].reshape(-1)[keep].cpu())
    token_ids = torch.cat(ids)
    return [LayerRouting(name, torch.cat(p), torch.cat(s), token_ids) for name, p, s in zip(names, probs, selected)]


def analyze(runs: dict[str, str], data_sets: dict, cfg, load, progress) -> tuple[dict, dict, list]:
    """``probmoe-analyze``: every checkpoint of ``runs`` ({name: directory}, loaded by ``load(path)``
    -> (model, tokenizer)) on every data set ({name: ``formats.Records``}), one run each ("NAME on DATA" when
    there are several data sets). Returns (results {run: per-layer ``metrics.layer_summary`` with
    "name"}, {run: routing described}, tokens.csv's rows); ``cfg`` gives max_length, batch_size and
    token_min_count."""
    from probmoe.analysis import metrics, report

    from . import checkpoints

    results, described, tokens = {}, {}, []
    for name, path in runs.items():
        model, tokenizer = load(path)
        for data_name, records in data_sets.items():
            run = name if len(data_sets) == 1 else f"{name} on {data_name}"
            described[run] = checkpoints.describe(model)
            encoded = data.encode_all(tokenizer, records, cfg.max_length)
            layers = capture(model, tokenizer, encoded, cfg.batch_size, progress)
            results[run] = [
                dict(name=layer.name, **metrics.layer_summary(layer.probs, layer.selected, layer.token_ids))
                for layer in layers
            ]
            tokens += report.token_rows(run, layers, tokenizer.decode, cfg.token_min_count)
    return results, described, tokens
