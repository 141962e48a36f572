"""Triton's checks in a child process: TRITON_INTERPRET=1 must be set before triton defines any kernel,
so a test that wants the interpreter (no CUDA) runs its checks file in a child that has it from the
start, and this process never does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def checks_device(runner: str) -> str:
    """The device a checks file runs the kernels on, called at its top: "cuda", or "cpu" under
    TRITON_INTERPRET=1. Skips the whole module without triton, and on the CPU without the
    interpreter (``runner``: the test that runs the file in a child with it set)."""
    pytest.importorskip("triton", reason="triton is not installed (the optional extra: pip install -e '.[triton]')")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip(f"without CUDA these checks need TRITON_INTERPRET=1 ({runner} sets it)", allow_module_level=True)
    return device


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
