"""ReMoE's L1 penalties riding on a transformers loss: ``collecting`` the routers' penalties during
a ``*ForCausalLM`` forward and each micro-batch's weight (``micro_batch_weight``). The method itself
(its gates, penalty, λ update; the references to the official code): ``probmoe.methods.remoe``,
whose names are re-exported here.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from probmoe.methods.remoe import (  # noqa: F401 (the names this module had; their home is the method's)
    L1_COEF,
    L1_LAYERS,
    L1_RATE,
    LAYER_REDUCTIONS,
    attach,
    penalty,
    remoe_gates,
    update_coefficient,
)


@contextlib.contextmanager
def collecting(gates):
    """Within: the ReMoE routers ``gates`` append their penalties to the list yielded instead of
    attaching them to their gates (for ``attach`` to the loss); nested, the outer list keeps them."""
    if not gates or getattr(gates[0], "probmoe_penalties", None) is not None:
        yield getattr(gates[0], "probmoe_penalties", []) if gates else []
        return
    penalties = []
    for gate in gates:
        gate.probmoe_penalties = penalties
    try:
        yield penalties
    finally:
        for gate in gates:
            gate.probmoe_penalties = None


def micro_batch_weight(
    labels: Tensor, num_items_in_batch, shift_labels: Tensor | None = None, ignore_index: int = -100
):
    """The share of the step's label tokens in this micro-batch, n / ``num_items_in_batch`` (n
    counted as transformers' causal-LM loss counts them: labels[..., 1:] or ``shift_labels``,
    ignore_index left out), the factor this micro-batch's loss carries; 1 without
    ``num_items_in_batch`` (the loss is a mean, and the loop divides it by G)."""
    if num_items_in_batch is None:
        return 1.0
    targets = shift_labels if shift_labels is not None else labels[..., 1:]
    n = (targets != ignore_index).sum()  # []
    total = torch.as_tensor(num_items_in_batch, device=n.device).float().clamp(min=1)
    return n.float() / total
