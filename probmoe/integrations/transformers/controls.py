"""What a patched model updates once per optimizer step, outside autograd.

    ReMoE ("remoe"): the L1 coefficient λ ← λ · α^sign(Q − S) (``remoe.update_coefficient``)

``after_step(model)`` applies it; ``probmoe-train`` calls it after every optimizer step,
``RoutingControlCallback`` (``control_callback``) after every step of a ``transformers.Trainer``;
a hand-written loop calls it after ``optimizer.step()``.
"""

from __future__ import annotations

from .model import PatchedModel, patched_gates
from .remoe import update_coefficient


def after_step(model) -> dict:
    """Apply the per-step updates of a patched ``model`` (a wrapper around one is searched);
    returns what was done: {"remoe_sparsity": S, "remoe_l1_coef": λ} for ReMoE, else {}.
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
    return out
