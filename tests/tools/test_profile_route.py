"""tools/profile_route.py on the CPU (the device check's rehearsal of it): every routine's columns for
each backend asked, a JSON file the device check's report reads, and bad arguments refused in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tool_modules import load_tool

ROOT = Path(__file__).resolve().parents[2]
TOOL = str(ROOT / "tools" / "profile_route.py")


def test_both_algorithms_are_profiled_beside_the_baseline(tmp_path):
    out = tmp_path / "profile.json"
    argv = [TOOL, "--device", "cpu", "--tokens", "16", "--sizes", "8:2,8:1-3", "--backends", "dp,circuit"]
    done = subprocess.run(
        [sys.executable, *argv, "--repeats", "1", "--json", str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())
    assert [r["constraint"] for r in results] == ["exactly 2 of 8", "range 1..3 of 8"]
    for r in results:
        assert list(r["routines"]) == ["softmax + topk", "route dp", "route circuit"]
        for m in r["routines"].values():
            assert m["wall_one"] > 0 and m["wall_queued"] > 0 and m["host"] > 0
            assert m["kernels"] is None and m["graph"] is None  # no kernels nor graphs on the CPU
    assert "| range 1..3 of 8 | route circuit |" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sizes", "8:9"], "--sizes: '8:9' needs 1 <= k <= N"),
        (["--sizes", "eight:2"], "--sizes: 'eight:2' is not N:k"),
        (["--tokens", "0"], "--tokens must be at least 1, got 0"),
        (["--backends", "dp,dense"], "--backends: dense not one of dp, circuit"),
        (["--device", "mps"], "--device must be cpu or cuda, got 'mps'"),
    ],
)
def test_bad_arguments_are_one_line(args, message, monkeypatch, capsys):
    """In this process (argparse's exit 2 and its message; the tool's start is one test above)."""
    monkeypatch.setattr(sys, "argv", [TOOL, "--device", "cpu", *args])
    with pytest.raises(SystemExit) as stop:
        load_tool("profile_route").main()
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert stop.value.code == 2 and last.startswith(f"profile_route.py: error: {message}"), err
