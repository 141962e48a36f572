"""Python code run where no C compiler can be reached (the wheel tests: shipped kernels must load)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_without_compiler(tmp_path: Path, code: str, *args: str, env: dict, **extra: str) -> subprocess.CompletedProcess:
    """``python -c code args`` in ``tmp_path`` with PATH holding only python, CC a compiler that fails
    and probmoe's cache in ``tmp_path / "cache"``; ``env`` the base environment, ``extra`` more of it."""
    bin_dir = tmp_path / "bin"  # a PATH with python and no compiler
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python").exists():
        (bin_dir / "python").symlink_to(sys.executable)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**env, "PATH": str(bin_dir), "CC": "false", "PROBMOE_CACHE": str(tmp_path / "cache"), **extra},
    )
