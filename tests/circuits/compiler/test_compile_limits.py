"""The size estimate (circuits.compiler.estimate), the size limit in compile_circuit and the commands, and
the progress bars of a long compile."""

from __future__ import annotations

import json
import sys
import time

import pytest

import circuits
from circuits.compiler import compile as compile_module
from circuits.compiler import estimate as est_module
from circuits.compiler.compile import compile_sdd
from circuits.compiler.estimate import CircuitTooLarge, estimate
from circuits.inspect.cli import compile_main, inspect_main
from circuits.layout import build_layout

HUGE = ["--n", "100000", "--k", "50000"]  # the example: ~2.5e9 live elements


def layout_sizes(spec) -> dict:
    """The real layout's sizes, compiled as compile_circuit does (no cache, no checks)."""
    mgr, root = compile_sdd(spec)
    return build_layout(mgr, root).sizes()


EXACT_GRID = [
    (n, k)
    for n in (1, 2, 3, 5, 7, 8, 13, 16, 31, 64, 100, 129)
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n})
    if 0 <= k <= n
] + [(512, 16), (256, 100)]


@pytest.mark.parametrize("n,k", EXACT_GRID)
def test_exactly_k_estimate_is_the_layout(n, k):
    got, want = estimate(circuits.ExactlyK(n, k)), layout_sizes(circuits.ExactlyK(n, k))
    assert got.exact
    assert (got.nodes, got.elements, got.levels) == (want["nodes"], want["elements"], want["levels"])
    assert got.built_elements >= got.elements - 1  # the built states include the reachable ones


def test_progress_counts_the_estimated_state_steps():
    """exactly_counts reports f^2 per state; the estimate's state_steps is exactly their sum."""
    for spec in (circuits.ExactlyK(100, 30), circuits.RangeK(77, 5, 20), circuits.ExactlyK(33, 33)):
        ticks: list[int] = []
        compile_sdd(spec, ticks.append)
        assert sum(ticks) == estimate(spec).state_steps, spec


BOUND_GRID = [
    circuits.RangeK(7, 1, 3),
    circuits.RangeK(16, 0, 8),
    circuits.RangeK(64, 4, 8),
    circuits.RangeK(64, 8, 56),
    circuits.RangeK(64, 0, 32),
    circuits.RangeK(64, 30, 34),
    circuits.RangeK(64, 1, 63),
    circuits.RangeK(64, 0, 64),
    circuits.RangeK(100, 10, 90),
    circuits.RangeK(128, 32, 96),
    circuits.RangeK(200, 199, 200),
    circuits.RangeK(300, 0, 20),
    circuits.GroupLimited(64, 8, 8, 4),
    circuits.GroupCapacity(64, 8, 8, 2),
    circuits.GroupLimited(64, 8, 8, 4, capacity=2),
    circuits.GroupLimited(256, 8, 8, 4),
    circuits.GroupLimited(64, 32, 8, 6),
    circuits.GroupLimited(64, None, [8, 8, 16, 32], 2, kmin=2, kmax=8),
    circuits.GroupCapacity(64, None, 16, 3, kmin=0, kmax=40),
    circuits.GroupLimited(60, 10, 60, 10),
    circuits.GroupLimited(64, 16, 64, 30),
    circuits.GroupCapacity(128, 64, 4, 20),
    circuits.GroupLimited(128, 20, [1, 127], 1),
    circuits.GroupLimited(96, None, 12, 11, kmin=1, kmax=60),
    circuits.GroupCapacity(90, None, [5, 40, 45], 30, kmin=10, kmax=65),
    circuits.GroupLimited(30, 5, [3, 7, 9, 11], 2),
]


@pytest.mark.parametrize("spec", BOUND_GRID, ids=lambda s: s.describe())
def test_other_estimates_bound_the_layout(spec):
    """RangeK and group specs: elements and levels are upper bounds, nodes at most 2x the estimate
    (far fewer for a band that is almost TRUE), and what the compiler reports in steps never passes
    the estimate."""
    got, want = estimate(spec), layout_sizes(spec)
    assert not got.exact
    assert want["elements"] <= got.elements and want["levels"] <= got.levels
    assert want["nodes"] <= 2 * got.nodes
    ticks: list[int] = []
    compile_sdd(spec, ticks.append)
    assert sum(ticks) <= got.state_steps


def test_estimate_is_cheap_and_files_have_none(tmp_path):
    spec = circuits.ExactlyK(100000, 50000)
    t0 = time.perf_counter()
    for _ in range(100):
        got = estimate(spec)
    assert (time.perf_counter() - t0) / 100 < 2e-3  # ~0.1 ms here
    assert got.elements == 2_501_668_928 and got.levels == 18
    cnf = tmp_path / "f.cnf"
    cnf.write_text("p cnf 2 1\n1 2 0\n")
    assert estimate(circuits.CnfFile(str(cnf))) is None
    with pytest.raises(TypeError, match="spec must be ExactlyK"):
        estimate((1, 2))


