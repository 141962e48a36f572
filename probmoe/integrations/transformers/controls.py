"""What a patched model updates once per optimizer step, outside autograd.

    ReMoE ("remoe"): the L1 coefficient λ ← λ · α^sign(Q − S) (``remoe.update_coefficient``)
    aux-free balancing (``balance="aux-free"``): b_i += γ · sign(mean load − load_i) (``balance``)

``after_step(model)`` applies it; ``probmoe-train`` calls it after every optimizer step,
``RoutingControlCallback`` (``control_callback``) after every step of a ``transformers.Trainer``;
a hand-written loop calls it after ``optimizer.step()``.
"""

from __future__ import annotations

from .model import PatchedModel, patched_gates
from .balance import update_bias
from .remoe import update_coefficient


def after_step(model) -> dict:
    """Apply the per-step updates of a patched ``model`` (a wrapper around one is searched);
    returns what was done: {"remoe_sparsity": S, "remoe_l1_coef": λ} for ReMoE,
    {"balance_load_cv": mean over layers of the step's load CV} with aux-free balancing; {} if
    nothing.
    ValueError if the model is not patched."""
    patched = next((m for m in model.modules() if isinstance(m, PatchedModel)), None)
    if patched is None:
        raise ValueError("model is not patched by probmoe.integrations.transformers.patch_model")
    plan = patched.probmoe_plan
    out = {}
    if plan.method == "remoe":
        states = [g.probmoe_remoe for g in patched_gates(patched)]
        sparsity = update_coefficient(states, 1.0 - plan.top_k / plan.num_experts, plan.l1_rate)
        if sparsity is not None:
            out.update(remoe_sparsity=sparsity, remoe_l1_coef=float(states[0][0]))
    if plan.balance is not None:
        cv = update_bias(patched_gates(patched), plan.balance_rate)
        if cv is not None:
            out["balance_load_cv"] = sum(cv) / len(cv)
    return out
