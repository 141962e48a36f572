"""A probmoe checkpoint as a model of the LM Evaluation Harness (``lm-eval``, the ``eval`` extra).

``ProbMoELM`` is the harness's ``HFLM`` around a model loaded by
``probmoe.experiments.checkpoints.load``: with the routing saved beside the checkpoint
(``probmoe_routing.json``), or with the inference rule given (``method``, ``k``, ``kmin``,
``kmax``: exact-k MAP ``probmoe``, dynamic-k MAP ``probmoe-dynamic``, the stock router
``conventional``). Batching, log-likelihoods and generation are the harness's own; a
``RoutingTally`` counts the experts every real token is sent to in every MoE layer.
Importing this module registers the class under the harness's model name ``probmoe``:

    import probmoe.eval.harness, lm_eval
    lm_eval.simple_evaluate(model="probmoe", model_args="checkpoint=runs/a,method=probmoe-dynamic,kmin=4,kmax=8",
                            tasks=["mmlu"])

The ``lm_eval`` command imports only the harness's own models; ``python -m probmoe.eval.harness``
is that command with ``probmoe`` registered:

    python -m probmoe.eval.harness run --model probmoe --model_args checkpoint=runs/a,method=probmoe,k=2 \
        --tasks mmlu --batch_size 8

``evaluate`` runs tasks (the harness's names, plus task YAML under ``include_path``) and returns
the harness's results with the routing statistics.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import socket

import torch
from lm_eval.api.registry import register_model
from lm_eval.models import huggingface
from lm_eval.models.huggingface import HFLM

from probmoe.experiments.options import DTYPES

from .routing_tally import RoutingTally

FILES = ("results.json", "routing.json")  # what ``write_results`` writes (and samples_<task>.jsonl)


@register_model("probmoe")
class ProbMoELM(HFLM):
    """A checkpoint directory evaluated by the harness with a given routing.

    Args:
        checkpoint: a directory written by ``probmoe-train`` or any local transformers MoE checkpoint.
        method, k, kmin, kmax, algorithm, grad: as ``probmoe-eval``'s flags (None: the saved routing);
            ``backend``: the old name of ``algorithm``.
        device: "cpu", "cuda" or "cuda:N" (default: CUDA when present).
        dtype: the weights' dtype, one of ``DTYPES``.
        progress: False turns off the harness's progress bars (scoring, generation).
        batch_size, max_batch_size, and the rest: as ``HFLM``'s (``pretrained`` is the loaded model).
    """

    def __init__(
        self,
        checkpoint: str,
        method: str | None = None,
        k=None,
        kmin=None,
        kmax=None,
        algorithm: str | None = None,
        grad: str = "exact",
        device: str | None = None,
        dtype: str = "float32",
        batch_size=1,
        progress: bool = True,
        backend: str | None = None,
        **kwargs,
    ):
        from probmoe.experiments import checkpoints

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: no CUDA device is available")
        model, tokenizer = checkpoints.load(
            str(checkpoint),
            method=method,
            k=k,
            kmin=kmin,
            kmax=kmax,
            **(
                {k: v for k, v in (("algorithm", algorithm), ("backend", backend)) if v is not None}
                or {"algorithm": "circuit"}
            ),
            grad=grad,
            device=device,
            dtype=getattr(torch, dtype),
        )
        super().__init__(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, **kwargs)
        self.checkpoint = str(checkpoint)
        self.routing = checkpoints.describe(model)
        self.tally = RoutingTally(model)
        self.progress = progress

    # the harness's request types, each with its bar off when ``progress`` is
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not self.progress)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm or not self.progress)

    def generate_until(self, requests, disable_tqdm: bool = False):
        return super().generate_until(requests, disable_tqdm=disable_tqdm or not self.progress)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        """The harness's scoring, with each batch's real row lengths handed to the tally (it pads on the right)."""
        with _row_lengths(self.tally):
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)

    def _detect_batch_size(self, requests=None, pos: int = 0):
        """``batch_size="auto"``: the harness's probe forwards are not counted."""
        self.tally.paused = True
        try:
            return super()._detect_batch_size(requests, pos)
        finally:
            self.tally.paused = False


@contextlib.contextmanager
def _row_lengths(tally: RoutingTally):
    """While open, every right-padded batch ``HFLM`` builds tells ``tally`` its rows' real lengths."""
    original = huggingface.pad_and_concat

    def recording(max_length, tensors, padding_side="right"):
        if padding_side == "right":
            tally.next_lengths = [t.shape[-1] for t in tensors]
        return original(max_length, tensors, padding_side=padding_side)

    huggingface.pad_and_concat = recording
    try:
        yield
    finally:
        huggingface.pad_and_concat = original


@contextlib.contextmanager
def _context_bars(enabled: bool):
    """While open, the harness's "building contexts" bar (``lm_eval.api.task``'s tqdm, which takes no
    switch) is off unless ``enabled``."""
    import functools

    from lm_eval.api import task

    original = task.tqdm
    if not enabled:
        task.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        task.tqdm = original


def parse_tasks(text: str) -> list[str]:
    """``"a,b, c"`` -> ["a", "b", "c"]; ValueError for an empty list or an empty name."""
    names = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"--tasks must be a comma-separated list of task names, got {text!r}")
    return names


