"""One run at a time in an --output-dir (issue 48, point 1): a second probmoe-train started on a
folder another run holds stops at once with one line naming --output-dir and status 2, having
written nothing, so config.yaml, train_log.jsonl and the checkpoints are the first run's alone;
the ranks of one torchrun launch share the folder, a second launch is refused."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from probmoe.cli import train
from probmoe.experiments import run_lock, state

ROOT = Path(__file__).resolve().parents[2]
QA = [{"question": f"{i}+{i}?", "answer": f"{2 * i}"} for i in range(8)]
RUN = ["--model", "tiny-olmoe", "--max-steps", "8", "--batch-size", "2", "--save-every", "2", "--no-progress"]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "D.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in QA), encoding="utf-8")
    return str(path)


def in_use(out) -> str:
    return f"probmoe-train: error: --output-dir {str(out)!r} is in use: another probmoe-train run holds it"


def test_a_run_on_a_held_folder_stops_at_once_with_one_line(tmp_path, data, capsys):
    out = tmp_path / "same"
    held = run_lock.acquire(str(out))
    try:
        with pytest.raises(SystemExit) as e:
            train.main([*RUN, "--data", data, "--output-dir", str(out)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(in_use(out)), err
        assert f"(pid {os.getpid()} on " in err and "wait for it to end, or choose another folder" in err
        assert os.listdir(out) == [run_lock.NAME]  # nothing written
    finally:
        run_lock.release(held)
    assert not out.exists()  # the folder the lock made goes with it, empty


def test_a_lock_file_no_run_holds_is_no_content(tmp_path, data):
    """A killed run's lock file neither blocks nor makes the folder 'not empty'; a run removes it."""
    out = tmp_path / "run"
    out.mkdir()
    (out / run_lock.NAME).write_text("12345 elsewhere\n")
    assert train.main([*RUN, "--data", data, "--output-dir", str(out), "--max-steps", "1"]) == 0
    assert run_lock.NAME not in os.listdir(out) and (out / "model.safetensors").exists()


def test_a_run_refused_after_locking_leaves_no_folder(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?"}\n')
    out = tmp_path / "new" / "deeper" / "run"
    with pytest.raises(SystemExit) as e:
        train.main([*RUN, "--data", str(bad), "--output-dir", str(out)])
    assert e.value.code == 2 and "bad.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError) as e:
        run_lock.acquire(str(tmp_path / "file" / "run"))
    assert str(e.value) == f"--output-dir {str(tmp_path / 'file' / 'run')!r} cannot be written (Not a directory)"


def test_a_file_system_without_locks_warns_and_goes_on(tmp_path, monkeypatch, capsys):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    held = run_lock.acquire(str(tmp_path / "run"))
    assert capsys.readouterr().err == (
        f"warning: --output-dir {str(tmp_path / 'run')!r} cannot be locked (No locks available): a second run "
        "started on it would not be stopped\n"
    )
    run_lock.release(held)
    assert not (tmp_path / "run").exists()


def start(*argv, launcher=("probmoe.cli.train",)):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", *launcher, *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # two training processes at once
def test_two_runs_started_together_on_one_folder(tmp_path, data):
    """The issue's reproduction: exactly one run trains; the other stops with the one line and
    status 2; the folder's files are all the winner's (config.yaml's seed is the checkpoints')."""
    out = tmp_path / "same"
    procs = {seed: start(*RUN, "--data", data, "--output-dir", str(out), "--seed", str(seed)) for seed in (1, 2)}
    ended = {seed: (proc.wait(timeout=600), proc.stderr.read()) for seed, proc in procs.items()}
    winners = [seed for seed, (code, _) in ended.items() if code == 0]
    assert len(winners) == 1, ended
    (winner,), (loser,) = winners, [seed for seed in ended if seed not in winners]
    code, err = ended[loser]
    assert code == 2 and err.count("\n") == 1 and err.startswith(in_use(out)), err
    assert f"seed: {winner}\n" in (out / "config.yaml").read_text()
    log = [json.loads(line) for line in open(out / "train_log.jsonl")]
    assert [r["event"] for r in log if "event" in r] == ["start"] and log[0]["config"]["seed"] == winner
    assert [r["step"] for r in log if "event" not in r] == list(range(1, 9))
    for directory in state.checkpoints(str(out)):
        manifest = state.read_manifest(directory)
        state.verify(directory, manifest, 0)
        assert manifest["fingerprint"]["seed"] == winner
    assert len(state.checkpoints(str(out))) == 4 and state.check_final(str(out), 8) is None
    assert run_lock.NAME not in os.listdir(out)


@pytest.mark.slow  # torchrun
def test_the_ranks_of_one_launch_share_the_folder_and_a_second_launch_is_refused(tmp_path, data):
    out = tmp_path / "run"
    argv = ["--standalone", "--nproc_per_node", "2", "-m", "probmoe.cli.train", *RUN, "--data", data]
    launch = ("probmoe.cli.launch",)
    first = start(*argv, "--output-dir", str(out), "--max-steps", "2", launcher=launch)
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0 and (out / "model.safetensors").exists(), err[-4000:]
    held = run_lock.acquire(str(tmp_path / "held"))
    try:
        second = start(*argv, "--output-dir", str(tmp_path / "held"), launcher=launch)
        _, err = second.communicate(timeout=600)
    finally:
        run_lock.release(held)
    lines = [line for line in err.splitlines() if "torch/distributed/run.py" not in line]  # torchrun's OMP banner
    assert second.returncode == 2 and len(lines) == 1 and lines[0].startswith(in_use(tmp_path / "held")), err
