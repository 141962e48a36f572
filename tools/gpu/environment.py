"""What the device check ran on: the GPU as ``nvidia-smi`` names it, the driver, the versions of
Python, torch, CUDA, triton and transformers, the CPU, and whether the environment meets what
probmoe declares (pyproject.toml's dependencies and the extras the check uses)."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
EXTRAS = ("test", "transformers", "triton")  # what the check's parts import


def nvidia_smi() -> dict:
    """Name, driver and memory of each GPU, as nvidia-smi reports them ({} without it)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}
    gpus = [
        dict(zip(("name", "driver", "memory"), (x.strip() for x in line.split(","))))
        for line in out.splitlines()
        if line.strip()
    ]
    return {"gpus": gpus}


def cpu() -> dict:
    """The CPU's model name and its vector extensions (from /proc/cpuinfo where there is one)."""
    name, flags = platform.processor(), []
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = [f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "sse4", "fma", "amx"))]
                break
    except OSError:
        pass
    return dict(name=name, cores=os.cpu_count(), vector_extensions=sorted(set(flags)))


def version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def carried() -> list[str]:
    """The names of the packages tools/gpu/wheels.txt carries."""
    lines = (ROOT / "tools" / "gpu" / "wheels.txt").read_text(encoding="utf-8").splitlines()
    return [line.split("#")[0].split("==")[0].strip() for line in lines if line.split("#")[0].strip()]


def unmet_requirements() -> list[str]:
    """probmoe's declared requirements (core and EXTRAS), and those of the carried packages, that
    this environment does not meet (the wheels are installed without their dependencies)."""
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [("probmoe", text) for text in project["dependencies"]]
    for extra in EXTRAS:
        wanted += [("probmoe", text) for text in project["optional-dependencies"].get(extra, [])]
    for name in carried():
        try:
            wanted += [(name, text) for text in metadata.requires(name) or []]
        except metadata.PackageNotFoundError:
            wanted.append(("tools/gpu/wheels.txt", name))
    unmet = []
    for owner, text in wanted:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra's, or another platform's
        have = version(req.name)
        if have is None:
            unmet.append(f"{req} ({owner}): not installed")
        elif req.specifier and not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req} ({owner}): {have} installed")
    return unmet


def describe(install_log: Path | None = None) -> dict:
    """Everything a reader of the check's report needs to place its numbers."""
    import torch

    about = dict(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        triton=version("triton"),
        transformers=version("transformers"),
        pysdd=version("pysdd"),
        nvidia_smi=nvidia_smi(),
        cpu=cpu(),
        unmet_requirements=unmet_requirements(),
    )
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        about["device"] = dict(
            name=props.name,
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
        )
    if install_log is not None and install_log.is_file():
        about["install"] = install_log.read_text(encoding="utf-8", errors="replace")[-2000:]
    return about
