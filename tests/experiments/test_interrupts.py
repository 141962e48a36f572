"""SIGINT/SIGTERM and damaged checkpoints: probmoe-train stops at a step boundary with one line and
status 130/143 (alone and under torchrun), leaves only complete checkpoints, resumes bit for bit,
and --resume latest steps over a damaged newest checkpoint."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from gsm8k_data import write
from rank_runs import torchrun
from safetensors.torch import load_file

from probmoe.cli import train
from probmoe.experiments import distributed, interrupts, state

ROOT = Path(__file__).resolve().parents[2]
# a run long enough to be interrupted, a checkpoint each step; constant LR, so a resume may end earlier
LONG = [
    "--model",
    "tiny-olmoe",
    "--method",
    "conventional",
    "--batch-size",
    "2",
    "--save-every",
    "1",
    "--lr-schedule",
    "constant",
    "--no-progress",
]


def weights(path):
    return load_file(os.path.join(path, "model.safetensors"))


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def assert_only_complete_checkpoints(out):
    """Nothing half-written: no checkpoint-*.tmp, and every checkpoint's files match its manifest."""
    assert not [name for name in os.listdir(out) if name.endswith(".tmp")]
    for directory in state.checkpoints(str(out)):
        state.verify(directory, state.read_manifest(directory), 0)


def wait_for(path, proc, timeout=300):
    start = time.monotonic()
    while not os.path.isdir(path):
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        assert time.monotonic() - start < timeout, f"no {path} after {timeout} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write(tmp_path_factory.mktemp("data"), "train.jsonl", 16)


# ---- the signal handling on its own


@pytest.fixture
def caught():
    with interrupts.catch():
        yield


def test_outside_the_loop_a_signal_raises_at_once(caught):
    with pytest.raises(interrupts.Interrupted) as e:
        signal.raise_signal(signal.SIGTERM)
    assert e.value.status == 143 and e.value.step is None and not e.value.at_boundary


def test_in_the_loop_the_first_signal_waits_and_a_second_ctrl_c_forces(caught, monkeypatch):
    with interrupts.deferred():
        signal.raise_signal(signal.SIGINT)
        assert interrupts.requested() == signal.SIGINT  # recorded, nothing raised
        signal.raise_signal(signal.SIGINT)  # at once after: torchrun forwarding the same Ctrl-C
        signal.raise_signal(signal.SIGTERM)  # torchrun forwarding a SIGTERM: not a second press either
        assert interrupts.requested() == signal.SIGINT
        monkeypatch.setattr(interrupts, "SAME_PRESS_S", 0.0)
        with pytest.raises(interrupts.Interrupted) as e:  # a second press
            signal.raise_signal(signal.SIGINT)
    assert e.value.status == 130
    signal.raise_signal(signal.SIGINT)  # on the way out: ignored


def test_catch_restores_the_handlers_it_replaced():
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    with interrupts.catch():
        assert all(signal.getsignal(s) is not before[s] for s in interrupts.SIGNALS)
    assert {s: signal.getsignal(s) for s in interrupts.SIGNALS} == before
    assert interrupts.requested() is None
    # outside catch(), deferred() does nothing: Python's own SIGINT handler raises (set here, with the
    # signal unblocked, whatever a library loaded by an earlier test left)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    with interrupts.deferred(), pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_the_line_names_the_checkpoint_and_the_way_on():
    stopped = interrupts.Interrupted(signal.SIGTERM, step=7, at_boundary=True)
    assert interrupts.message(stopped, "runs/x/checkpoint-000006") == (
        "interrupted (SIGTERM) after step 7; the last complete checkpoint is runs/x/checkpoint-000006: run the same "
        "command with --resume latest to continue from it"
    )
    assert "no checkpoint was written" in interrupts.message(interrupts.Interrupted(signal.SIGINT), None)


