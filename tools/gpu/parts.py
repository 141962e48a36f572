"""The parts of the device check, as commands: what runs on CUDA, and the same at tiny sizes on
the CPU for the rehearsal (``--rehearse``).

Each ``Part`` is a name, a share of the budget, the least time it needs to be worth starting, and
``steps``: (label, argv, extra environment) run in order in the repository root, each writing its
results where ``files`` says. ``plan(device, work)`` lists them; ``check.py`` runs them.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

PY = sys.executable
# importable here, absent on the device image and not carried by tools/gpu/wheels.txt: hidden
# from the rehearsal's processes, so that it fails where the device would
IMAGE_LACKS = ("pyganak", "trl", "lm_eval", "wandb", "vllm", "torchtitan")
STEP_METHODS = ["conventional", "ProbMoE (dp)", "ProbMoE (circuit)", "ProbMoE Dynamic-k (circuit)", "DenseMixer"]
# the rehearsal's device tests: one or two of each kind (brute force, DP, draws, Jacobians,
# compiled equals eager, host synchronisation), a minute on two cores
REHEARSAL_TESTS = (
    "n12_matches or (test_the_two_algorithms_agree and float32) or test_chi_squared "
    "or (test_jacobian_of_mean and dp and exact) or (test_compiled_route_equals_eager and exactly) "
    "or host_synchronisation"
)
REHEARSAL_TRITON = "(test_brute_force and ExactlyK and 3) or test_no_host_synchronisation"
REHEARSAL_LATTICE = "test_against_brute_force or test_no_host_synchronisation"
# on the device (each plan compiles once, 5 to 40 s: the whole file would take most of the budget), in
# two steps so that the routing sizes run first: the kernels of 8 of 64 and the 16 of 256 grid against
# the torch DP; then brute force and the host synchronisations (the first run on an H200 spent its
# share compiling the brute force's small plans and ran one test)
DEVICE_LATTICE = ("8..8-of-64 or 16..16-of-256", "test_against_brute_force or test_no_host_synchronisation")
# the group DP's kernels (each plan compiles in 5 to 20 s): the torch sweeps (values, draws, Cov(z) v)
# and the MAP at 8 of 64 in 4 of 8 groups, the accuracy grid at 64 and 256 experts, host syncs
DEVICE_GROUPS = (
    "((test_against_the_torch_sweeps or test_the_map_equals) and 64) or test_accuracy_grid "
    "or test_no_host_synchronisation"
)
REHEARSAL_GROUPS = "test_the_map_equals or test_no_host_synchronisation"


@dataclass
class Part:
    name: str
    share: float  # of the whole budget
    least_s: float  # skipped (not failed) when less than this is left
    steps: list = field(default_factory=list)  # (label, argv, env)
    files: dict = field(default_factory=dict)  # what -> path of a result file
    skip: str = ""  # a reason to skip before starting


def plan(cuda: bool, work: Path, olmoe_layers: int = 1) -> list[Part]:
    """The parts, on CUDA (``cuda``) or rehearsed on the CPU; ``work`` holds their files."""
    # --record-to=FILE as one word: as two, pytest's first look at the command line (before the
    # plugin adds the option) takes FILE for a test path and roots the run in its folder
    record = ["-p", "gpu_record", "-p", "no:cacheprovider", "-q", "-rfEs", f"--record-to={work / 'tests.jsonl'}"]
    # the Triton checks first (nothing else tests the kernels compiled), then the device tests,
    # the slow ones (inductor compiling a model) last, each step in what the part has left
    tests = Part("tests", 0.42, 30, files={"tests": work / "tests.jsonl"})
    if cuda:
        tests.steps = [
            (
                "Triton checks, compiled",
                [
                    PY,
                    "-m",
                    "pytest",
                    "tests/circuits/kernels/circuits_triton_checks.py",
                    *record,
                    "--record-suite=triton",
                ],
                {},
            ),
            *(
                (
                    f"Triton lattice checks, compiled ({which})",
                    [
                        PY,
                        "-m",
                        "pytest",
                        "tests/circuits/kernels/triton_dp_checks.py",
                        "-m",
                        "slow or not slow",
                        "-k",
                        selection,
                        *record,
                        "--record-suite=triton lattice",
                    ],
                    {},
                )
                for which, selection in zip(("the routing sizes", "brute force, host syncs"), DEVICE_LATTICE)
            ),
            (
                "Triton group checks, compiled (8 of 64 and 256 in groups, host syncs)",
                [
                    PY,
                    "-m",
                    "pytest",
                    "tests/circuits/kernels/triton_group_checks.py",
                    "-m",
                    "slow or not slow",
                    "-k",
                    DEVICE_GROUPS,
                    *record,
                    "--record-suite=triton groups",
                ],
                {},
            ),
            (
                "Triton layers' tests, compiled",
                [
                    PY,
                    "-m",
                    "pytest",
                    "tests/circuits/kernels/test_triton_layers.py",
                    *record,
                    "--record-suite=triton layers",
                ],
                {},
            ),
            (
                "device tests on cuda",
                [
                    PY,
                    "-m",
                    "pytest",
                    "tests",
                    "-m",
                    "device and not slow",
                    "--device",
                    "cuda",
                    *record,
                    "--record-suite=device",
                ],
                {},
            ),
            (
                "slow device tests on cuda",
                [
                    PY,
                    "-m",
                    "pytest",
                    "tests",
                    "-m",
                    "device and slow",
                    "--device",
                    "cuda",
                    *record,
                    "--record-suite=device (slow)",
                ],
                {},
            ),
        ]
    else:
        tests.steps = [
            (
                "Triton checks, interpreted (a selection)",
                [
                    PY,
                    "-m",
                    "pytest",
                    "tests/circuits/kernels/circuits_triton_checks.py",
                    "-k",
                    REHEARSAL_TRITON,
                    *record,
                    "--record-suite=triton",
                ],
                {"TRITON_INTERPRET": "1"},
            ),
            (
                "Triton lattice checks, interpreted (a selection)",
                [
                    PY,
                    "-m",
                    "pytest",
                    "tests/circuits/kernels/triton_dp_checks.py",
                    "-k",
                    REHEARSAL_LATTICE,
                    *record,
                    "--record-suite=triton lattice",
                ],
                {"TRITON_INTERPRET": "1"},
            ),
            (
                "Triton group checks, interpreted (a selection)",
                [
                    PY,
                    "-m",
                    "pytest",
                    "tests/circuits/kernels/triton_group_checks.py",
                    "-k",
                    REHEARSAL_GROUPS,
                    *record,
                    "--record-suite=triton groups",
                ],
                {"TRITON_INTERPRET": "1"},
            ),
            (
                "device tests on cpu (a selection)",
                [
                    PY,
                    "-m",
                    "pytest",
                    "tests",
                    "-m",
                    "device and not slow",
                    "--device",
                    "cpu",
                    "-k",
                    REHEARSAL_TESTS,
                    *record,
                    "--record-suite=device",
                ],
                {},
            ),
        ]

    router = Part(
        "bench_router",
        0.20,
        30,
        files={
            "bench_router": work / "bench_router.json",
            "bench_router_grouped": work / "bench_router_grouped.json",
            "profile_route": work / "profile_route.json",
        },
    )
    profile = (
        "where a route's time goes: host, kernels, CUDA graph",
        [PY, "tools/profile_route.py", "--json", str(work / "profile_route.json")]
        + (
            ["--device", "cuda", "--sizes", "64:8,128:8,256:16", "--backends", "dp,circuit", "--repeats", "10"]
            if cuda
            else ["--device", "cpu", "--tokens", "64", "--sizes", "8:2", "--backends", "dp,circuit", "--repeats", "2"]
        ),
        {},
    )
    on = "cuda" if cuda else "cpu"

    def route_run(label: str, sizes: str, repeats: str, out: Path, *more: str) -> tuple:
        """A bench_router process on this check's device: ``sizes`` in fp32 and bf16, its rows to ``out``."""
        argv = [PY, "tools/bench_router.py", "--devices", on, "--tokens", "65536" if cuda else "64", "--sizes", sizes]
        return (label, [*argv, "--repeats", repeats, "--dtypes", "fp32,bf16", "--json", str(out), *more], {})

    router.steps = [
        route_run(
            "routing at T = 65,536" if cuda else "routing at T = 64",
            "64:8,64:4-8,128:8,256:16" if cuda else "8:2,8:1-3,16:4",
            "10" if cuda else "1",
            work / "bench_router.json",
            "--passes",
            "torch,triton" if cuda else "torch,c",
        ),
        profile,
        # a step of its own: the group DP's kernels compile on first use (about 40 s for a route's
        # forward, backward and MAP at 256 experts on one core), and a slow step must not cost the others
        route_run(
            "DeepSeek-V3's gate, 8 of 256 from 4 of 8 groups: circuit and group DP"
            if cuda
            else "a group-limited gate, 2 of 16 from 2 of 4 groups",
            "256:8/8g4" if cuda else "16:2/4g2",
            "5" if cuda else "1",
            work / "bench_router_grouped.json",
        ),
    ]
    if cuda:
        router.steps.append(
            (
                "the circuit path: Triton passes over softmax + top-k, and PyJuice where it imports",
                [PY, "tools/bench_circuits_gpu.py", "--repeats", "5", "--json", str(work / "circuits_gpu.json")],
                {},
            )
        )

    step = Part(
        "bench_step",
        0.21,
        45,
        files={"bench_step": work / "bench_step.json", "bench_step_grouped": work / "bench_step_grouped.json"},
    )
    shape = (
        [
            "--hidden",
            "2048",
            "--experts",
            "64",
            "--top-k",
            "8",
            "--heads",
            "16",
            "--vocab",
            "50304",
            "--layers",
            str(olmoe_layers),
            "--tokens",
            "16384",
            "--seq",
            "2048",
            "--repeats",
            "8",
        ]
        if cuda
        else [
            "--hidden",
            "64",
            "--experts",
            "8",
            "--top-k",
            "2",
            "--heads",
            "2",
            "--vocab",
            "512",
            "--layers",
            "1",
            "--tokens",
            "128",
            "--seq",
            "64",
            "--repeats",
            "1",
            "--no-memory",
        ]
    )

    def step_run(label: str, shape_args: list[str], method: str, out: str, *more: str) -> tuple:
        """A bench_step process: ``method`` beside conventional, bf16, its rows written to ``out``."""
        argv = [PY, "tools/bench_step.py", "--devices", on, *shape_args, "--dtype", "bfloat16"]
        return (label, [*argv, "--methods", "conventional", method, "--json", out, *more], {})

    # one method per process, beside its own conventional baseline (five models in one process ran
    # out of memory at two OLMoE-wide layers on an H100); the rows gather in one file
    step.steps = [
        step_run(
            f"training step, {method}" + (", OLMoE-1B-7B widths" if cuda else ", tiny"),
            shape,
            method,
            str(work / "bench_step.json"),
            "--append",
        )
        for method in STEP_METHODS
        if method != "conventional"
    ]
    # the 256-expert grouped step (DeepSeek-V3's gate, 8 from 4 of 8 groups): experts a quarter as
    # wide, so that its expert weights are OLMoE's and as many layers fit
    grouped = ["--family", "deepseek_v3", "--experts", "256" if cuda else "16", "--top-k", "8" if cuda else "2"]
    grouped += ["--groups", "8" if cuda else "4", "--topk-group", "4" if cuda else "2"]
    grouped += ["--expert-width", "256" if cuda else "16"]
    drop = {"--experts", "--top-k"}  # the OLMoE shape's values of these give way to the grouped ones
    kept = [a for i, a in enumerate(shape) if a not in drop and (i == 0 or shape[i - 1] not in drop)]
    # the group DP's kernels first (the route made for it), then the circuit's passes
    step.steps += [
        step_run(
            f"training step, {method}, " + ("256 experts in 8 groups, hidden 2048" if cuda else "tiny"),
            kept + grouped,
            method,
            str(work / "bench_step_grouped.json"),
            "--append",
        )
        for method in ("ProbMoE grouped (dp)", "ProbMoE grouped (circuit)")
    ]

    commands = Part(
        "commands",
        0.17,
        40,
        files={"eval": work / "eval" / "summary.json", "analysis": work / "analysis" / "analysis.json"},
    )
    data = write_problems(work / "problems.jsonl")
    device = ["--device", "cuda" if cuda else "cpu"]
    quiet = ["--no-progress"]
    commands.steps = [
        (
            "probmoe-train",
            [
                *command("train"),
                "--model",
                "tiny-olmoe",
                "--data",
                data,
                "--output-dir",
                str(work / "run"),
                "--method",
                "probmoe",
                "--max-steps",
                "8" if cuda else "2",
                "--batch-size",
                "4",
                "--bf16",
                *device,
                *quiet,
            ],
            {},
        ),
        (
            "probmoe-eval",
            [
                *command("eval"),
                "--checkpoint",
                str(work / "run"),
                "--data",
                data,
                "--limit",
                "4",
                "--max-new-tokens",
                "16" if cuda else "4",
                "--output",
                str(work / "eval"),
                "--dtype",
                "bfloat16",
                *device,
                *quiet,
            ],
            {},
        ),
        (
            "probmoe-analyze",
            [
                *command("analyze"),
                "--checkpoint",
                str(work / "run"),
                "--data",
                data,
                "--limit",
                "8",
                "--output",
                str(work / "analysis"),
                "--dtype",
                "bfloat16",
                *device,
                *quiet,
            ],
            {},
        ),
    ]
    return [tests, router, step, commands]


