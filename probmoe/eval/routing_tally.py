"""Experts per token, per MoE layer, over every forward a patched model runs (evaluation's routing statistics).

``RoutingTally(model)`` hooks the top-level model: after each forward it reads
``router_stats(model)`` and adds, for every MoE layer, the number of experts each real token was
sent to. Real tokens are those the forward's ``attention_mask`` marks (generation: the new
positions of each step), else the first ``lengths[b]`` positions of row b when the caller set
``next_lengths`` (right-padded batches, as the LM Evaluation Harness scores log-likelihoods), else
every position. ``summary()`` gives the per-layer and overall means and histograms.
"""

from __future__ import annotations

import torch


class RoutingTally:
    """Counts of experts per real token, per MoE layer, accumulated over forwards of ``model``."""

    def __init__(self, model):
        from probmoe.integrations.transformers import router_stats

        self._stats = lambda: router_stats(model)
        self.names: list[str] = [s["layer"] for s in self._stats()]
        if not self.names:
            raise ValueError("model has no patched MoE layer to take routing statistics from")
        self.experts = None  # [layers, N + 1] long: tokens sent to 0..N experts, per layer
        self.next_lengths: list[int] | None = None  # real lengths of the next forward's rows (right padding)
        self.paused = False
        self._handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def remove(self) -> None:
        self._handle.remove()

    def reset(self) -> None:
        self.experts = None

    def _real(self, ids: torch.Tensor, mask) -> torch.Tensor:
        """[B, L] bool: the positions of this forward that are real tokens."""
        batch, length = ids.shape
        lengths, self.next_lengths = self.next_lengths, None
        if mask is not None:
            return mask[:, -length:].bool()
        if lengths is not None:
            if len(lengths) != batch:
                raise RuntimeError(f"RoutingTally: {len(lengths)} row lengths for a batch of {batch} rows")
            return torch.arange(length, device=ids.device)[None, :] < torch.tensor(lengths, device=ids.device)[:, None]
        return torch.ones(batch, length, dtype=torch.bool, device=ids.device)

    def _hook(self, module, args, kwargs, output) -> None:
        ids = args[0] if args else kwargs.get("input_ids")
        if self.paused or ids is None:
            self.next_lengths = None
            return
        real = self._real(ids, kwargs.get("attention_mask")).reshape(-1)  # [B·L]
        stats = self._stats()
        width = stats[0]["selected"].shape[-1] + 1
        counts = torch.stack(
            [torch.bincount(s["experts_per_token"][real].long(), minlength=width)[:width] for s in stats]
        ).cpu()  # [layers, N + 1]
        self.experts = counts if self.experts is None else self.experts + counts

    def summary(self) -> dict:
        """{"tokens": real tokens routed, "experts_per_token": mean over layers and tokens,
        "layers": [{"name", "experts_per_token", "cardinality_hist"}]} (tokens and means 0 before any forward)."""
        if self.experts is None:
            return {
                "tokens": 0,
                "experts_per_token": 0.0,
                "layers": [{"name": n, "experts_per_token": 0.0, "cardinality_hist": []} for n in self.names],
            }
        values = torch.arange(self.experts.shape[1], dtype=torch.float64)
        tokens = self.experts.sum(dim=1)  # [layers], the same in every layer
        means = (self.experts.double() @ values) / tokens.clamp(min=1)
        return {
            "tokens": int(tokens[0]),
            "experts_per_token": float(means.mean()),
            "layers": [
                {"name": n, "experts_per_token": float(m), "cardinality_hist": h.tolist()}
                for n, m, h in zip(self.names, means, self.experts)
            ],
        }