def test_library_refuses_before_any_pysdd_work(tmp_path, monkeypatch):
    def no_pysdd(*args, **kwargs):
        raise AssertionError("compile_sdd called for a refused spec")

    monkeypatch.setattr(compile_module, "compile_sdd", no_pysdd)
    t0 = time.perf_counter()
    with pytest.raises(CircuitTooLarge) as info:
        circuits.compile_circuit(circuits.ExactlyK(100000, 50000), cache_dir=tmp_path)
    assert time.perf_counter() - t0 < 0.5
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    for part in (
        "ExactlyK(n=100000, k=50000)",
        "2.5e9 live elements",
        f"the limit is {est_module._number(est_module.MAX_STEPS)} steps",
        "size_limit=False",
    ):
        assert part in message, message
    assert list(tmp_path.iterdir()) == []  # nothing cached
    with pytest.raises(ValueError, match="size_limit must be True or False"):
        circuits.compile_circuit(circuits.ExactlyK(4, 2), cache_dir=tmp_path, size_limit="no")


@pytest.mark.parametrize(
    "main,extra",
    [(compile_main, []), (compile_main, ["--json"]), (inspect_main, ["--format", "png", "--output", "OUT"])],
)
def test_commands_refuse_in_one_line_with_status_2(main, extra, tmp_path, capsys):
    extra = [str(tmp_path / "c.png") if a == "OUT" else a for a in extra]
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as info:
        main([*HUGE, "--cache-dir", str(tmp_path / "cache"), *extra])
    assert time.perf_counter() - t0 < 0.5
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        f"{'probmoe-compile' if main is compile_main else 'probmoe-inspect'}: error: ExactlyK(n=100000, k=50000)"
    )
    assert "2.5e9 live elements" in err and "the limit is" in err and "pass --force to compile it anyway" in err
    assert not (tmp_path / "c.png").exists()


@pytest.fixture
def limit_below_64_8(monkeypatch):
    """MAX_STEPS one step below what ExactlyK(64, 8) needs."""
    monkeypatch.setattr(est_module, "MAX_STEPS", estimate(circuits.ExactlyK(64, 8)).steps - 1)


def test_insisting_compiles_just_past_a_lowered_limit(tmp_path, limit_below_64_8):
    spec = circuits.ExactlyK(64, 8)
    with pytest.raises(CircuitTooLarge):
        circuits.compile_circuit(spec, cache_dir=tmp_path)
    c = circuits.compile_circuit(spec, cache_dir=tmp_path, size_limit=False)
    assert not c.info["cache_hit"] and c.sizes()["elements"] == 752
    # now cached: loading it is no compile, so the limit does not apply
    assert circuits.compile_circuit(spec, cache_dir=tmp_path).info["cache_hit"]
    c = circuits.compile_circuit(spec, cache_dir=tmp_path, force=True, size_limit=False)
    assert not c.info["cache_hit"]
    with pytest.raises(CircuitTooLarge):  # force alone recompiles, still within the limit
        circuits.compile_circuit(spec, cache_dir=tmp_path, force=True)


def test_commands_force_past_a_lowered_limit(tmp_path, capsys, limit_below_64_8):
    args = ["--n", "64", "--k", "8", "--cache-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as info:
        compile_main([*args, "--json"])
    assert info.value.code == 2
    capsys.readouterr()
    assert compile_main([*args, "--json", "--force"]) == 0
    assert json.loads(capsys.readouterr().out)["sizes"]["elements"] == 752
    assert inspect_main([*args, "--force", "--summary"]) == 0  # recompiles (force), past the limit
    assert "level" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        inspect_main(["--entry", str(tmp_path / "exactly-n64-k8"), "--force"])
    assert info.value.code == 2 and "--force compiles a circuit given by flags" in capsys.readouterr().err


def test_readme_command_is_silent_and_unchanged(tmp_path, capsys):
    """``probmoe-compile --n 64 --k 8``: compiles under the limit, no progress bar, one JSON object."""
    args = ["--n", "64", "--k", "8", "--cache-dir", str(tmp_path)]
    assert compile_main([*args, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["sizes"]["elements"] == 752
    assert compile_main(args) == 0
    out, err = capsys.readouterr()
    assert err == "" and "ExactlyK(n=64, k=8)" in out


@pytest.mark.parametrize(
    "spec", [circuits.ExactlyK(32, 4), circuits.GroupLimited(32, 4, 4, 2)], ids=lambda s: s.describe()
)
@pytest.mark.parametrize("compiler", ["direct", "pysdd"])
def test_progress_bars_for_a_long_compile_only(spec, compiler, tmp_path, capsys, monkeypatch):
    circuits.compile_circuit(spec, cache_dir=tmp_path / "a", compiler=compiler)
    assert capsys.readouterr().err == ""  # small: silent
    monkeypatch.setattr(est_module, "PROGRESS_STEPS", 0)  # every compile counts as long
    circuits.compile_circuit(spec, cache_dir=tmp_path / "b", compiler=compiler)
    err = capsys.readouterr().err
    assert f"compiling {spec.describe()}" in err
    assert ("layout" in err) == (compiler == "pysdd")  # the direct compiler builds the layout as it goes


def test_progress_keeps_json_on_stdout(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(est_module, "PROGRESS_STEPS", 0)
    assert compile_main(["--n", "32", "--k", "4", "--cache-dir", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["sizes"]["variables"] == 32 and "compiling ExactlyK(n=32, k=4)" in err


def test_no_progress_without_tqdm(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(est_module, "PROGRESS_STEPS", 0)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    c = circuits.compile_circuit(circuits.ExactlyK(32, 4), cache_dir=tmp_path)
    assert c.sizes()["variables"] == 32 and capsys.readouterr().err == ""