def command(name: str) -> list[str]:
    """probmoe-train / -eval / -analyze as a module run (the device image has the repository on
    PYTHONPATH, not an installed package with its scripts)."""
    module = {"train": "train", "eval": "evaluate", "analyze": "analyze"}[name]
    return [PY, "-m", f"probmoe.cli.{module}"]


def write_problems(path: Path, count: int = 24) -> str:
    """Question/answer records with GSM8K's '#### <number>' answers (the device has no data sets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(count):
            a, b = rng.randint(2, 60), rng.randint(2, 60)
            f.write(
                json.dumps(
                    {
                        "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
                        "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}",
                    }
                )
                + "\n"
            )
    return str(path)


def olmoe_layers(free_bytes: int, copies: int = 2) -> int:
    """How many OLMoE-1B-7B-wide decoder layers fit ``copies`` bf16 models with AdamW on a device
    with ``free_bytes`` free (bench_step runs two at once: conventional and one method): per layer
    and copy about 420M parameters at 8 bytes (bf16 weights, gradients and two AdamW moments), the
    embeddings and head (206M parameters) once per copy, and about 12 GiB of activations per layer
    and 12 GiB for the logits and loss of 16,384 tokens (the first H100 run: five copies held
    75 GiB at two layers and ran out of memory, which these figures predict)."""
    per_layer = copies * 420e6 * 8 + 12 * 2**30
    fixed = copies * 206e6 * 8 + 12 * 2**30
    return max(1, min(16, int((0.85 * free_bytes - fixed) // per_layer)))
