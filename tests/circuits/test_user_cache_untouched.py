"""A test run never writes into the user's cache: collecting every test module and running tests
that compile circuits, build the C passes and run the commands leave it as it was."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

INNER = "PROBMOE_TEST_INNER_RUN"
HERE = Path(__file__).parent
TESTS = HERE.parent  # every test module


def snapshot(root: Path) -> dict:
    """Every path below root with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.slow  # a nested pytest that collects every module: 15-35 s
@pytest.mark.skipif(os.environ.get(INNER) == "1", reason="this test runs the others")
def test_collecting_and_running_leaves_the_user_cache_alone(tmp_path):
    user_cache, xdg = tmp_path / "probmoe-cache", tmp_path / "xdg"
    for d in (user_cache, xdg):
        d.mkdir()
        (d / "keep.txt").write_text("the user's own file\n")
    before = snapshot(user_cache), snapshot(xdg)
    for d in (user_cache, xdg):  # read-only (root may write anyway: the snapshot decides)
        d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    env = {**os.environ, "PROBMOE_CACHE": str(user_cache), "XDG_CACHE_HOME": str(xdg), INNER: "1"}
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error::RuntimeWarning"]
    try:
        collect = subprocess.run(
            [*base, "--collect-only", str(TESTS)], env=env, capture_output=True, text=True, timeout=300
        )
        assert collect.returncode == 0, collect.stdout[-2000:] + collect.stderr[-2000:]
        run = subprocess.run(
            [
                *base,
                str(HERE / "kernels" / "test_c_passes.py"),
                str(HERE / "test_cli.py"),
                "-k",
                "built_wherever or kth_largest or brute_force_fp32 or compile_json_range or second_run",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert " passed" in run.stdout and " failed" not in run.stdout
    finally:
        for d in (user_cache, xdg):
            d.chmod(stat.S_IRWXU)
    assert (snapshot(user_cache), snapshot(xdg)) == before
