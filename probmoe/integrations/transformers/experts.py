"""Patched experts: Dynamic-k and ReMoE experts that never compute the slots a token does not
use, and DefaultMoE's experts that add the default outputs of the unselected experts.

``probmoe.route`` hands out kmax slots per token; the unused ones hold distinct experts the token
does not use, with weight exactly 0 (the routing contract, docs/router.md). The stock experts
would compute them (a valid index with weight 0 is safe under every experts implementation, but
costs a full expert MLP per unused slot). The patched experts drop
them before dispatch: the A active (token, slot) pairs become A rows of one slot each, which the
stock implementation the config selects ("eager", "grouped_mm", "batched_mm") computes as usual,
so every implementation skips for real and no new kernel is needed. Equivalent to

    out[t] = Σ_{s active} w[t, s] · expert_{idx[t, s]}(h[t])

Active slots are read off the weights (the nonzero ones; a used slot whose score underflowed to
exactly 0 adds 0 to the value and, its weight's gradient being proportional to that score, 0 to
every gradient, so skipping it changes nothing), so nothing has to pass between the router and the
experts and a checkpoint recomputation finds the same rows. ReMoE hands out all N experts per
token with their ReLU gates as weights; there too the active slots are those of nonzero weight
(``WeightSkippingExperts``).

DefaultMoE (``DefaultExperts``, see ``defaultmoe``) gets all N slots in training, the k selected
first: it computes the k selected slots unweighted (the stock implementation, as above),
updates the default outputs ``probmoe_defaults`` [N, D] (a buffer ``save_pretrained`` keeps out
of the stock checkpoint: ``runtime_state``) from them, and returns Σ_{s < k} w_s E(x) + Σ_{s ≥ k} w_s Ê_{idx_s}. With
k slots (eval) it is the stock forward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from probmoe.methods.defaultmoe import update_defaults
from probmoe.replay import in_backward

from . import pickling


def active_slots(top_k_weights: Tensor) -> Tensor:
    """The slots to compute, from a ``probmoe.Routing``'s weights: [T, kmax] -> [T, kmax] bool (the
    nonzero ones: unused slots carry weight exactly 0)."""
    return top_k_weights != 0


class SkippingExperts:
    """Mixin placed before the family's fused experts class in the run-time subclass."""

    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        # hidden_states [T, D], top_k_index / top_k_weights [T, kmax]
        token, slot = self.probmoe_active(top_k_index, top_k_weights).nonzero(as_tuple=True)  # [A] each (host sync)
        rows = self.probmoe_dispatch(hidden_states, token, top_k_index[token, slot], top_k_weights[token, slot])
        out = torch.zeros_like(hidden_states)  # [T, D]
        return out.index_add(0, token, rows.to(hidden_states.dtype))  # [A, D] -> [T, D]

    def probmoe_active(self, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        """The slots to compute: [T, kmax] bool."""
        return active_slots(top_k_weights)

    def probmoe_dispatch(self, hidden_states: Tensor, token: Tensor, expert: Tensor, weight: Tensor) -> Tensor:
        """The weighted expert outputs of the active rows: hidden_states [T, D], token / expert /
        weight [A] -> [A, D], computed by the stock implementation as A tokens with one slot each.
        (The one place where the experts see their inputs: observe it to count the rows.)"""
        return super().forward(hidden_states[token], expert.unsqueeze(-1), weight.unsqueeze(-1))

    def __reduce_ex__(self, protocol):  # pickle, torch.save, deepcopy: the patched class (see pickling)
        return pickling.reduce(self, experts_class, (pickling.stock_class(self, SkippingExperts),), ())


class WeightSkippingExperts(SkippingExperts):
    """ReMoE's experts: the active slots are those of nonzero weight (ReLU gate > 0)."""

    def probmoe_active(self, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        return top_k_weights != 0

    def __reduce_ex__(self, protocol):
        return pickling.reduce(self, weight_experts_class, (pickling.stock_class(self, SkippingExperts),), ())


class DefaultExperts:
    """Mixin for DefaultMoE's experts. ``probmoe_slots``: k; ``probmoe_defaults``: [N, D] float32."""

    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        # hidden_states [T, D], top_k_index / top_k_weights [T, S] (S = k: stock; S = N: training)
        k = self.probmoe_slots
        if top_k_index.shape[-1] == k:
            return super().forward(hidden_states, top_k_index, top_k_weights)
        t = hidden_states.shape[0]
        token = torch.arange(t, device=hidden_states.device).repeat_interleave(k)  # [T·k]
        expert = top_k_index[:, :k].reshape(-1)  # [T·k]
        ones = torch.ones(t * k, 1, dtype=top_k_weights.dtype, device=hidden_states.device)
        rows = super().forward(hidden_states[token], expert.unsqueeze(-1), ones)  # [T·k, D] unweighted
        if torch.compiler.is_compiling() or not in_backward():  # not again in a checkpoint recomputation
            update_defaults(self.probmoe_defaults, rows, expert)
        defaults = self.probmoe_defaults.clone()  # [N, D]: the value this forward's backward uses
        w = top_k_weights.float()  # [T, N]
        out = (rows.float() * w[:, :k].reshape(-1, 1)).view(t, k, -1).sum(dim=1)  # [T, D]
        out = out + torch.einsum("ts,tsd->td", w[:, k:], defaults[top_k_index[:, k:]])  # value 0, dense gradient
        return out.to(hidden_states.dtype)

    def __reduce_ex__(self, protocol):
        return pickling.reduce(self, default_experts_class, (pickling.stock_class(self, DefaultExperts),), ())


_CLASSES: dict[tuple, type] = {}


def _made(mixin: type, cls: type) -> type:
    if (mixin, cls) not in _CLASSES:
        _CLASSES[mixin, cls] = type(
            f"ProbMoE{mixin.__name__}{cls.__name__}", (mixin, cls), {"__module__": cls.__module__}
        )
    return _CLASSES[mixin, cls]


def experts_class(cls: type) -> type:
    return _made(SkippingExperts, cls)


def weight_experts_class(cls: type) -> type:
    return _made(WeightSkippingExperts, cls)


def default_experts_class(cls: type) -> type:
    return _made(DefaultExperts, cls)


MIXINS = {"skip": experts_class, "skip-weight": weight_experts_class, "default": default_experts_class}
ADDED = ("probmoe_slots",)
BUFFERS = ("probmoe_defaults",)


def install(
    experts, kind: str = "skip", *, slots: int | None = None, num_experts: int | None = None, hidden: int | None = None
) -> None:
    """Swap ``experts``' class for ``kind`` ("skip": Dynamic-k, "skip-weight": ReMoE, "default":
    DefaultMoE with ``slots`` = k and an [num_experts, hidden] float32 buffer of zeros)."""
    experts.__class__ = MIXINS[kind](type(experts))
    if kind == "default":
        experts.probmoe_slots = slots
        device = next(experts.parameters()).device
        experts.register_buffer("probmoe_defaults", torch.zeros(num_experts, hidden, device=device))


def uninstall(experts) -> None:
    cls = type(experts)
    if issubclass(cls, (SkippingExperts, DefaultExperts)):
        experts.__class__ = next(c for c in cls.__mro__[1:] if not issubclass(c, (SkippingExperts, DefaultExperts)))
    for name in ADDED:
        experts.__dict__.pop(name, None)
    for name in BUFFERS:
        experts._buffers.pop(name, None)
