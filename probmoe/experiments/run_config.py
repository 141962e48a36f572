"""Every option of ``probmoe-train``, ``probmoe-eval`` and ``probmoe-analyze``, with its default,
help, allowed values and check, in one place (as torchtitan's ``JobConfig``): ``TrainConfig``,
``EvalConfig``, ``AnalyzeConfig`` (the last two extend ``CheckpointRunConfig``). The commands'
flags are generated from these fields (``config_parser``), a ``--config`` file sets them by their
flag names, and ``Trainer`` runs on a ``TrainConfig``.

A field's ``metadata`` (``option``) says how it appears on the command line: ``help``, ``type``
(a ``probmoe._validate.Number`` check that names the allowed range, ``options.positive_int`` ...),
``choices``, ``flag`` (when not ``--`` + the field's name with ``-``), ``switch`` (a boolean flag;
``negate``: the flag turns the field off, ``--no-progress``), ``append`` (repeatable),
``required``, ``group`` (the help's section), ``exclusive`` (at most one of the fields sharing the
name), ``name`` (the option's name when not the field's: ``model.name`` is ``--model``), ``none`` (the flag's word for None: ``--balance none``), ``resume`` (``trajectory``: in the
resume fingerprint). ``TrainConfig`` nests one dataclass per concern (``section``): the model, the
data, the routing (``RoutingOptions``, declared once where it is used: ``patch_model``), the
optimisation and the run; a section's fields are flags and config-file keys of their own, flat as
before (``--kmin``, ``kmin: 1``), and its checks run when it is made. Every config checks its fields when made (``check_fields``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from probmoe._validate import one_of
from probmoe.integrations.routing_options import RoutingOptions

from .models import TINY
from .options import DEVICES, DTYPES, SEED, nonnegative_float, nonnegative_int, positive_float, positive_int
from .shapes import SHAPES

SCHEDULES = ("constant", "linear", "cosine")  # --lr-schedule
REPORT_TO = ("none", "tensorboard", "wandb")  # --report-to (tracking)
LARGE = 'large models (docs/experiments.md, "the paper\'s OLMoE run on 8 GPUs")'
HARNESS = "LM Evaluation Harness (pip install 'probmoe[eval]')"
ROUTING = "routing (default: the one saved with the checkpoint)"
RUNNING = "device, dtype and output"


def option(default=None, help: str | None = None, **cli):
    """A config field with its command-line description (see the module docstring)."""
    return field(default=default, metadata={"help": help, **cli})


def trajectory(default=None, help: str | None = None, **cli):
    """A config field that changes the training trajectory: in the resume fingerprint (``state``)."""
    return option(default, help, resume=True, **cli)


def section(cls, *, group: str | None = None, resume: bool = False, training: bool = True, **defaults):
    """A field holding a ``cls`` of options, whose fields are flags of their own (flat on the command
    line and in config files): ``group``, the help's section of them all; ``resume``, every one is in
    the resume fingerprint; ``training=False``: only those not marked ``training``; ``defaults``:
    this command's defaults where they differ from the fields'."""
    return field(
        default_factory=lambda: cls(**defaults),
        metadata={"section": cls, "group": group, "resume": resume, "training": training, "defaults": defaults},
    )


def check_fields(config) -> None:
    """Each field of ``config`` checked by its declared ``type`` or ``choices`` (ValueError naming it)."""
    for f in fields(config):
        value = getattr(config, f.name)
        if f.metadata.get("type") is not None:
            setattr(config, f.name, f.metadata["type"].check(f.name, value))
        elif f.metadata.get("choices") is not None and not f.metadata.get("append"):
            one_of(f.name, value, f.metadata["choices"])


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


def _data_format(**cli):
    from .formats import FORMATS

    return option(
        None,
        "the records' format (default: told by their fields; see docs/experiments.md, Data)",
        choices=tuple(FORMATS),
        **cli,
    )


@dataclass
class ModelOptions:
    """The model ``probmoe-train`` fine-tunes."""

    name: str | None = trajectory(
        None,
        f"{', '.join(TINY)} "
        "(randomly initialised, byte-level tokenizer); a published shape with random weights ("
        f"{', '.join(SHAPES)}; with --layers, --plan); or a local checkpoint directory of "
        "those families (OLMoE, Qwen2-MoE, Qwen3-MoE, Mixtral, FlexOlmo, DeepSeek-V3)",
        required=True,
        name="model",
    )
    layers: int | None = trajectory(
        None,
        "decoder layers of a built-in model (default: its own); e.g. olmoe-1b-7b-shape "
        "at its real widths and reduced depth",
        type=positive_int,
        group=LARGE,
    )
    param_dtype: str = trajectory(
        "float32",
        "dtype the parameters and AdamW state are stored in (a checkpoint loads straight into it)",
        choices=("float32", "bfloat16"),
        group=LARGE,
    )
    gradient_checkpointing: bool = option(
        False, "recompute each decoder layer's activations in the backward pass: less memory, more time", switch=True
    )

    def __post_init__(self):
        check_fields(self)


@dataclass
class DataOptions:
    """The records it trains on."""

    path: str | None = option(
        None,
        ".jsonl, .json or .parquet records: question/answer (GSM8K), prompt/completion, "
        "messages (chat template) or text",
        name="data",
    )
    data_format: str | None = _data_format(resume=True)  # None: told by the data's fields (formats.detect)
    max_length: int = trajectory(1024, "tokens per example, at most", type=positive_int)

    def __post_init__(self):
        check_fields(self)


@dataclass
class OptimOptions:
    """The optimisation: AdamW, its schedule, the batch and the length of the run."""

    max_steps: int | None = option(None, "optimizer steps in all", type=positive_int, exclusive="length")
    epochs: float | None = option(None, "passes over the data (default 1)", type=positive_float, exclusive="length")
    lr: float = trajectory(1e-3, "peak learning rate (AdamW)", type=positive_float)
    lr_schedule: str = trajectory("linear", "learning-rate schedule after the warm-up", choices=SCHEDULES)
    warmup_steps: int = trajectory(0, type=nonnegative_int)
    weight_decay: float = trajectory(0.0, type=nonnegative_float)
    max_grad_norm: float = trajectory(1.0, "0: no clipping", type=nonnegative_float)
    batch_size: int | None = trajectory(
        None, "examples per process per micro-batch (default 8, or --global-batch-size's share)", type=positive_int
    )
    grad_accum: int = trajectory(1, "micro-batches per optimizer step", type=positive_int)
    global_batch_size: int | None = option(
        None,
        "examples per optimizer step over all processes (sets --batch-size: must divide by processes x --grad-accum)",
        type=positive_int,
        group=LARGE,
    )

    def __post_init__(self):
        check_fields(self)
        if self.max_steps is None and self.epochs is None:
            self.epochs = 1.0
        if self.batch_size is None and self.global_batch_size is None:
            self.batch_size = 8


@dataclass
class RunOptions:
    """How the run executes: device, precision, sharding, seeds, output, checkpoints, logs."""

    output_dir: str | None = option(None, "checkpoints, the final model, config.yaml and train_log.jsonl")
    seed: int = trajectory(0, "seed of the initial weights, the data order and the routing's sampling", type=SEED)
    deterministic: str = option(
        "auto",
        "deterministic kernels, so that the same seeded run repeats bit for bit: "
        "auto (on for the CPU, where they cost nothing measurable; off on CUDA), on, off "
        "(experiments.determinism)",
        choices=("auto", "on", "off"),
    )
    bf16: bool = trajectory(False, "bf16 autocast", switch=True)
    fsdp: bool = trajectory(
        False,
        "shard every decoder layer over the processes with FSDP2 (under torchrun); with "
        "--bf16: bf16 compute, fp32 gradient reduction",
        switch=True,
        group=LARGE,
    )
    device: str | None = _device()
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
    progress: bool = _progress()
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
        check_fields(self)


@dataclass
class TrainConfig:
    """Everything ``probmoe-train`` is told, one section per concern; each section's fields are the
    flags of the same name (``--lr`` is ``optim.lr``; ``--model`` ``model.name``, ``--data``
    ``data.path``)."""

    model: ModelOptions = section(ModelOptions)
    data: DataOptions = section(DataOptions)
    routing: RoutingOptions = section(RoutingOptions, resume=True)  # patch_model's options
    optim: OptimOptions = section(OptimOptions)
    run: RunOptions = section(RunOptions)


@dataclass
class CheckpointRunConfig:
    """What ``probmoe-eval`` and ``probmoe-analyze`` share: the routing a checkpoint is run with
    (its own by default) and how it is loaded and written; their configs extend it."""

    routing: RoutingOptions = section(RoutingOptions, group=ROUTING, training=False, method=None)
    device: str | None = _device(group=RUNNING)
    dtype: str = option("float32", "the weights' dtype (default float32)", choices=DTYPES, group=RUNNING)
    overwrite: bool = option(False, "replace results already in the output folder", switch=True, group=RUNNING)
    progress: bool = _progress(group=RUNNING)

    def __post_init__(self):
        check_fields(self)


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
    seed: int = option(0, "the harness's seeds: the few-shot examples' order", type=SEED, group=HARNESS)


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
