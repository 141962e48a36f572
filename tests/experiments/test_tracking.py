"""probmoe-train --report-to: TensorBoard event files and an offline W&B run holding the loss, the
learning rate, the grad norm, tokens/s and RoutingStatsCallback's routing keys per layer, with
the values of train_log.jsonl; neither library imported unless asked for."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from probmoe.cli import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATS = ("experts_per_token", "load_cv", "max_vio", "entropy")  # RoutingStatsCallback's (checked below)


def write_data(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": f"{i}+{i}?", "answer": f"{2 * i}"}) + "\n" for i in range(4)))
    return str(path)


def run(tmp_path, *flags):
    out = tmp_path / "run"
    assert (
        train.main(
            [
                "--model",
                "tiny-olmoe",
                "--data",
                write_data(tmp_path),
                "--output-dir",
                str(out),
                "--max-steps",
                "3",
                "--batch-size",
                "2",
                "--no-progress",
                *flags,
            ]
        )
        == 0
    )
    return out, [json.loads(line) for line in open(out / "train_log.jsonl")][1:]


def test_routing_keys_are_the_callbacks():
    from probmoe.integrations.transformers import callback

    assert callback.STATS == STATS


def test_tensorboard_event_files_hold_the_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, log = run(tmp_path, "--report-to", "tensorboard", "--log-every", "1")
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {
        "train/loss",
        "train/learning_rate",
        "train/grad_norm",
        "train/tokens_per_s",
        *(f"routing/{s}" for s in STATS),
        *(f"routing/layer{i}/{s}" for i in (0, 1) for s in STATS),
    }
    assert expected <= tags, expected - tags
    for tag, key in (("train/loss", "loss"), ("train/learning_rate", "lr"), ("train/grad_norm", "grad_norm")):
        assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars(tag)] == [
            (r["step"], r[key]) for r in log
        ]
    experts = [e.value for e in events.Scalars("routing/experts_per_token")]
    assert experts == [pytest.approx(2.0)] * 3  # tiny-olmoe's top-2 under exactly-k probmoe
    for step, record in zip(events.Scalars("routing/layer1/load_cv"), log):
        # the callback averages over the step's micro-batches; one micro-batch per step here
        assert step.value == pytest.approx(record["routing"][1]["load_cv"], rel=1e-5)
    entropy = [e.value for e in events.Scalars("routing/entropy")]
    assert all(0 < h <= 1 for h in entropy)


def wandb_records(path):
    """The protobuf records of a W&B run file (``run-*.wandb``): a 7-byte header (``:W&B``, magic,
    version), then LevelDB's log format: 32 KiB blocks of chunks, each with a 7-byte header (crc32,
    length, type: 1 full, 2 first, 3 middle, 4 last)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    block, pos, records, chunk = 32768, 7, [], b""
    while pos + 7 <= len(raw):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):  # the block's zero padding
            pos += left
            continue
        chunk += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_wandb_offline_writes_its_run_folder_and_a_resume_continues_the_run(tmp_path):
    """In fresh processes, as a user runs it: wandb keeps process-wide state (its settings
    singleton, its service), which a test before this one in the same process may have set up.
    2 steps, then --resume latest to 3: the second process logs step 3 into the same W&B run (the
    id kept in the output folder)."""
    pytest.importorskip("wandb")
    (tmp_path / "wb").mkdir()
    out = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wb"),
        "WANDB_SILENT": "true",
    }
    script = "import sys; from probmoe.cli import train; sys.exit(train.main(sys.argv[1:]))"
    args = [
        sys.executable,
        "-c",
        script,
        "--model",
        "tiny-olmoe",
        "--data",
        write_data(tmp_path),
        "--output-dir",
        str(out),
        "--max-steps",
        "3",
        "--batch-size",
        "2",
        "--no-progress",
        "--report-to",
        "wandb",
    ]
    for extra in (["--stop-after", "2"], ["--resume", "latest"]):
        done = subprocess.run([*args, *extra], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    log = [r for r in map(json.loads, open(out / "train_log.jsonl")) if "loss" in r]
    run_id = (out / "wandb_run_id").read_text().strip()
    folders = sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(folder.name.endswith(f"-{run_id}") for folder in folders)
    history, runs = [], []
    for folder in folders:
        (file,) = folder.glob("run-*.wandb")
        records = wandb_records(file)
        history += [
            {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records
            if r.WhichOneof("record_type") == "history"
        ]
        runs += [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert [h["_step"] for h in history] == [r["step"] for r in log] == [1, 2, 3]
    for h, r in zip(history, log):
        assert h["train/loss"] == pytest.approx(r["loss"]) and h["train/learning_rate"] == pytest.approx(r["lr"])
        assert {f"routing/layer{i}/{s}" for i in (0, 1) for s in STATS} <= set(h)
    assert [run.run_id for run in runs] == [run_id, run_id]
    config = {item.key: json.loads(item.value_json) for item in runs[0].config.update}
    assert config["max-steps"] == 3 and config["report-to"] == "wandb"


def test_a_damaged_wandb_run_id_file_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "wandb_run_id").write_text("../../etc\n")
    with pytest.raises(SystemExit) as e:
        train.main(
            [
                "--model",
                "tiny-olmoe",
                "--data",
                write_data(tmp_path),
                "--output-dir",
                str(out),
                "--max-steps",
                "1",
                "--report-to",
                "wandb",
                "--no-progress",
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and "wandb_run_id must hold a W&B run id" in err


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_trackers_are_not_imported_unless_asked_for_and_no_progress_is_quiet(tmp_path):
    script = f"""
import sys
from probmoe.cli import train
assert train.main(["--model", "tiny-olmoe", "--data", {write_data(tmp_path)!r}, "--output-dir", {str(tmp_path / "r")!r},
                   "--max-steps", "1", "--batch-size", "2", "--no-progress"]) == 0
print(sorted(m for m in sys.modules if m.split(".")[0] in ("wandb", "tensorboard", "tensorboardX")
             or m.startswith("torch.utils.tensorboard")))
"""
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    # and --no-progress, in a fresh process, leaves no bar: ours, nor transformers' writing the model
    assert "%|" not in done.stderr and "it/s" not in done.stderr and "Writing" not in done.stderr, done.stderr


def test_missing_tracker_package_is_one_line(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        train.main(
            [
                "--model",
                "tiny-olmoe",
                "--data",
                write_data(tmp_path),
                "--output-dir",
                str(tmp_path / "r"),
                "--max-steps",
                "1",
                "--report-to",
                "wandb",
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--report-to wandb needs the wandb package: pip install 'probmoe[tracking]'" in err
    assert not (tmp_path / "r").exists()
