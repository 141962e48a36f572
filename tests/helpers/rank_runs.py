"""Run a script as N ranks under torchrun (or as one plain process), for the multi-process tests
(shared by the DDP and FSDP tests)."""

import os
import shutil
import subprocess
import sys


def torchrun() -> list[str]:
    exe = shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def run_ranks(
    where, nproc: int, script: str, argv: list[str], *, torchrun_it: bool = True, timeout: int = 600
) -> subprocess.CompletedProcess:
    """Write ``script`` into ``where`` and run it with arguments (``where``, *argv): ``nproc`` ranks
    under ``torchrun --standalone``, or one plain process when ``torchrun_it`` is False; one OpenMP
    thread each. Asserts it succeeded (the end of its stderr otherwise); the finished process."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / "rank.py"
    path.write_text(script)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = (
        [*torchrun(), "--standalone", "--nproc_per_node", str(nproc), str(path), str(where), *argv]
        if torchrun_it
        else [sys.executable, str(path), str(where), *argv]
    )
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done
