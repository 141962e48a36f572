"""The patched top-level model: the aux losses in ``forward`` and the settings file in ``save_pretrained``.

Like the routers, the model keeps its instance and gets a run-time subclass of its own class,
named as the original, so ``save_pretrained`` writes the stock ``architectures`` to config.json.
"""

from __future__ import annotations

from . import losses, settings
from .gate import PatchedGate


def patched_gates(model) -> list:
    """The model's patched routers in module (= layer) order."""
    return [m for m in model.modules() if isinstance(m, PatchedGate)]


class PatchedModel:
    """Mixin for any patched model: ``save_pretrained`` also writes ``probmoe_routing.json``."""

    ADDED = ("probmoe_plan", "probmoe_family", "probmoe_generator", "probmoe_requires_grad", "probmoe_last_z_loss")

    def save_pretrained(self, save_directory, *args, **kwargs):
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            settings.write(save_directory, self.probmoe_plan, self.probmoe_family.model_type)
        return result


class PatchedCausalLM(PatchedModel):
    """Mixin for ``*ForCausalLM``: with ``output_router_logits`` (argument or config, as in
    transformers) the loss gets ``aux_loss · load_balancing_loss + z_loss · router_z_loss``, both
    computed from the experts the routers actually used (``losses``), in place of HF's own
    load-balancing term. ``aux_loss`` in the output holds the load-balancing loss (as HF's does);
    the z-loss of the last forward is kept in ``probmoe_last_z_loss``."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                labels=None, use_cache=None, output_router_logits=None, logits_to_keep=0, **kwargs):
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        call = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                    logits_to_keep=logits_to_keep)
        if not output_router_logits:
            return super().forward(**call, labels=labels, output_router_logits=False, **kwargs)
        return_dict = kwargs.pop("return_dict", None)
        out = super().forward(**call, labels=None, output_router_logits=True, return_dict=True, **kwargs)
        plan = self.probmoe_plan
        router_logits = tuple(out.router_logits)  # per layer [T, N], captured by HF's own hooks
        selected = [g.probmoe_last.selected for g in patched_gates(self)]  # per layer [T, N] bool
        balance = losses.load_balancing_loss(router_logits, selected, attention_mask, self.probmoe_family.scores)
        z = losses.router_z_loss(router_logits, attention_mask) if plan.z_loss else None
        self.probmoe_last_z_loss = z
        loss = None
        if labels is not None:
            loss = self.loss_function(out.logits, labels, self.vocab_size, **kwargs)
            if plan.aux_loss:
                loss = loss + plan.aux_loss * balance.to(loss.device)
            if z is not None:
                loss = loss + plan.z_loss * z.to(loss.device)
        fields = dict(out)
        fields.update(loss=loss, aux_loss=balance)
        out = type(out)(**fields)
        if return_dict is False:
            return out.to_tuple()
        return out


_CLASSES: dict[tuple, type] = {}


def model_class(cls: type, causal_lm: bool) -> type:
    key = (cls, causal_lm)
    if key not in _CLASSES:
        mixin = PatchedCausalLM if causal_lm else PatchedModel
        # same name and module as the original: config.json's "architectures" stay stock, and
        # transformers' source heuristics (set_experts_implementation) keep working
        _CLASSES[key] = type(cls.__name__, (mixin, cls), {"__module__": cls.__module__,
                                                           "__qualname__": cls.__qualname__})
    return _CLASSES[key]


def is_causal_lm(model) -> bool:
    return hasattr(model, "lm_head") and hasattr(model, "loss_function") and "ForCausalLM" in type(model).__name__


def install(model) -> None:
    model.__class__ = model_class(type(model), is_causal_lm(model))


def uninstall(model) -> None:
    model.__class__ = next(c for c in type(model).__mro__[1:] if not issubclass(c, PatchedModel))
    for name in PatchedCausalLM.ADDED:
        model.__dict__.pop(name, None)
