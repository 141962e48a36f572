"""The experiment commands as a new user meets them: any SFT format trains, answers lost to
--max-length are warned of or refused, a finished run is not re-run, --no-progress is quiet, and
damaged weights get one line naming the file (with no output folder left behind)."""

import contextlib
import io
import json
import os
import shutil

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from probmoe.cli import analyze, evaluate, train
from probmoe.experiments import data, formats
from probmoe.experiments.tokenizer import byte_tokenizer
from probmoe.integrations.transformers.weights_file import check_weights_files

QA = [{"question": f"{i}+{i}?", "answer": f"{2 * i}"} for i in range(4)]


def snapshot(root):
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
        for p in root.rglob("*")
    }


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny OLMoE trained 2 steps on 4 question/answer lines, stopped after 1 and resumed (with
    what the resume printed)."""
    root = tmp_path_factory.mktemp("cli")
    qa = write_jsonl(root / "qa.jsonl", QA)
    args = [
        "--model",
        "tiny-olmoe",
        "--data",
        qa,
        "--output-dir",
        str(root / "run"),
        "--max-steps",
        "2",
        "--batch-size",
        "2",
        "--no-progress",
    ]
    assert train.main([*args, "--stop-after", "1"]) == 0
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert train.main([*args, "--resume", "latest"]) == 0
    return root, qa, args, err.getvalue()


def test_resume_says_where_it_resumed_and_a_finished_run_writes_nothing(run, capsys):
    root, _, args, resumed = run
    assert f"resumed from {root / 'run' / 'checkpoint-000001'} at step 1 of 2" in resumed
    assert (root / "run" / "model.safetensors").is_file()
    before = snapshot(root / "run")
    assert train.main([*args, "--resume", "latest"]) == 0
    err = capsys.readouterr().err
    assert "checkpoint-000002: already complete at step 2; nothing trained or written" in err
    assert "resumed" not in err
    assert snapshot(root / "run") == before  # not a byte or a time stamp changed


def test_no_progress_silences_the_loading_bars_of_transformers(run, capsys):
    from transformers.utils import logging

    root, qa, _, _ = run
    cases = {}
    for flag in ([], ["--no-progress"]):
        logging.enable_progress_bar()  # as in a fresh process
        assert (
            evaluate.main(
                [
                    "--checkpoint",
                    str(root / "run"),
                    "--data",
                    qa,
                    "--skip-generation",
                    "--output",
                    str(root / f"eval{len(flag)}"),
                    *flag,
                ]
            )
            == 0
        )
        cases[bool(flag)] = capsys.readouterr().err
    logging.enable_progress_bar()
    assert "Loading weights" in cases[False] and "answer loss" in cases[False]  # the bars this test looks for
    assert "Loading weights" not in cases[True] and "it/s" not in cases[True] and "%|" not in cases[True]


@pytest.mark.parametrize("damage", ["truncated to 1,000 bytes", "first 8 bytes overwritten"])
def test_damaged_weights_get_one_line_naming_the_file(run, tmp_path, capsys, damage):
    root, qa, _, _ = run
    model = tmp_path / "model"
    shutil.copytree(root / "run", model, ignore=shutil.ignore_patterns("checkpoint-*", "eval*"))
    weights = model / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    weights.write_bytes(bytes(raw[:1000]) if damage.startswith("truncated") else b"\xff" * 8 + bytes(raw[8:]))
    commands = {
        "eval": (
            evaluate.main,
            ["--checkpoint", str(model), "--data", qa, "--skip-generation"],  # QA has no '####'
            model / "eval-saved",
        ),
        "analyze": (
            analyze.main,
            ["--checkpoint", str(model), "--data", qa, "--output", str(tmp_path / "an")],
            tmp_path / "an",
        ),
        "train": (
            train.main,
            ["--model", str(model), "--data", qa, "--output-dir", str(tmp_path / "tr"), "--max-steps", "1"],
            tmp_path / "tr",
        ),
    }
    for name, (main, argv, output) in commands.items():
        with pytest.raises(SystemExit) as e:
            main([*argv, "--no-progress"])
        err = capsys.readouterr().err
        assert e.value.code == 2, name
        (line,) = [line for line in err.splitlines() if "error:" in line]
        assert f"{weights}: damaged weights file" in line, (name, err)
        assert "Traceback" not in err and "SafetensorError" not in err
        assert not output.exists(), f"{name} left {output} behind"


def test_weights_file_check_reads_headers(run, tmp_path):
    root, _, _, _ = run
    assert check_weights_files(str(root / "run")) == [str(root / "run" / "model.safetensors")]
    raw = (root / "run" / "model.safetensors").read_bytes()
    cases = {
        "short.safetensors": (raw[: 100 + int.from_bytes(raw[:8], "little")], r"bytes of data \(truncated\)"),
        "tiny.safetensors": (raw[:5], "shorter than the 8-byte header length"),
        "json.safetensors": ((4).to_bytes(8, "little") + b"{no}" + raw[8:], "header is not valid JSON"),
    }
    for name, (content, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / name).write_bytes(content)
        with pytest.raises(ValueError, match=f"{name}: damaged weights file: .*{message}"):
            check_weights_files(str(folder))


def test_chat_data_in_parquet_trains_on_the_assistant_tokens(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    chats = [
        {"messages": [{"role": "user", "content": f"{i}+{i}?"}, {"role": "assistant", "content": f"{2 * i}"}]}
        for i in range(4)
    ]
    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(chats), path)
    out = tmp_path / "run"
    assert (
        train.main(
            [
                "--model",
                "tiny-olmoe",
                "--data",
                str(path),
                "--output-dir",
                str(out),
                "--max-steps",
                "1",
                "--batch-size",
                "4",
                "--no-progress",
            ]
        )
        == 0
    )
    log = [json.loads(line) for line in open(out / "train_log.jsonl")]
    expected = sum(
        sum(label != data.IGNORE for label in e.labels[1:])
        for e in data.encode_all(byte_tokenizer(), formats.read(path), 1024)
    )
    assert expected == sum(len(str(2 * i)) + 1 for i in range(4))  # each answer and its eos, nothing else
    assert log[1]["answer_tokens"] == expected and log[0]["config"]["data_format"] is None
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(out)).chat_template  # saved with the model


def test_max_length_warns_when_answers_are_lost_and_refuses_at_half(tmp_path, capsys):
    rows = [*QA[:3], {"question": "x" * 60, "answer": "1"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "run"
    assert (
        train.main(
            [
                "--model",
                "tiny-olmoe",
                "--data",
                path,
                "--output-dir",
                str(out),
                "--max-steps",
                "1",
                "--batch-size",
                "4",
                "--max-length",
                "40",
                "--no-progress",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "warning: --max-length 40 leaves no answer token in 1 of 4 examples" in err
    assert json.loads(open(out / "train_log.jsonl").readline())["examples_without_answer_tokens"] == 1
    path = write_jsonl(tmp_path / "e.jsonl", [*QA[:2], *rows[3:] * 2])
    with pytest.raises(SystemExit) as e:
        train.main(
            [
                "--model",
                "tiny-olmoe",
                "--data",
                path,
                "--output-dir",
                str(tmp_path / "never"),
                "--max-steps",
                "1",
                "--max-length",
                "40",
                "--batch-size",
                "4",
                "--no-progress",
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and "leaves no answer token in 2 of 4 examples" in err and "raise --max-length" in err
    assert not (tmp_path / "never").exists()


def test_data_format_flag_overrides_detection(tmp_path, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", [{**r, "text": f"{r['question']} {r['answer']}"} for r in QA])
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(["--model", "tiny-olmoe", "--data", path, "--output-dir", str(out), "--max-steps", "1"])
    assert e.value.code == 2 and "choose one with --data-format" in capsys.readouterr().err
    assert (
        train.main(
            [
                "--model",
                "tiny-olmoe",
                "--data",
                path,
                "--output-dir",
                str(out),
                "--max-steps",
                "1",
                "--batch-size",
                "4",
                "--data-format",
                "text",
                "--no-progress",
            ]
        )
        == 0
    )
    tokens = json.loads(open(out / "train_log.jsonl").readlines()[1])["answer_tokens"]
    assert tokens == sum(len(f"{r['question']} {r['answer']}") + 1 - 1 for r in QA)  # all but the first token
    assert os.path.isfile(out / "model.safetensors")