def task_manager(tasks: list[str], include_path: str | None = None):
    """The harness's ``TaskManager`` (with the YAML under ``include_path``), after checking every name
    in ``tasks`` is a task or group it knows; ValueError naming the unknown ones and near matches."""
    from lm_eval.tasks import TaskManager

    if include_path is not None and not os.path.isdir(include_path):
        raise ValueError(f"--include-path {include_path!r} is not a directory")
    manager = TaskManager(include_path=include_path)
    known = set(manager.all_tasks)
    unknown = [t for t in tasks if t not in known and not manager.match_tasks([t])]
    if unknown:
        hints = {t: difflib.get_close_matches(t, sorted(known), n=3) for t in unknown}
        raise ValueError(
            "--tasks: unknown task(s) "
            + "; ".join(f"{t!r}" + (f" (did you mean {', '.join(h)}?)" if h else "") for t, h in hints.items())
            + (
                f"; task YAML under {include_path!r} is included"
                if include_path
                else "; pass --include-path DIR for your own task YAML"
            )
        )
    return manager


OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face Hub (``HF_ENDPOINT``) cannot be reached from here, or None: one TCP
    connection tried for at most ``timeout`` seconds (the hub's client retries for most of a minute)."""
    from urllib.parse import urlsplit

    offline = [name for name in OFFLINE if os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE")]
    if offline:
        return f"{offline[0]} is set"
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"{host}:{port}: {e.strerror or e}"
    return None


@contextlib.contextmanager
def offline_when_unreachable():
    """Yields why the hub is unreachable (None when it is reachable). Meanwhile, when it is not, the
    hub client and ``datasets`` run offline (from the local cache, with no retries); the process's
    settings are restored after."""
    why = hub_unreachable()
    if why is None:
        yield None
        return
    import datasets
    import huggingface_hub.constants as hub

    saved = {name: os.environ.get(name) for name in OFFLINE}, hub.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    os.environ.update({name: "1" for name in OFFLINE})
    hub.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield why
    finally:
        for name, value in saved[0].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        hub.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved[1], saved[2]


def check_data(tasks: list[str], manager, unreachable: str | None) -> None:
    """With the hub ``unreachable`` (why, from ``offline_when_unreachable``): build ``tasks`` (their
    data from the local cache) before any model loads; ValueError at once, naming the tasks, when
    one's data is not there. Reachable: nothing to check here (the harness downloads it)."""
    if unreachable is None:
        return
    from lm_eval.tasks import get_task_dict

    try:
        get_task_dict(tasks, manager)
    except ConnectionError as e:  # datasets' / the hub client's OfflineModeIsEnabled, "Couldn't reach"
        raise ValueError(
            f"--tasks {','.join(tasks)}: a task's data is not in the local cache and the Hugging Face "
            f"Hub cannot be reached ({unreachable}; {e}); run once with network access to download "
            "and cache it"
        ) from None


def evaluate(
    lm: ProbMoELM,
    tasks: list[str],
    manager,
    *,
    limit=None,
    num_fewshot=None,
    allow_code_execution: bool = False,
    log_samples: bool = False,
    seed: int = 0,
) -> dict:
    """Run ``tasks`` on ``lm``: the harness's results dict (``samples`` only with ``log_samples``) with
    ``"probmoe"``: {"checkpoint", "routing", "routing_statistics": ``RoutingTally.summary()``} of these tasks.

    ``allow_code_execution`` passes the harness's ``confirm_run_unsafe_code`` and sets
    ``HF_ALLOW_CODE_EVAL=1``: tasks marked unsafe (MBPP) run the generated code.
    """
    import lm_eval

    if allow_code_execution:  # the harness's code_eval metric (MBPP, HumanEval) refuses to run without it
        os.environ["HF_ALLOW_CODE_EVAL"] = "1"
    lm.tally.reset()
    with _context_bars(lm.progress):
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=tasks,
            task_manager=manager,
            limit=limit,
            num_fewshot=num_fewshot,
            log_samples=log_samples,
            confirm_run_unsafe_code=allow_code_execution,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    results["probmoe"] = {"checkpoint": lm.checkpoint, "routing": lm.routing, "routing_statistics": lm.tally.summary()}
    return results


def write_results(out: str, results: dict) -> list[str]:
    """``evaluate``'s results into the folder ``out``: results.json (the harness's), routing.json (the
    routing statistics) and samples_<task>.jsonl (with ``log_samples``); returns the lines to print:
    each task's headline metric, then the experts per token."""
    from lm_eval.utils import handle_non_serializable

    results = dict(results)
    samples = results.pop("samples", {})
    routing = results.pop("probmoe")
    for name, value in (("results.json", results), ("routing.json", routing)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(value, f, indent=2, default=handle_non_serializable, ensure_ascii=False)
            f.write("\n")
    for task, rows in samples.items():
        with open(os.path.join(out, f"samples_{task}.jsonl"), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, default=handle_non_serializable, ensure_ascii=False) + "\n")
    lines = []
    for task, values in results["results"].items():
        metric = headline(values)
        if metric is not None:
            lines.append(f"{task}: {metric[0]} {metric[1]:.4f}")
    stats = routing["routing_statistics"]
    per_layer = ", ".join(f"{layer['experts_per_token']:.2f}" for layer in stats["layers"])
    lines.append(
        f"{routing['routing']}: {stats['experts_per_token']:.3f} experts/token over {stats['tokens']} tokens "
        f"(per layer {per_layer})"
    )
    return lines


def headline(task_results: dict) -> tuple[str, float] | None:
    """The first metric of one task's results (``results[task]``), e.g. ("acc,none", 0.25), or None."""
    for key, value in task_results.items():
        if "," in key and "_stderr" not in key and isinstance(value, (int, float)):
            return key, float(value)
    return None


if __name__ == "__main__":  # the harness's own command line, with ``probmoe`` registered (see the module docstring)
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
