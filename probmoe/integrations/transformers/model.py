"""The patched top-level model: the aux losses in ``forward`` and the settings file in ``save_pretrained``.

Like the routers, the model keeps its instance and gets a run-time subclass of its own class,
named as the original, so ``save_pretrained`` writes the stock ``architectures`` to config.json
(renamed ``ProbMoE...`` where no stock engine serves the checkpoint's rule: ``architecture``)
(pickling reduces it to ``model_class`` and the stock class: ``pickling``). A ``*ForCausalLM``'s
patched ``forward`` carries the stock forward's signature, read from the installed release (so
``Trainer``'s column filter and ``generate`` see the stock parameters, whatever a release
renames), and binds its arguments by it; a stock forward without the parameters the aux losses
need is a ``LayoutError`` at patch time.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import torch

from . import architecture, losses, pickling, remoe, resume, runtime_state, settings
from .families import layout_error
from .gate import PatchedGate

NEEDED = ("attention_mask", "labels")  # parameters of the stock forward used here (output_router_logits may be
# a named parameter or, as for DeepSeek-V3, one of its **kwargs)


def patched_gates(model) -> list:
    """The model's patched routers in module (= layer) order."""
    return [m for m in model.modules() if isinstance(m, PatchedGate)]


class PatchedModel:
    """Mixin for any patched model: ``save_pretrained`` writes the stock checkpoint (the routing
    state left out; config.json's architectures a probmoe name where no stock engine serves its
    rule: ``architecture``) with ``probmoe_routing.json`` and, for methods with training state,
    ``probmoe_state.safetensors`` (``runtime_state``); ``load_state_dict`` also takes the
    per-expert keys ``save_pretrained`` writes (``resume``) and a state dict without the routing
    state (which it leaves as it is)."""

    ADDED = ("probmoe_plan", "probmoe_family", "probmoe_generator", "probmoe_requires_grad", "probmoe_last_z_loss")
    TRANSIENT = ("probmoe_last_z_loss",)  # what the last forward left (with its graph): not pickled

    def save_pretrained(self, save_directory, *args, **kwargs):
        arguments = inspect.signature(super().save_pretrained).bind(save_directory, *args, **kwargs).arguments
        state_dict = arguments.get("state_dict")  # given by Trainer and FSDP's gather; else the model's own
        arguments["state_dict"] = runtime_state.without_state(self.state_dict() if state_dict is None else state_dict)
        extra = arguments.pop("kwargs", {})
        written = []

        def write_ours():  # the settings file, the architecture, the routing state: once
            if not written and arguments.get("is_main_process", True):
                settings.write(save_directory, self.probmoe_plan, self.probmoe_family.model_type)
                architecture.write(save_directory, self.probmoe_plan, self.probmoe_family.model_type)
                runtime_state.save(self, save_directory)
            written.append(True)

        upload = self._upload_modified_files

        def write_then_upload(*a, **k):  # push_to_hub=True uploads what is in the folder then: ours too
            write_ours()
            return upload(*a, **k)

        self.__dict__["_upload_modified_files"] = write_then_upload
        try:
            result = super().save_pretrained(**arguments, **extra)
        finally:
            del self.__dict__["_upload_modified_files"]
        write_ours()
        return result

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict`` of a state dict in the model's layout or as
        ``save_pretrained`` wrote it (per-expert keys: ``resume``), as ``Trainer`` resumes; routing
        state the state dict lacks keeps its values (with a warning, unless ``Trainer`` is about to
        read it from ``probmoe_state.safetensors``: ``trainer_resume``)."""
        import transformers

        if resume.needed(transformers.__version__):
            state_dict = resume.to_model_layout(self, state_dict)
        lacking = {name: buf for name, buf in runtime_state.state_buffers(self).items() if name not in state_dict}
        if lacking:
            if not runtime_state.trainer_reads_state():
                warnings.warn(
                    f"{', '.join(sorted(lacking))} (routing state) are not in the state dict and keep their "
                    f"values; {runtime_state.FILENAME} holds them: runtime_state.load(model, checkpoint_dir), "
                    "or trainer_resume.install() before a Trainer resumes",
                    stacklevel=2,
                )
            state_dict = {**state_dict, **lacking}
        return super().load_state_dict(state_dict, strict, assign)

    def __reduce_ex__(self, protocol):
        pickling.drop_capture_hooks(self)
        stock = pickling.stock_class(self, PatchedModel)
        return pickling.reduce(self, model_class, (stock, isinstance(self, PatchedCausalLM)), self.TRANSIENT)


class PatchedCausalLM(PatchedModel):
    """Mixin for ``*ForCausalLM``: with ``output_router_logits`` (argument or config, as in
    transformers) the loss gets ``aux_loss · load_balancing_loss + z_loss · router_z_loss``, both
    computed from the experts the routers actually used (``losses``), in place of HF's own
    load-balancing term. ``aux_loss`` in the output holds the load-balancing loss (as HF's does);
    the z-loss of the last forward with router logits is kept in ``probmoe_last_z_loss``.
    ReMoE's L1 penalties ride on the loss this forward computes (``remoe.attach``)."""

    def probmoe_forward(self, arguments: dict, extra: dict):
        """The forward, given the stock forward's named ``arguments`` and its ``**kwargs`` ``extra``;
        for ReMoE in training with labels, the routers' penalties are collected and attached to the
        loss, weighted as the loss is (``remoe.micro_batch_weight``)."""
        labels = arguments.get("labels")
        gates = patched_gates(self) if self.probmoe_plan.rules.penalizes else []
        collect = (
            gates
            and labels is not None
            and self.training
            and torch.is_grad_enabled()
            and getattr(gates[0], "probmoe_penalties", None) is None
        )  # not inside remoe_penalties()
        if not collect:
            return PatchedCausalLM.probmoe_loss_forward(self, arguments, extra)
        weight = remoe.micro_batch_weight(labels, extra.get("num_items_in_batch"), extra.get("shift_labels"))
        with remoe.collecting(gates) as penalties:
            out = PatchedCausalLM.probmoe_loss_forward(self, arguments, extra)
        if isinstance(out, tuple):
            return (remoe.attach(out[0], penalties, weight),) + out[1:]
        out["loss"] = remoe.attach(out["loss"], penalties, weight)
        return out

    def probmoe_loss_forward(self, arguments: dict, extra: dict):
        """The forward with the aux losses (see the class)."""
        stock = super().forward
        labels, attention_mask = arguments.pop("labels", None), arguments.get("attention_mask")
        output_router_logits = arguments.pop("output_router_logits", extra.pop("output_router_logits", None))
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        if not output_router_logits:
            return stock(**arguments, labels=labels, output_router_logits=False, **extra)
        return_dict = extra.pop("return_dict", None)
        out = stock(**arguments, labels=None, output_router_logits=True, return_dict=True, **extra)
        plan = self.probmoe_plan
        router_logits = tuple(out.router_logits)  # per layer [T, N], captured by HF's own hooks
        selected = [g.probmoe_last.selected for g in patched_gates(self)]  # per layer [T, N] bool
        balance = losses.load_balancing_loss(router_logits, selected, attention_mask, self.probmoe_family.scores)
        z = losses.router_z_loss(router_logits, attention_mask) if plan.options.z_loss else None
        self.probmoe_last_z_loss = z
        loss = None
        if labels is not None:
            loss = self.loss_function(out.logits, labels, self.vocab_size, **extra)
            if plan.options.aux_loss:
                loss = loss + plan.options.aux_loss * balance.to(loss.device)
            if z is not None:
                loss = loss + plan.options.z_loss * z.to(loss.device)
        fields = dict(out)
        fields.update(loss=loss, aux_loss=balance)
        out = type(out)(**fields)
        if return_dict is False:
            return out.to_tuple()
        return out


def causal_lm_forward(cls: type):
    """A ``forward`` for the patched subclass of ``cls``, with ``cls.forward``'s signature."""
    signature = inspect.signature(cls.forward)
    params = signature.parameters
    kinds = [p.kind for p in params.values()]
    problems = [f"has no parameter {name!r}" for name in NEEDED if name not in params]
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        problems.append("takes no **kwargs")
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        problems.append("takes *args")
    if problems:
        model_type = getattr(getattr(cls, "config_class", None), "model_type", cls.__name__)
        raise layout_error(model_type, f"{cls.__name__}.forward{signature} {' and '.join(problems)}")
    variadic = next(p.name for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD)
    instance = next(iter(params))  # "self"

    @functools.wraps(cls.forward)
    def forward(self, *args, **kwargs):
        arguments = dict(signature.bind(self, *args, **kwargs).arguments)  # TypeError as the stock forward
        del arguments[instance]
        extra = arguments.pop(variadic, {})
        return PatchedCausalLM.probmoe_forward(self, arguments, extra)

    forward.__signature__ = signature
    return forward


_CLASSES: dict[tuple, type] = {}


def model_class(cls: type, causal_lm: bool) -> type:
    key = (cls, causal_lm)
    if key not in _CLASSES:
        mixin = PatchedCausalLM if causal_lm else PatchedModel
        # same name and module as the original: config.json's "architectures" stay stock, and
        # transformers' source heuristics (set_experts_implementation) keep working
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        if causal_lm:
            namespace["forward"] = causal_lm_forward(cls)
        _CLASSES[key] = type(cls.__name__, (mixin, cls), namespace)
    return _CLASSES[key]


def is_patched_class(cls: type) -> bool:
    """Whether ``cls`` is a class ``model_class`` made (not a later subclass of one)."""
    return cls in _CLASSES.values()


def is_causal_lm(model) -> bool:
    return hasattr(model, "lm_head") and hasattr(model, "loss_function") and "ForCausalLM" in type(model).__name__


def install(model) -> None:
    model.__class__ = model_class(type(model), is_causal_lm(model))


def uninstall(model) -> None:
    model.__class__ = pickling.stock_class(model, PatchedModel)
    for name in PatchedCausalLM.ADDED:
        model.__dict__.pop(name, None)
