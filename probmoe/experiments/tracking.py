"""``probmoe-train --report-to tensorboard|wandb``: the training curves in an experiment tracker.

Every step record ``Trainer`` logs (``--log-every``) is sent as scalars at its step:

    train/loss, train/learning_rate, train/grad_norm, train/tokens_per_s
    train/router_loss       the router terms added to the loss: aux coefficient x aux loss + z coefficient x z-loss
    routing/experts_per_token, routing/load_cv, routing/max_vio, routing/entropy   (mean over layers)
    routing/aux_loss        the load-balancing loss itself, unweighted (when it is trained)
    routing/layer{i}/<the four statistics>        (each MoE layer)

The routing keys are ``RoutingStatsCallback``'s (``probmoe.integrations.transformers.callback``),
computed by that callback over every training forward since the previous record, so a
``transformers.Trainer`` run and a ``probmoe-train`` run plot under the same names. TensorBoard
writes event files into ``<output-dir>/tensorboard`` (a resume appends to them); Weights & Biases
writes under ``WANDB_DIR`` (default ``<output-dir>``), honours ``WANDB_MODE=offline``,
``WANDB_PROJECT`` (default ``probmoe``), and a resume logs into the same W&B run (its id kept in
``<output-dir>/wandb_run_id``, ``resume="allow"``). Neither library is imported unless asked for (the ``tracking`` extra).
"""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import string
import warnings
from types import SimpleNamespace

from .run_config import REPORT_TO

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
WANDB_ID_FILE = "wandb_run_id"  # in the output folder
TRAIN_KEYS = {
    "loss": "train/loss",
    "lr": "train/learning_rate",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "train/tokens_per_s",
    "router_loss": "train/router_loss",
}


def check(report_to: str, output_dir: str) -> None:
    """ValueError naming the choices, or the install command when the tracker's package is missing,
    or naming a damaged W&B run id file in ``output_dir``."""
    if report_to not in REPORT_TO:
        raise ValueError(f"--report-to must be one of {', '.join(REPORT_TO)}, got {report_to!r}")
    if report_to != "none" and importlib.util.find_spec(PACKAGES[report_to]) is None:
        raise ValueError(
            f"--report-to {report_to} needs the {PACKAGES[report_to]} package: pip install 'probmoe[tracking]'"
        )
    if report_to == "wandb":
        saved_wandb_run_id(output_dir)


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

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "probmoe"),
            dir=os.environ.get("WANDB_DIR", output_dir),
            config=config,
            name=os.path.basename(os.path.normpath(output_dir)),
            id=wandb_run_id(output_dir),
            resume="allow",
        )

    def write(self, scalars: dict, step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        super().close()
        self.run.finish()


def wandb_run_id(output_dir: str) -> str:
    """The W&B run id of the run in ``output_dir``: the one in its ``WANDB_ID_FILE``, so a resume
    logs into the same W&B run (TensorBoard appends to its event folder by itself), or a new one
    written there."""
    run_id = saved_wandb_run_id(output_dir)
    if run_id is not None:
        return run_id
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # as W&B's own ids
    path = os.path.join(output_dir, WANDB_ID_FILE)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(run_id + "\n")
    os.replace(tmp, path)
    return run_id


def saved_wandb_run_id(output_dir: str) -> str | None:
    """The id in ``output_dir``'s ``WANDB_ID_FILE`` (None: no file). ValueError if the file holds
    anything but an id."""
    path = os.path.join(output_dir, WANDB_ID_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        run_id = f.read(200).strip()
    if not re.fullmatch(r"[a-z0-9]{1,64}", run_id):
        raise ValueError(
            f"{path} must hold a W&B run id (lowercase letters and digits), got {run_id[:80]!r}; delete "
            "it to start a new W&B run"
        )
    return run_id


def start(report_to: str, output_dir: str, config: dict, model, step: int = 0) -> Tracker | None:
    """The tracker ``--report-to`` names (None for "none"), hooked to the patched ``model``, with the
    run's resolved ``config`` recorded; ``step``: where the run starts (a resume's step)."""
    check(report_to, output_dir)
    if report_to == "none":
        return None
    return (TensorBoard if report_to == "tensorboard" else Wandb)(output_dir, config, model, step)