def test_a_save_cut_short_leaves_no_folder(tmp_path):
    """A forced interrupt in the middle of a save removes what the save wrote so far."""

    class Model:
        def save_pretrained(self, directory):
            (Path(directory) / "model.safetensors").write_bytes(b"half")
            raise interrupts.Interrupted(signal.SIGINT)

    world = distributed.World(rank=0, size=1, local_rank=0, device=torch.device("cpu"))
    target = state.checkpoint_dir(str(tmp_path), 3)
    with pytest.raises(interrupts.Interrupted):
        state.save(
            target,
            step=3,
            fingerprint={},
            world=world,
            model=Model(),
            tokenizer=None,
            optimizer=None,
            scheduler=None,
            generator=None,
        )
    assert os.listdir(tmp_path) == []


def test_the_final_model_is_moved_in_whole_or_not_at_all(tmp_path):
    world = distributed.World(rank=0, size=1, local_rank=0, device=torch.device("cpu"))

    def cut_short(directory):
        (Path(directory) / "config.json").write_text("{}")
        raise interrupts.Interrupted(signal.SIGINT)

    with pytest.raises(interrupts.Interrupted):
        state.save_final(str(tmp_path), world, cut_short)
    assert os.listdir(tmp_path) == []
    state.save_final(str(tmp_path), world, lambda d: (Path(d) / "model.safetensors").write_bytes(b"whole"))
    assert sorted(os.listdir(tmp_path)) == [state.FINAL, "model.safetensors"]  # the final files and their checksums
    assert (tmp_path / "model.safetensors").read_bytes() == b"whole" and state.check_final(str(tmp_path), None) is None


# ---- probmoe-train under a signal


