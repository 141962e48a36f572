"""Ctrl-C while a command starts (issue 48, point 7): from the console script's first import (the
entry in probmoe_commands, before ``import probmoe`` loads torch) and from the first line of each
command's main (before the command line is read, while transformers and datasets load) a SIGINT
is one line and status 130 (SIGTERM 143), as it is later, never a KeyboardInterrupt traceback."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from probmoe.cli import analyze, common, evaluate, launch, train
from probmoe.experiments import interrupts

ROOT = Path(__file__).resolve().parents[2]


def signal_on_call(monkeypatch, owner, name, signum=signal.SIGINT):
    """``owner.name`` sends this process ``signum`` when called, before doing its work."""
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        signal.raise_signal(signum)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


@pytest.mark.parametrize("owner, name", [(train, "parser"), (common, "quiet_progress")], ids=["first", "loading"])
def test_probmoe_train_interrupted_while_starting(monkeypatch, capsys, tmp_path, owner, name):
    signal_on_call(monkeypatch, owner, name)
    argv = ["--model", "tiny-olmoe", "--data", "x.jsonl", "--output-dir", str(tmp_path / "run"), "--no-progress"]
    assert train.main(argv) == 130
    err = capsys.readouterr().err
    assert err == "interrupted (SIGINT); no checkpoint was written: run the command again to start over\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are given back


@pytest.mark.parametrize("command", [evaluate, analyze], ids=["eval", "analyze"])
@pytest.mark.parametrize("name", ["parser", "quiet_progress"], ids=["first", "loading"])
def test_eval_and_analyze_interrupted_while_starting(monkeypatch, capsys, tmp_path, command, name):
    signal_on_call(monkeypatch, command if name == "parser" else common, name)
    argv = ["--checkpoint", "c", "--data", "d.jsonl", "--output", str(tmp_path / "out"), "--no-progress"]
    assert command.main(argv) == 130
    assert capsys.readouterr().err == "interrupted (SIGINT) while starting; nothing was written\n"


def test_probmoe_launch_interrupted_while_torch_distributed_loads(monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt  # Python's own SIGINT handler: torchrun has not put its own in place yet

    monkeypatch.setattr(launch, "check_nproc", interrupted)
    assert launch.main(["--nproc_per_node", "2", "-m", "probmoe.cli.train"]) == 130
    assert capsys.readouterr().err == "interrupted (SIGINT) before torchrun started the ranks\n"


def scripts() -> dict[str, str]:
    """pyproject.toml's ``[project.scripts]``: command -> ``module:function``."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]


def console_script(command: str) -> str:
    """The code of the console script pip writes for ``command`` (its import and its call)."""
    module, function = scripts()[command].split(":")
    return f"import sys\nfrom {module} import {function}\nsys.exit({function}())\n"


