"""``probmoe-train --report-to tensorboard|wandb``: the training curves in an experiment tracker.

Every step record ``Trainer`` logs (``--log-every``) is sent as scalars at its step:

    train/loss, train/learning_rate, train/grad_norm, train/tokens_per_s, train/aux_loss
    routing/experts_per_token, routing/load_cv, routing/max_vio, routing/entropy   (mean over layers)
    routing/aux_loss                              (when the load-balancing loss is trained)
    routing/layer{i}/<the four statistics>        (each MoE layer)

The routing keys are ``RoutingStatsCallback``'s (``probmoe.integrations.transformers.callback``),
computed by that callback over every training forward since the previous record, so a
``transformers.Trainer`` run and a ``probmoe-train`` run plot under the same names. TensorBoard
writes event files into ``<output-dir>/tensorboard``; Weights & Biases writes under ``WANDB_DIR``
(default ``<output-dir>``) and honours ``WANDB_MODE=offline``, ``WANDB_PROJECT`` (default
``probmoe``). Neither library is imported unless asked for (the ``tracking`` extra).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from types import SimpleNamespace

from .run_config import REPORT_TO

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
TRAIN_KEYS = {"loss": "train/loss", "lr": "train/learning_rate", "grad_norm": "train/grad_norm",
              "tokens_per_s": "train/tokens_per_s", "aux_loss": "train/aux_loss"}


def check(report_to: str) -> None:
    """ValueError naming the choices, or the install command when the tracker's package is missing."""
    if report_to not in REPORT_TO:
        raise ValueError(f"--report-to must be one of {', '.join(REPORT_TO)}, got {report_to!r}")
    if report_to != "none" and importlib.util.find_spec(PACKAGES[report_to]) is None:
        raise ValueError(f"--report-to {report_to} needs the {PACKAGES[report_to]} package: "
                         "pip install 'probmoe[tracking]'")


class Tracker:
    """Scalars of the step records into one tracker; ``routing`` collects the routing statistics
    from the model's training forwards between records."""

    def __init__(self, model, step: int):
        from probmoe.integrations.transformers.callback import RoutingStatsCallback

        self.routing = RoutingStatsCallback(per_layer=True)
        with warnings.catch_warnings():  # its output_router_logits warning is a Trainer's: Trainer asks per forward
            warnings.simplefilter("ignore", UserWarning)
            self.routing.on_train_begin(None, None, None, model=model)  # hooks on the patched routers
        self._state = SimpleNamespace(log_history=[], global_step=step)

    def scalars(self, record: dict) -> dict[str, float]:
        """A step record's scalars under the tracker keys (module docstring)."""
        out = {key: float(record[name]) for name, key in TRAIN_KEYS.items() if record.get(name) is not None}
        logs = {}
        self._state.global_step = record["step"]
        self.routing.on_log(None, self._state, None, logs=logs)  # the statistics since the last record
        out.update({key: float(value) for key, value in logs.items()})
        return out

    def log(self, record: dict) -> None:
        self.write(self.scalars(record), record["step"])

    def close(self) -> None:
        self.routing.on_train_end(None, self._state, None)


class TensorBoard(Tracker):
    def __init__(self, output_dir: str, config: dict, model, step: int):
        super().__init__(model, step)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=os.path.join(output_dir, "tensorboard"))
        self.writer.add_text("config", "\n".join(f"    {key}: {value}" for key, value in config.items()), step)

    def write(self, scalars: dict, step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        super().close()
        self.writer.close()


class Wandb(Tracker):
    def __init__(self, output_dir: str, config: dict, model, step: int):
        super().__init__(model, step)
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "probmoe"),
                              dir=os.environ.get("WANDB_DIR", output_dir), config=config,
                              name=os.path.basename(os.path.normpath(output_dir)))

    def write(self, scalars: dict, step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        super().close()
        self.run.finish()


def start(report_to: str, output_dir: str, config: dict, model, step: int = 0) -> Tracker | None:
    """The tracker ``--report-to`` names (None for "none"), hooked to the patched ``model``, with the
    run's resolved ``config`` recorded; ``step``: where the run starts (a resume's step)."""
    check(report_to)
    if report_to == "none":
        return None
    return (TensorBoard if report_to == "tensorboard" else Wandb)(output_dir, config, model, step)
