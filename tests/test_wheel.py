"""The wheel: ``python -m build --wheel`` compiles the kernels' C library for every instruction set
the runtime dispatch knows (setup.py, ``NativeLibrary.ship``) into a platform wheel, and the
installed package loads the library for this CPU's ISA with no compiler on the PATH; its metadata
names the license by an SPDX expression and carries the license file.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from no_compiler import run_without_compiler

from circuits.kernels import build as native

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FILES = ["pyproject.toml", "setup.py", "README.md", "LICENSE", "circuits", "probmoe", "probmoe_commands"]


def test_the_license_is_an_spdx_expression_with_its_file():
    """Not the ``project.license`` table setuptools stops accepting in February 2027."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "MIT"
    assert [(ROOT / f).is_file() for f in project["license-files"]] == [True]


LOAD = """
import shutil, sys, warnings
warnings.simplefilter("error", RuntimeWarning)
assert shutil.which("cc") is None and shutil.which("gcc") is None, "a compiler is on the PATH"
import torch, circuits
from circuits.kernels import build, library
from circuits.kernels.c_passes import CPasses
from circuits.kernels.torch_passes import TorchPasses
assert circuits.__file__.startswith(sys.argv[1]), circuits.__file__
isa = sys.argv[2]
assert library.LIBRARY.isa() == isa, library.describe()
assert library.describe() == f"{sys.argv[1]}/circuits/kernels/prebuilt/{isa}/libkernels.so", library.describe()
c = circuits.compile_circuit(circuits.RangeK(12, 2, 5))
r = torch.randn(300, 12, generator=torch.Generator().manual_seed(0))
got = CPasses(c.program).log_partition(r, True)
want = TorchPasses(c.program).log_partition(r, True)
torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
"""


@pytest.mark.slow  # a wheel build compiles the library three times: a minute or two
@pytest.mark.skipif(importlib.util.find_spec("build") is None, reason="needs build (the test extra)")
@pytest.mark.skipif(not native.shipped_isas() or shutil.which("cc") is None, reason="needs Linux, a known CPU and cc")
def test_the_wheel_ships_the_compiled_kernels_and_loads_them_without_a_compiler(tmp_path):
    src = tmp_path / "src"  # a copy: a build in the tree would leave build/ there, and stale files in it
    src.mkdir()
    for name in PACKAGE_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PROBMOE_NATIVE", "PROBMOE_NATIVE_ISA")}
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    log = built.stdout + built.stderr
    assert built.returncode == 0, log[-4000:]
    warned = [line for line in log.lower().splitlines() if "license" in line and ("deprecat" in line or "warn" in line)]
    assert not warned, warned
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith("probmoe-0.1.0-py3-none-linux_"), wheel.name  # a platform wheel, any Python 3
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read("probmoe-0.1.0.dist-info/METADATA").decode()
        scripts = z.read("probmoe-0.1.0.dist-info/entry_points.txt").decode()
        z.extractall(tmp_path / "site")
    assert "License-Expression: MIT" in metadata and "probmoe-0.1.0.dist-info/licenses/LICENSE" in names
    # the console scripts start in probmoe_commands (Ctrl-C while torch loads), which the wheel holds
    assert "probmoe_commands/__init__.py" in names and "probmoe-train = probmoe_commands:train_main" in scripts
    prebuilt = [n for n in names if "/prebuilt/" in n]
    assert sorted(prebuilt) == sorted(
        f"circuits/kernels/prebuilt/{isa}/libkernels.{ext}"
        for isa in native.shipped_isas()
        for ext in ("so", "so.sha256", "json")
    )
    site = tmp_path / "site"
    for isa in filter(native.runs_prebuilt, native.runnable_isas()):
        run = run_without_compiler(
            tmp_path, LOAD, str(site), isa, env=env, PYTHONPATH=str(site), PROBMOE_NATIVE_ISA=isa
        )
        assert run.returncode == 0, f"{isa}: {run.stdout[-2000:]}{run.stderr[-3000:]}"
    assert not (tmp_path / "cache" / "native").exists()  # nothing was built on first use
