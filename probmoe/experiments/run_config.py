"""Every option of ``probmoe-train``, ``probmoe-eval`` and ``probmoe-analyze``, with its default,
help, allowed values and check, in one place (as torchtitan's ``JobConfig``): ``TrainConfig``,
``EvalConfig``, ``AnalyzeConfig`` (the last two extend ``CheckpointRunConfig``). The commands'
flags are generated from these fields (``config_parser``), a ``--config`` file sets them by their
flag names, and ``Trainer`` runs on a ``TrainConfig``.

A field's ``metadata`` (``option``) says how it appears on the command line: ``help``, ``type``
(a check that names the allowed range, ``options.positive_int`` ...), ``choices``, ``flag`` (when
not ``--`` + the field's name with ``-``), ``switch`` (a boolean flag; ``negate``: the flag turns
the field off, ``--no-progress``), ``append`` (repeatable), ``required``, ``group`` (the help's
section), ``exclusive`` (at most one of the fields sharing the name), ``to_value`` (the flag's word
as the field's value: ``--balance none`` is ``balance=None``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from probmoe.config import BACKENDS, GRADS
from probmoe.integrations.method_names import ALL_METHODS

from .models import TINY
from .options import DEVICES, DTYPES, nonnegative_float, nonnegative_int, positive_float, positive_int
from .shapes import SHAPES

SCHEDULES = ("constant", "linear", "cosine")  # --lr-schedule
# --balance: patch_model's balance=None or one of integrations.transformers.methods.BALANCES (not imported
# here: that package imports transformers, and --help must not)
BALANCES = ("none", "aux-free")
REPORT_TO = ("none", "tensorboard", "wandb")  # --report-to (tracking)
LARGE = 'large models (docs/experiments.md, "the paper\'s OLMoE run on 8 GPUs")'
HARNESS = "LM Evaluation Harness (pip install 'probmoe[eval]')"
ROUTING = "routing (default: the one saved with the checkpoint)"
RUNNING = "device, dtype and output"


def option(default=None, help: str | None = None, **cli):
    """A config field with its command-line description (see the module docstring)."""
    return field(default=default, metadata={"help": help, **cli})


def _balance(word):
    return None if word == "none" else word


def _method(default: str | None, help: str, **cli):
    return option(default, f"routing method (see docs/transformers.md); {help}", choices=ALL_METHODS, **cli)


# the routing flags, as patch_model's arguments, and the flags all three commands have (TrainConfig's and
# CheckpointRunConfig's fields; ``cli``: more of the field's command-line description, e.g. its help section)
def _k(**cli):
    return option(
        None,
        "experts per token of the exactly-k ProbMoE methods (default: the model's top-k)",
        type=positive_int,
        **cli,
    )


def _kmin(**cli):
    return option(None, "fewest experts per token (probmoe-dynamic; default 1)", type=positive_int, **cli)


def _kmax(**cli):
    return option(
        None, "most experts per token (probmoe-dynamic; default: the model's top-k)", type=positive_int, **cli
    )


def _backend(**cli):
    return option(BACKENDS[0], "exact backend of the ProbMoE methods", choices=BACKENDS, **cli)


def _grad(**cli):
    return option(
        GRADS[0], "gradient of the marginals: exact Cov(z), or the paper's Cov(z) diag(1 - p)", choices=GRADS, **cli
    )


def _device(**cli):
    return option(None, "default: CUDA when present", choices=DEVICES, **cli)


def _progress(**cli):
    return option(
        True,
        "no progress bars (ours, the harness's, and transformers', safetensors' and datasets' loading and saving bars)",
        switch=True,
        negate=True,
        flag="--no-progress",
        **cli,
    )


def _data_format():
    from .formats import FORMATS

    return option(
        None,
        "the records' format (default: told by their fields; see docs/experiments.md, Data)",
        choices=tuple(FORMATS),
    )


@dataclass
class TrainConfig:
    """Everything ``probmoe-train`` is told; each field is the flag of the same name."""

    model: str | None = option(
        None,
        f"{', '.join(TINY)} "
        "(randomly initialised, byte-level tokenizer); a published shape with random weights ("
        f"{', '.join(SHAPES)}; with --layers, --plan); or a local checkpoint directory of "
        "those families (OLMoE, Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek-V3)",
        required=True,
    )
    data: str | None = option(
        None,
        ".jsonl, .json or .parquet records: question/answer (GSM8K), prompt/completion, "
        "messages (chat template) or text",
    )
    output_dir: str | None = option(None, "checkpoints, the final model, config.yaml and train_log.jsonl")
    data_format: str | None = _data_format()  # None: told by the data's fields (formats.detect)
    method: str = _method("probmoe", "default probmoe")
    k: int | None = _k()
    kmin: int | None = _kmin()
    kmax: int | None = _kmax()
    backend: str = _backend()
    grad: str = _grad()
    aux_loss: float | None = option(
        None,
        "load-balancing loss coefficient (default: the model config's router_aux_loss_coef)",
        type=nonnegative_float,
    )
    z_loss: float | None = option(
        None, "router z-loss coefficient (default: the config's router_z_loss_coef, or 0)", type=nonnegative_float
    )
    l1_coef: float | None = option(
        None, "remoe: initial L1 coefficient λ0 of the ReLU gates (default 1e-8, the paper's)", type=positive_float
    )
    l1_rate: float | None = option(
        None,
        "remoe: factor (> 1) λ is multiplied or divided by after each step to steer "
        "the mean number of active experts to the model's top-k (default 1.2)",
        type=positive_float,
    )
    l1_layers: str | None = option(
        None,
        "remoe: the penalty over the layers, sum (λ per layer, the official code; "
        "default) or mean (λ/L, the paper's formula)",
        choices=("sum", "mean"),
    )
    jitter_eps: float | None = option(
        None, "sparsemixer: the band half-width ε (default 0.01, GRIN-MoE's)", type=positive_float
    )
    balance: str | None = option(
        None,
        "aux-free: DeepSeek-V3's auxiliary-loss-free balancing, a per-expert bias on "
        "the selection scores updated after each step (not for sparsemixer, remoe; default "
        "none)",
        choices=BALANCES,
        to_value=_balance,
    )
    balance_rate: float | None = option(None, "aux-free: the bias step γ (default 1e-3)", type=positive_float)
    max_steps: int | None = option(None, "optimizer steps in all", type=positive_int, exclusive="length")
    epochs: float | None = option(None, "passes over the data (default 1)", type=positive_float, exclusive="length")
    lr: float = option(1e-3, "peak learning rate (AdamW)", type=positive_float)
    lr_schedule: str = option("linear", "learning-rate schedule after the warm-up", choices=SCHEDULES)
    warmup_steps: int = option(0, type=nonnegative_int)
    weight_decay: float = option(0.0, type=nonnegative_float)
    max_grad_norm: float = option(1.0, "0: no clipping", type=nonnegative_float)
    batch_size: int = option(8, "examples per process per micro-batch", type=positive_int)
    grad_accum: int = option(1, "micro-batches per optimizer step", type=positive_int)
    max_length: int = option(1024, "tokens per example, at most", type=positive_int)
    seed: int = option(
        0, "seed of the initial weights, the data order and the routing's sampling", type=nonnegative_int
    )
    deterministic: str = option(
        "auto",
        "deterministic kernels, so that the same seeded run repeats bit for bit: "
        "auto (on for the CPU, where they cost nothing measurable; off on CUDA), on, off "
        "(experiments.determinism)",
        choices=("auto", "on", "off"),
    )
    bf16: bool = option(False, "bf16 autocast", switch=True)
    gradient_checkpointing: bool = option(
        False, "recompute each decoder layer's activations in the backward pass: less memory, more time", switch=True
    )
    resume: str | None = option(None, "a checkpoint directory, or 'latest' (the newest in --output-dir)")
    stop_after: int | None = option(
        None, "stop after this step with a resumable checkpoint, the schedule unchanged", type=positive_int
    )
    save_every: int = option(0, "write a resumable checkpoint every N steps (0: only at the end)", type=nonnegative_int)
    log_every: int = option(
        1, "write a train_log.jsonl record (and --report-to's scalars) every N steps", type=positive_int
    )
    report_to: str = option(
        "none",
        "also send loss, learning rate, grad norm, tokens/s and the routing statistics "
        "per layer to TensorBoard (<output-dir>/tensorboard) or Weights & Biases (WANDB_MODE="
        "offline works; pip install 'probmoe[tracking]')",
        choices=REPORT_TO,
    )
    device: str | None = _device()
    progress: bool = _progress()
    fsdp: bool = option(
        False,
        "shard every decoder layer over the processes with FSDP2 (under torchrun); with "
        "--bf16: bf16 compute, fp32 gradient reduction",
        switch=True,
        group=LARGE,
    )
    param_dtype: str = option(
        "float32",
        "dtype the parameters and AdamW state are stored in (a checkpoint loads straight into it)",
        choices=("float32", "bfloat16"),
        group=LARGE,
    )
    layers: int | None = option(
        None,
        "decoder layers of a built-in model (default: its own); e.g. olmoe-1b-7b-shape "
        "at its real widths and reduced depth",
        type=positive_int,
        group=LARGE,
    )
    global_batch_size: int | None = option(
        None,
        "examples per optimizer step over all processes (replaces "
        "--batch-size: must divide by processes x --grad-accum)",
        type=positive_int,
        group=LARGE,
    )
    plan: bool = option(
        False,
        "print the per-GPU memory under DDP and FSDP and which GPU sizes fit, then exit (no weights, no data)",
        switch=True,
        group=LARGE,
    )
    world_size: int | None = option(
        None, "processes for --plan (default: WORLD_SIZE or 1)", type=positive_int, group=LARGE
    )

    def __post_init__(self):
        if self.max_steps is None and self.epochs is None:
            self.epochs = 1.0


@dataclass
class CheckpointRunConfig:
    """What ``probmoe-eval`` and ``probmoe-analyze`` share: the routing a checkpoint is run with
    (its own by default) and how it is loaded and written; their configs extend it."""

    method: str | None = _method(None, "default: the routing saved with the checkpoint", group=ROUTING)
    k: int | None = _k(group=ROUTING)
    kmin: int | None = _kmin(group=ROUTING)
    kmax: int | None = _kmax(group=ROUTING)
    backend: str = _backend(group=ROUTING)
    grad: str = _grad(group=ROUTING)
    device: str | None = _device(group=RUNNING)
    dtype: str = option("float32", "the weights' dtype (default float32)", choices=DTYPES, group=RUNNING)
    overwrite: bool = option(False, "replace results already in the output folder", switch=True, group=RUNNING)
    progress: bool = _progress(group=RUNNING)


@dataclass
class EvalConfig(CheckpointRunConfig):
    """Everything ``probmoe-eval`` is told."""

    checkpoint: str | None = option(None, "a checkpoint directory", required=True)
    data: str | None = option(
        None, "records with 'question' and 'answer' (GSM8K test set): .jsonl, .json or .parquet; or --tasks"
    )
    limit: int | None = option(None, "the first N problems (of each task) only", type=positive_int)
    max_new_tokens: int | None = option(None, "GSM8K: tokens generated per answer (default 256)", type=positive_int)
    batch_size: int = option(16, type=positive_int)
    max_length: int | None = option(None, "GSM8K: tokens per example for the loss (default 1024)", type=positive_int)
    output: str | None = option(
        None,
        "results folder (default: <checkpoint>/eval-<method>, eval-saved for the routing saved with the checkpoint)",
    )
    skip_generation: bool = option(False, "GSM8K: only the answer loss", switch=True)
    tasks: str | None = option(
        None, "comma-separated harness task or group names (mmlu, mbpp, ...); instead of --data", group=HARNESS
    )
    include_path: str | None = option(
        None, "a folder of your own task YAML (the harness's --include_path)", group=HARNESS
    )
    num_fewshot: int | None = option(
        None, "few-shot examples (default: each task's own)", type=nonnegative_int, group=HARNESS
    )
    allow_code_execution: bool = option(
        False,
        "run the generated code of tasks the harness marks unsafe (MBPP, "
        "HumanEval): its --confirm_run_unsafe_code and HF_ALLOW_CODE_EVAL=1",
        switch=True,
        group=HARNESS,
    )
    log_samples: bool = option(False, "also write every request and response, per task", switch=True, group=HARNESS)
    seed: int = option(0, "the harness's seeds: the few-shot examples' order", type=nonnegative_int, group=HARNESS)


@dataclass
class AnalyzeConfig(CheckpointRunConfig):
    """Everything ``probmoe-analyze`` is told."""

    checkpoint: list[str] | None = option(
        None,
        "a checkpoint directory, optionally named (repeat for side-by-side)",
        append=True,
        required=True,
        metavar="[NAME=]DIR",
    )
    data: list[str] | None = option(
        None,
        "records in any format of probmoe-train (.jsonl, .json, .parquet); the "
        "routing of the whole texts is analysed (repeat, optionally named, to compare "
        "data sets)",
        append=True,
        required=True,
        metavar="[NAME=]FILE",
    )
    data_format: str | None = _data_format()
    output: str | None = option(None, "folder for analysis.json, analysis.csv and the figures", required=True)
    limit: int = option(64, "the first N records (default 64)", type=positive_int)
    batch_size: int = option(16, type=positive_int)
    max_length: int = option(1024, type=positive_int)
    token_min_count: int = option(
        3, "tokens.csv ranks token ids seen at least this often (default 3)", type=positive_int
    )