def launch(out, data, *extra):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "probmoe.cli.train",
            *LONG,
            "--data",
            data,
            "--output-dir",
            str(out),
            "--max-steps",
            "1000",
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def interrupt(out, data, signum) -> tuple[int, str]:
    """Start probmoe-train, send ``signum`` once its first checkpoint is there; checks the status,
    the one line and the checkpoints, and returns (the step it stopped after, its checkpoint)."""
    proc = launch(out, data)
    wait_for(out / "checkpoint-000001", proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, err  # 130 for SIGINT, 143 for SIGTERM
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1, err
    step = int(lines[0].split(" after step ")[1].split(";")[0])
    last = state.latest_checkpoint(str(out))
    assert last == state.checkpoint_dir(str(out), step)  # the step it stopped after was saved (--save-every 1)
    assert lines[0] == (
        f"interrupted ({signal.Signals(signum).name}) after step {step}; the last complete "
        f"checkpoint is {last}: run the same command with --resume latest to continue from it"
    )
    assert_only_complete_checkpoints(out)
    return step, last


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_sigterm_stops_the_run_with_status_143_and_one_line(tmp_path, data):
    interrupt(tmp_path / "run", data, signal.SIGTERM)


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_ctrl_c_stops_the_run_with_status_130_and_resume_is_exact(tmp_path, data, capsys):
    out = tmp_path / "run"
    step, last = interrupt(out, data, signal.SIGINT)
    # resumed to one step past the interruption, it ends where an uninterrupted run of as many steps ends
    end = ["--max-steps", str(step + 1)]
    assert train.main([*LONG, "--data", data, "--output-dir", str(out), *end, "--resume", "latest"]) == 0
    assert f"resumed from {last} at step {step}" in capsys.readouterr().err
    assert train.main([*LONG, "--data", data, "--output-dir", str(tmp_path / "whole"), *end]) == 0
    assert_same_weights(out, tmp_path / "whole")


# ---- damaged checkpoints


def test_resume_latest_steps_over_damaged_checkpoints(tmp_path, data, capsys):
    args = [*LONG, "--data", data, "--max-steps", "3", "--lr-schedule", "linear", "--warmup-steps", "1"]
    out = tmp_path / "run"
    assert train.main([*args, "--output-dir", str(out), "--stop-after", "2"]) == 0
    ckpt = [state.checkpoint_dir(str(out), s) for s in (1, 2)]
    with open(os.path.join(ckpt[1], "model.safetensors"), "r+b") as f:  # cut short: a lost write
        f.truncate(os.path.getsize(f.name) // 2)
    capsys.readouterr()
    assert train.main([*args, "--output-dir", str(out), "--resume", "latest"]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and ckpt[1] in warnings[0] and "model.safetensors" in warnings[0], err
    assert f"resumed from {ckpt[0]} at step 1 of 3" in err
    assert os.path.isdir(ckpt[1] + ".damaged")  # set aside, its files kept
    assert_only_complete_checkpoints(out)
    assert train.main([*args, "--output-dir", str(tmp_path / "whole")]) == 0
    assert_same_weights(out, tmp_path / "whole")

    # a manifest gone is damage too; with every checkpoint damaged, nothing is resumed and nothing moved
    os.remove(os.path.join(state.checkpoint_dir(str(out), 3), state.MANIFEST))
    for step in (1, 2):
        with open(os.path.join(state.checkpoint_dir(str(out), step), state.STATE), "ab") as f:
            f.write(b"flipped")
    before = sorted(os.listdir(out))
    with pytest.raises(SystemExit) as e:
        train.main([*args, "--output-dir", str(out), "--resume", "latest"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no checkpoint in --output-dir" in err and "passes its checks" in err
    assert all(state.checkpoint_dir(str(out), s) in err for s in (1, 2, 3))
    assert sorted(os.listdir(out)) == before


# ---- under torchrun

# Runs probmoe-train as one rank, its stderr (fd 2: tracebacks too) into stderr_rank<r> and its exit
# status into status_rank<r>.
RANK_SCRIPT = """
import os, sys
where, rank = sys.argv[1], os.environ["RANK"]
err = os.open(os.path.join(where, f"stderr_rank{rank}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.dup2(err, 2)
from probmoe.cli import train
status = train.main(sys.argv[2:])
with open(os.path.join(where, f"status_rank{rank}"), "w") as f:
    f.write(str(status))
sys.exit(status)
"""


@pytest.mark.slow
def test_ctrl_c_under_torchrun_stops_every_rank_cleanly(tmp_path, data):
    """A Ctrl-C reaches torchrun (the ranks run in sessions of their own), which forwards it.
    Every rank ends with status 130 and no traceback at the same step; rank 0 prints the line.
    (torchrun itself reports the signal with its own traceback and status 1: probmoe.cli.launch,
    below, does not.)"""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            *torchrun(),
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(tmp_path),
            *LONG,
            "--data",
            data,
            "--output-dir",
            str(out),
            "--max-steps",
            "1000",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for(out / "checkpoint-000001", proc)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=300)
    errs = [(tmp_path / f"stderr_rank{r}").read_text() for r in (0, 1)]
    assert [(tmp_path / f"status_rank{r}").read_text() for r in (0, 1)] == ["130", "130"], errs
    assert all("Traceback" not in err for err in errs), errs
    lines = [line for line in errs[0].splitlines() if line.startswith("interrupted (SIGINT) after step ")]
    assert len(lines) == 1 and "interrupted" not in errs[1], errs
    assert state.latest_checkpoint(str(out)) in lines[0]
    assert_only_complete_checkpoints(out)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_launcher_ends_as_the_ranks_do(tmp_path, data, signum):
    """python -m probmoe.cli.launch (torchrun's entry in-process): a signal to it ends it with
    128 + the signal's number and no output of its own (plain torchrun: a traceback and status 1);
    rank 0's line is the only one on the terminal."""
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "probmoe.cli.launch",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "probmoe.cli.train",
            *LONG,
            "--data",
            data,
            "--output-dir",
            str(out),
            "--max-steps",
            "1000",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for(out / "checkpoint-000001", proc)
    os.killpg(proc.pid, signum)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, stderr[-4000:]
    lines = [line for line in stderr.splitlines() if "torch/distributed/run.py" not in line]  # its OMP banner
    name = signal.Signals(signum).name
    assert len(lines) == 1 and lines[0].startswith(f"interrupted ({name}) after step "), stderr[-4000:]
    assert state.latest_checkpoint(str(out)) in lines[0] and "Traceback" not in stderr and not stdout
    assert_only_complete_checkpoints(out)


@pytest.mark.slow
def test_the_launcher_runs_to_the_end(tmp_path, data):
    """Without a signal the launcher is torchrun: status 0, the final model written."""
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "probmoe.cli.launch",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "probmoe.cli.train",
            *LONG,
            "--data",
            data,
            "--output-dir",
            str(out),
            "--max-steps",
            "2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (out / "model.safetensors").exists()


def test_the_launcher_is_installed_as_probmoe_launch(monkeypatch):
    """``probmoe-launch`` (pyproject's console script, through probmoe_commands) is ``python -m
    probmoe.cli.launch``."""
    from importlib.metadata import entry_points

    from probmoe.cli import launch

    (script,) = entry_points(group="console_scripts", name="probmoe-launch")
    monkeypatch.setattr(launch, "main", lambda: "launched")
    assert script.load()() == "launched"


# ---- probmoe-eval and probmoe-analyze: stop at once, one line saying what was written


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("trained") / "run"
    assert train.main([*LONG, "--data", data, "--output-dir", str(out), "--max-steps", "1"]) == 0
    return out


def signal_on_call(monkeypatch, owner, name, signum, call=1):
    """``owner.name`` sends this process ``signum`` on its ``call``-th call (before doing its work)."""
    original, calls = getattr(owner, name), []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            signal.raise_signal(signum)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


def test_eval_interrupted_while_generating_says_what_it_wrote(tmp_path, trained, data, monkeypatch, capsys):
    from probmoe.cli import evaluate
    from probmoe.eval import generation

    out = tmp_path / "eval"
    signal_on_call(monkeypatch, generation, "complete", signal.SIGINT, call=2)  # in the second batch of 2
    args = [
        "--checkpoint",
        str(trained),
        "--data",
        data,
        "--limit",
        "6",
        "--batch-size",
        "2",
        "--max-new-tokens",
        "4",
        "--no-progress",
        "--output",
        str(out),
    ]
    assert evaluate.main(args) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"interrupted (SIGINT) while evaluating {trained}; {out / 'results.jsonl'} holds 2 of the 6 "
        "problems and there is no summary.json: run the same command with --overwrite to evaluate them all"
    ]
    assert len((out / "results.jsonl").read_text().splitlines()) == 2 and not (out / "summary.json").exists()
    (out / "summary.json").write_text("{}")  # an earlier run's, which an interrupted --overwrite run removes
    monkeypatch.undo()
    signal_on_call(monkeypatch, generation, "complete", signal.SIGINT, call=1)
    assert evaluate.main([*args, "--overwrite"]) == 130
    assert "holds 0 of the 6 problems" in capsys.readouterr().err and not (out / "summary.json").exists()


def test_eval_interrupted_while_loading_wrote_nothing(tmp_path, trained, data, monkeypatch, capsys):
    from probmoe.cli import evaluate
    from probmoe.experiments import checkpoints

    signal_on_call(monkeypatch, checkpoints, "load", signal.SIGTERM)
    out = tmp_path / "eval"
    assert (
        evaluate.main(
            ["--checkpoint", str(trained), "--data", data, "--limit", "2", "--no-progress", "--output", str(out)]
        )
        == 143
    )
    assert capsys.readouterr().err.strip().splitlines() == [
        f"interrupted (SIGTERM) while evaluating {trained}; nothing was written"
    ]
    assert not out.exists()


def test_analyze_interrupted_wrote_nothing(tmp_path, trained, data, monkeypatch, capsys):
    from probmoe.cli import analyze
    from probmoe.experiments import capture

    signal_on_call(monkeypatch, capture, "analyze", signal.SIGINT)
    out = tmp_path / "analysis"
    assert (
        analyze.main(
            ["--checkpoint", str(trained), "--data", data, "--limit", "2", "--no-progress", "--output", str(out)]
        )
        == 130
    )
    assert capsys.readouterr().err.strip().splitlines() == [
        f"interrupted (SIGINT) while analysing the routing; nothing was written to {out}"
    ]
    assert not out.exists()


def test_analyze_interrupted_while_writing_finishes_the_files(tmp_path, trained, data, monkeypatch, capsys):
    from probmoe.analysis import report
    from probmoe.cli import analyze

    signal_on_call(monkeypatch, report, "write", signal.SIGTERM)
    out = tmp_path / "analysis"
    assert (
        analyze.main(
            ["--checkpoint", str(trained), "--data", data, "--limit", "2", "--no-progress", "--output", str(out)]
        )
        == 143
    )
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == f"interrupted (SIGTERM) while writing the analysis; it is complete in {out}"
    )
    assert {"analysis.json", "analysis.csv", "tokens.csv"} <= set(os.listdir(out))
