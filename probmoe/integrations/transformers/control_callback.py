"""``RoutingControlCallback``: the per-step updates of a patched model (``controls.after_step``)
in a ``transformers.Trainer``.

    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.add_callback(RoutingControlCallback())
    trainer.train()

Needed for "remoe" (its L1 coefficient adapts after every step; without the callback it stays
λ₀) and for ``balance="aux-free"`` (the selection bias moves after every step; without the
callback it stays where it is); the values it sets are put into the next log as
``routing/remoe_sparsity``, ``routing/remoe_l1_coef`` and ``routing/balance_load_cv``.
"""

from __future__ import annotations

from transformers import TrainerCallback

from .controls import after_step


class RoutingControlCallback(TrainerCallback):
    def __init__(self, prefix: str = "routing/"):
        if not isinstance(prefix, str):
            raise ValueError(f"prefix must be a string, got {prefix!r}")
        self.prefix, self._last = prefix, {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("RoutingControlCallback needs the trainer's model (a model patched with patch_model)")
        self._last = after_step(model)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or not self._last:
            return
        stats = {f"{self.prefix}{name}": value for name, value in self._last.items()}
        logs.update(stats)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(stats)