def caught(pid: int) -> int:
    """The signals process ``pid`` has handlers for (``SigCgt`` of /proc/<pid>/status, a bit mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)


def interrupted_at_start(command: str, args: list[str], delay: float, signum=signal.SIGINT):
    """Run ``command``'s console script; once its own handlers are in place (SIGTERM caught, which
    Python alone does not do: the interpreter's own start, before the script's first line, took
    0.2 s on a busy 2-core machine) and ``delay`` seconds after it started, send it ``signum``; its
    exit status and stderr."""
    argv = [sys.executable, "-c", console_script(command), *args]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while True:  # the same program after exec (the forked child still runs pytest's), SIGTERM caught
            assert proc.poll() is None, f"{command} ended before it was signalled: {proc.communicate()}"
            try:
                ours = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-c", argv[2].encode()]
                if ours and caught(proc.pid) & (1 << (signal.SIGTERM - 1)):
                    break
            except (OSError, StopIteration):
                pass
            assert time.monotonic() - started < 60, f"{command} did not put its handlers in place"
            time.sleep(0.002)
        time.sleep(max(0.0, started + delay - time.monotonic()))
        assert proc.poll() is None, f"{command} ended before it was signalled: {proc.communicate()}"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the handlers from /proc")
@pytest.mark.parametrize("delay", [0.0, 0.2, 0.5])
def test_a_console_script_interrupted_in_its_first_moment(delay):
    """What ``probmoe-train`` runs (the console script's lines), SIGINT in its first moments (while
    it imports torch): the line it prints when interrupted later while starting, and 130."""
    status, err = interrupted_at_start("probmoe-train", ["--model", "tiny-olmoe", "--plan"], delay)
    expected = interrupts.message(interrupts.Interrupted(signal.SIGINT), None) + "\n"
    assert (status, err) == (130, expected)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the handlers from /proc")
@pytest.mark.parametrize(
    "command, args, line",
    [
        pytest.param(command, args, line, id=command)
        for command, args, line in [
            ("probmoe-eval", ["--help"], "interrupted (SIGTERM) while starting; nothing was written"),
            ("probmoe-analyze", ["--help"], "interrupted (SIGTERM) while starting; nothing was written"),
            ("probmoe-launch", ["--help"], "interrupted (SIGTERM) before torchrun started the ranks"),
            (
                "probmoe-compile",
                ["--n", "64", "--k", "8"],
                "probmoe-compile: interrupted (SIGTERM) while starting; nothing was cached",
            ),
            (
                "probmoe-inspect",
                ["--n", "64", "--k", "8"],
                "probmoe-inspect: interrupted (SIGTERM) while starting; nothing was written",
            ),
            (
                "probmoe-train",
                ["--help"],
                "interrupted (SIGTERM); no checkpoint was written: run the command again to start over",
            ),
        ]
    ],
)
def test_each_console_script_ends_on_sigterm_while_it_loads(command, args, line):
    """SIGTERM as soon as the handlers are in place (the command's module still importing): the one
    line and 143."""
    assert interrupted_at_start(command, args, 0.0, signal.SIGTERM) == (143, line + "\n")


def test_the_console_scripts_start_outside_the_packages_and_import_nothing_heavy():
    """Every console script starts in probmoe_commands, which loads neither torch nor probmoe nor
    circuits, and runs the command's own main (the module the entry names)."""
    import probmoe_commands

    assert {target.split(":")[0] for target in scripts().values()} == {"probmoe_commands"}
    for target in scripts().values():
        assert callable(getattr(probmoe_commands, target.split(":")[1]))
    code = "import sys, probmoe_commands; print(sorted(m.split('.')[0] for m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert not {"torch", "probmoe", "circuits", "numpy"} & set(eval(loaded)), loaded


def test_the_console_scripts_run_the_commands(monkeypatch):
    """Each entry imports its command's module and returns what its main returns, with SIGINT and
    SIGTERM handled as before once it returns (train, eval and analyze put their own in place inside)."""
    import probmoe_commands
    from circuits.inspect import cli

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    during = {}  # entry -> the SIGINT handler while the command's main runs
    for owner, name, entry in [
        (train, "main", "train_main"),
        (evaluate, "main", "eval_main"),
        (analyze, "main", "analyze_main"),
        (launch, "main", "launch_main"),
        (cli, "compile_main", "compile_main"),
        (cli, "inspect_main", "inspect_main"),
    ]:

        def main(entry=entry):
            during[entry] = signal.getsignal(signal.SIGINT)
            return 7

        monkeypatch.setattr(owner, name, main)
        assert getattr(probmoe_commands, entry)() == 7
        assert {s: signal.getsignal(s) for s in before} == before
    # the entry's handler where main handles the signals itself (it ends at once), else Python's
    for entry in ("train_main", "eval_main", "analyze_main"):
        assert during[entry] is not signal.default_int_handler and callable(during[entry])
    for entry in ("launch_main", "compile_main", "inspect_main"):
        assert during[entry] is signal.default_int_handler
