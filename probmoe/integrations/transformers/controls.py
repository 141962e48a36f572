"""What a patched model updates once per optimizer step, outside autograd.

    the method's own control on its state (``Method.after_step``; ReMoE: the L1 coefficient
        λ ← λ · α^sign(Q − S))
    aux-free balancing (``balance="aux-free"``): b_i += γ · sign(mean load − load_i) (``balance``)

``after_step(model)`` applies it; ``probmoe-train`` calls it after every optimizer step,
``RoutingControlCallback`` (``control_callback``) after every step of a ``transformers.Trainer``;
a hand-written loop calls it after ``optimizer.step()``.
"""

from __future__ import annotations

import contextlib

from .balance import update_bias
from .model import PatchedModel, patched_gates
from .remoe import attach, collecting

__all__ = ["after_step", "attach", "remoe_penalties"]


def _patched(model):
    patched = next((m for m in model.modules() if isinstance(m, PatchedModel)), None)
    if patched is None:
        raise ValueError("model is not patched by probmoe.integrations.transformers.patch_model")
    return patched


@contextlib.contextmanager
def remoe_penalties(model):
    """For a loop that computes its own loss: within, a ReMoE model's L1 penalties are collected
    into the list yielded (empty for the other methods), to ride on that loss as a loss term:

        with remoe_penalties(model) as penalties:
            out = model(input_ids)
        loss = attach(my_loss(out) / G, penalties, 1 / G)   # G micro-batches per step

    (``attach``: the loss's value unchanged; Σ penalties · weight gets the loss's gradient, so a
    GradScaler's scale and DDP's/FSDP's averaging reach it.) Without it, and without labels
    passed to the model, the penalties enter the gates' gradient at scale 1."""
    patched = _patched(model)
    gates = patched_gates(patched) if patched.probmoe_plan.rules.penalizes else []
    with collecting(gates) as penalties:
        yield penalties


def after_step(model) -> dict:
    """Apply the per-step updates of a patched ``model`` (a wrapper around one is searched);
    returns what was done: the method's control's statistics ({"remoe_sparsity": S,
    "remoe_l1_coef": λ} for ReMoE),
    {"balance_load_cv": mean of the step's load CV over the layers sent some token} with aux-free
    balancing; {} if nothing. Every value is a number (a statistic with no data is absent).
    ValueError if the model is not patched."""
    patched = _patched(model)
    plan = patched.probmoe_plan
    out = {}
    method = plan.rules
    if method.state_buffer is not None:
        states = [g._buffers[method.state_buffer] for g in patched_gates(patched)]
        out.update(method.after_step(states, top_k=plan.top_k, num_experts=plan.num_experts, options=plan.options))
    if plan.options.balance is not None:
        cv = update_bias(patched_gates(patched), plan.options.balance_rate)
        if cv:
            out["balance_load_cv"] = sum(cv) / len(cv)
    return out
