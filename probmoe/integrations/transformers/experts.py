"""Dynamic-k experts that never compute the slots a token does not use.

``probmoe.route`` hands out kmax slots per token; the unused ones repeat slot 0's expert with
weight 0. The stock experts would compute them (a valid index with weight 0 is safe under every
experts implementation, but costs a full expert MLP per unused slot). The patched experts drop
them before dispatch: the A active (token, slot) pairs become A rows of one slot each, which the
stock implementation the config selects ("eager", "grouped_mm", "batched_mm") computes as usual,
so every implementation skips for real and no new kernel is needed. Equivalent to

    out[t] = Σ_{s active} w[t, s] · expert_{idx[t, s]}(h[t])

Active slots are read off the indices (slot 0, and every slot whose expert differs from slot 0's:
used slots hold distinct experts), so nothing has to pass between the router and the experts and
a checkpoint recomputation finds the same rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import pickling


def active_slots(top_k_index: Tensor) -> Tensor:
    """The used slots of a ``probmoe.Routing``'s indices: [T, kmax] long -> [T, kmax] bool."""
    active = top_k_index != top_k_index[:, :1]  # unused slots repeat slot 0's expert
    active[:, 0] = True  # slot 0 is always used (kmin >= 1)
    return active


class SkippingExperts:
    """Mixin placed before the family's fused experts class in the run-time subclass."""

    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        # hidden_states [T, D], top_k_index / top_k_weights [T, kmax]
        token, slot = active_slots(top_k_index).nonzero(as_tuple=True)  # [A] each (one host sync)
        rows = self.probmoe_dispatch(hidden_states, token, top_k_index[token, slot], top_k_weights[token, slot])
        out = torch.zeros_like(hidden_states)  # [T, D]
        return out.index_add(0, token, rows.to(hidden_states.dtype))  # [A, D] -> [T, D]

    def probmoe_dispatch(self, hidden_states: Tensor, token: Tensor, expert: Tensor, weight: Tensor) -> Tensor:
        """The weighted expert outputs of the active rows: hidden_states [T, D], token / expert /
        weight [A] -> [A, D], computed by the stock implementation as A tokens with one slot each.
        (The one place where the experts see their inputs: observe it to count the rows.)"""
        return super().forward(hidden_states[token], expert.unsqueeze(-1), weight.unsqueeze(-1))

    def __reduce_ex__(self, protocol):  # pickle, torch.save, deepcopy: the patched class (see pickling)
        return pickling.reduce(self, experts_class, (pickling.stock_class(self, SkippingExperts),), ())


_CLASSES: dict[type, type] = {}


def experts_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"ProbMoESkipping{cls.__name__}", (SkippingExperts, cls), {"__module__": cls.__module__})
    return _CLASSES[cls]


def install(experts) -> None:
    experts.__class__ = experts_class(type(experts))


def uninstall(experts) -> None:
    if isinstance(experts, SkippingExperts):
        experts.__class__ = next(c for c in type(experts).__mro__[1:] if not issubclass(c, SkippingExperts))
