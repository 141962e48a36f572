"""``RoutingStatsCallback``: routing statistics of a patched model in a ``transformers.Trainer``'s logs.

Over every training forward since the last log (each micro-batch of gradient accumulation once;
checkpoint recomputations, which route the same tokens again, and eval forwards are left out;
padding tokens are left out where the model was given an attention mask), per MoE layer:

    routing/experts_per_token   mean experts used per token (``analysis.metrics.cardinality``)
    routing/load_cv             coefficient of variation of the tokens per expert (``load_cv``)
    routing/max_vio             (max load − mean load) / mean load (``max_vio``)
    routing/entropy             mean H(p)/log N of the routing distribution (``normalized_entropy``)
    routing/aux_loss            mean load-balancing loss (only when router logits are output,
                                i.e. when the aux loss enters the training loss)

each averaged over the layers; with ``per_layer=True`` also ``routing/layer{i}/<stat>``. The
statistics are those of ``probmoe.analysis.metrics``, computed from the experts the routers
really used (their ``GateRecord``) and the router logits they returned.
"""

from __future__ import annotations

import warnings

import torch
from transformers import TrainerCallback

from probmoe.analysis import metrics
from probmoe.replay import in_backward
from probmoe.scores import gate_scores

from .model import PatchedModel, patched_gates

STATS = ("experts_per_token", "load_cv", "max_vio", "entropy")


class _Layer:
    """Running sums of one MoE layer since the last log (float64, on the router's device)."""

    def __init__(self):
        self.tokens, self.experts, self.entropy, self.load = 0, 0.0, 0.0, None

    def add(self, probs, selected) -> None:  # probs [T, N] float, selected [T, N] bool
        load = metrics.expert_load(selected).double()  # [N]
        self.load = load if self.load is None else self.load + load
        self.tokens += selected.shape[0]
        self.experts = self.experts + metrics.cardinality(selected).double().sum()
        self.entropy = self.entropy + metrics.normalized_entropy(probs).sum()

    def summary(self) -> dict:
        out = {"experts_per_token": float(self.experts) / self.tokens, "entropy": float(self.entropy) / self.tokens}
        if float(self.load.sum()) > 0:  # a layer that sent no token anywhere (ReMoE can) has no balance
            out.update(load_cv=metrics.load_cv(self.load), max_vio=metrics.max_vio(self.load))
        return out


class RoutingStatsCallback(TrainerCallback):
    """Puts the routing statistics of a model patched by ``patch_model`` into the trainer's logs.

        trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
        RoutingStatsCallback().attach(trainer)   # first among the callbacks: console, wandb, ... see it
        trainer.train()                          # trainer.state.log_history holds "routing/..." keys

    (``callbacks=[RoutingStatsCallback()]`` works too, but then the callbacks before it, among them
    the console printer and the reporting integrations, get each log before the statistics are in.)

    per_layer: also log every layer's statistics as ``routing/layer{i}/<stat>``.
    """

    def __init__(self, per_layer: bool = False, prefix: str = "routing/"):
        if not isinstance(per_layer, bool):
            raise ValueError(f"per_layer must be True or False, got {per_layer!r}")
        if not isinstance(prefix, str):
            raise ValueError(f"prefix must be a string, got {prefix!r}")
        self.per_layer, self.prefix = per_layer, prefix
        self._handles, self._model = [], None
        self._reset()

    def attach(self, trainer) -> RoutingStatsCallback:
        """Add this callback to ``trainer`` as its first callback; returns it."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    def _reset(self) -> None:
        self._layers: dict[int, _Layer] = {}
        self._aux, self._aux_count = 0.0, 0
        self._mask = None

    # -- hooks on the model ------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._detach()
        gates = patched_gates(model) if model is not None else []
        if not gates:
            raise ValueError(
                "RoutingStatsCallback needs a model patched with "
                "probmoe.integrations.transformers.patch_model; the trainer's model has no patched "
                "router"
            )
        self._model = next(m for m in model.modules() if isinstance(m, PatchedModel))
        if self._model.probmoe_plan.options.aux_loss and not self._model.config.output_router_logits:
            warnings.warn(
                f"the model's aux_loss coefficient is {self._model.probmoe_plan.options.aux_loss:g} but "
                "config.output_router_logits is False, so the Trainer's loss leaves the load-balancing "
                "loss out: set model.config.output_router_logits = True",
                stacklevel=2,
            )
        self._handles.append(self._model.register_forward_pre_hook(self._before, with_kwargs=True))
        self._handles.append(self._model.register_forward_hook(self._after))
        for i, gate in enumerate(gates):
            self._handles.append(gate.register_forward_hook(self._router_hook(i)))
        self._reset()

    def on_train_end(self, args, state, control, **kwargs):
        self._detach()

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._model = [], None

    def _before(self, module, args, kwargs):
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        self._mask = mask.reshape(-1).bool() if isinstance(mask, torch.Tensor) else None  # [B·S]

    def _after(self, module, args, output):
        self._mask = None
        aux = getattr(output, "aux_loss", None)  # a ModelOutput's; None without router logits
        if module.training and isinstance(aux, torch.Tensor):
            self._aux = self._aux + aux.detach().double()
            self._aux_count += 1

    def _router_hook(self, layer: int):
        def hook(gate, args, output):
            if not gate.training or in_backward() or gate.probmoe_last is None:
                return  # eval, or a checkpoint recomputation of a forward already counted
            with torch.no_grad():
                logits, selected = output[0].detach(), gate.probmoe_last.selected  # [T, N] each
                if self._mask is not None and self._mask.numel() == logits.shape[0]:
                    keep = self._mask.to(logits.device)
                    logits, selected = logits[keep], selected[keep]
                if logits.shape[0] == 0 or not bool(torch.isfinite(logits).all()):
                    return
                probs = gate_scores(logits.float(), gate.probmoe_family.scores, normalized=True)
                self._layers.setdefault(layer, _Layer()).add(probs, selected)

        return hook

    # -- into the logs ---------------------------------------------------------------------------

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or not self._layers:
            return
        layers = [self._layers[i].summary() for i in sorted(self._layers)]
        stats = {}
        for name in STATS:  # the mean over the layers that have the statistic
            values = [s[name] for s in layers if name in s]
            if values:
                stats[f"{self.prefix}{name}"] = sum(values) / len(values)
        if self._aux_count:
            stats[f"{self.prefix}aux_loss"] = float(self._aux) / self._aux_count
        if self.per_layer:
            for i, s in zip(sorted(self._layers), layers):
                stats.update({f"{self.prefix}layer{i}/{name}": s[name] for name in STATS if name in s})
        logs.update(stats)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(stats)  # Trainer.log appended its copy before calling on_log
        self._reset()
