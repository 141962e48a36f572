"""Triton's checks in a child process: TRITON_INTERPRET=1 must be set before triton defines any kernel,
so a test that wants the interpreter (no CUDA) runs its checks file in a child that has it from the
start, and this process never does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def child_env(interpret: bool) -> dict:
    """This process's environment, TRITON_INTERPRET=1 set where ``interpret`` and removed otherwise."""
    env = {k: x for k, x in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, "TRITON_INTERPRET": "1"} if interpret else env


def run_checks(*pytest_args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m pytest -q -p no:cacheprovider -rfEs ARGS`` in the repository root: compiled on CUDA,
    interpreted on the CPU without it."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", *pytest_args]
    env = child_env(not torch.cuda.is_available())
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def run_compiled(code: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -c CODE`` in the repository root without the interpreter (a compile for a GPU
    architecture needs no device)."""
    argv = [sys.executable, "-c", code]
    return subprocess.run(argv, cwd=ROOT, env=child_env(False), capture_output=True, text=True, timeout=timeout)
