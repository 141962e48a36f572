"""Ctrl-C while a command starts (issue 48, point 7): from the first line of each command's main
(before the command line is read, while transformers and datasets load) a SIGINT is one line and
status 130, as it is later, never a KeyboardInterrupt traceback."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from probmoe.cli import analyze, common, evaluate, launch, train

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


@pytest.mark.xfail(
    strict=True,
    reason="the console script imports probmoe.cli.train, so `import probmoe` (torch, about 1-2 s) runs before "
    "any of the command's code: a SIGINT then is still Python's traceback until [project.scripts] points at a "
    "module outside the probmoe package (pyproject.toml, not this change's)",
)
def test_a_console_script_interrupted_in_its_first_moment():
    """What ``probmoe-train`` runs (the console script's two lines), SIGINT 0.2 s after it starts."""
    script = "import sys\nfrom probmoe.cli.train import main\nsys.exit(main())\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "--model", "tiny-olmoe", "--plan"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.count("\n") == 1 and "Traceback" not in err, err
