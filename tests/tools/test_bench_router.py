"""tools/bench_router.py: its size syntax (DeepSeek-V3's group-limited gate among them) and one tiny
run on the CPU with a row per routine for each constraint."""

import sys

import pytest
import torch
from tool_modules import load_tool

import circuits

bench = load_tool("bench_router")


def test_the_sizes_it_reads():
    assert bench.parse_size("64:8") == ("exactly 8 of 64", 64, dict(k=8))
    assert bench.parse_size("64:4-8") == ("range 4..8 of 64", 64, dict(kmin=4, kmax=8))
    label, n, size = bench.parse_size("256:8/8g4")
    assert (label, n) == ("8 of 256 in <= 4 of 8 groups", 256)
    assert size == dict(constraint=circuits.GroupLimited(256, 8, 8, 4))


def test_a_tiny_run_times_every_routine():
    rows = bench.bench_device(torch.device("cpu"), ["16:2", "16:2/4g2"], T=8, repeats=1)
    seen = [(row["constraint"], row["routine"]) for row in rows]
    for label in ("exactly 2 of 16", "2 of 16 in <= 2 of 4 groups"):
        assert [routine for constraint, routine in seen if constraint == label] == [
            "softmax + topk",
            "route dp",
            "route circuit",
        ]
    assert all(row["seconds"] > 0 and row["ratio"] > 0 for row in rows)


@pytest.mark.parametrize(
    "text, why",
    [
        ("256:8/8x4", "invalid literal for int() with base 10: '8x4'"),
        ("16:9/4g2", "k must be in [0, 8], got 9"),
        ("eight:2", "invalid literal for int() with base 10: 'eight'"),
    ],
)
def test_a_bad_size_is_one_line_and_status_2(text, why, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_router.py", "--sizes", text])
    with pytest.raises(SystemExit) as stop:
        bench.main()
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"bench_router.py: error: --sizes: {text!r} is not N:k, N:a-b or N:k/GgM (")
    assert why in last
