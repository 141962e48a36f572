"""One config (``probmoe.experiments.run_config``): the commands' flags are generated from its
dataclasses, ``--config`` YAML/TOML files set any option by its flag name, flags override the file,
unknown keys and bad values get one line naming the closest key or the allowed range, and the
resolved config written into the run folder reads back into the same config and is checked on
resume."""

import json

import pytest

pytest.importorskip("transformers")

from probmoe.cli import analyze, evaluate, train
from probmoe.experiments import config_parser
from probmoe.experiments.run_config import AnalyzeConfig, EvalConfig, TrainConfig

COMMANDS = [(train, TrainConfig), (evaluate, EvalConfig), (analyze, AnalyzeConfig)]


def parse(command, config_cls, argv):
    return config_parser.parse(config_cls, command.parser(), argv)


def error(capsys, command, config_cls, argv) -> str:
    with pytest.raises(SystemExit) as e:
        parse(command, config_cls, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    return line


@pytest.mark.parametrize("command,config_cls", COMMANDS)
def test_every_field_is_a_flag_with_help_and_the_defaults_are_the_fields(command, config_cls):
    actions = {a.dest: a for a in command.parser()._actions if a.dest not in ("help", "config")}
    assert set(actions) == {leaf.name for leaf in config_parser.leaves(config_cls)}
    assert all(a.help for a in actions.values())
    required = [leaf for leaf in config_parser.leaves(config_cls) if leaf.field.metadata.get("required")]
    argv = [arg for leaf in required for arg in (f"--{leaf.name.replace('_', '-')}", "x")]
    given = {leaf.name: ["x"] if leaf.field.metadata.get("append") else "x" for leaf in required}
    expected = config_parser.build(config_cls, given)
    assert parse(command, config_cls, argv) == expected


def test_flags_keep_their_names_defaults_and_messages(capsys):
    cfg = parse(train, TrainConfig, ["--model", "tiny-olmoe", "--max-steps", "5", "--no-progress", "--balance", "none"])
    assert (
        cfg.optim.max_steps,
        cfg.optim.epochs,
        cfg.run.progress,
        cfg.routing.balance,
        cfg.optim.lr,
        cfg.optim.batch_size,
    ) == (
        5,
        None,
        False,
        None,
        1e-3,
        8,
    )
    assert parse(train, TrainConfig, ["--model", "m"]).optim.epochs == 1.0  # neither: one epoch
    assert parse(train, TrainConfig, ["--model", "m", "--balance", "aux-free"]).routing.balance == "aux-free"
    assert "argument --max-steps: must be an integer >= 1 (finite), got 0" in error(
        capsys, train, TrainConfig, ["--model", "m", "--max-steps", "0"]
    )
    assert "not allowed with argument" in error(
        capsys, train, TrainConfig, ["--model", "m", "--max-steps", "1", "--epochs", "2"]
    )
    assert "the following arguments are required: --model" in error(capsys, train, TrainConfig, [])
    assert "required: --checkpoint, --data, --output" in error(capsys, analyze, AnalyzeConfig, [])
    assert "invalid choice: 'nope'" in error(capsys, evaluate, EvalConfig, ["--checkpoint", "c", "--method", "nope"])


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_config_file_sets_options_and_flags_override_it(tmp_path, suffix):
    path = tmp_path / f"run{suffix}"
    if suffix == ".yaml":
        path.write_text(
            "model: tiny-qwen2-moe\nmax-steps: 7\nlr: 3.0e-4\nno_progress: true\nbf16: true\n"
            "lr_schedule: cosine\nbalance: aux-free\n"
        )
    else:
        path.write_text(
            'model = "tiny-qwen2-moe"\nmax-steps = 7\nlr = 3.0e-4\nno_progress = true\nbf16 = true\n'
            'lr_schedule = "cosine"\nbalance = "aux-free"\n'
        )
    cfg = parse(train, TrainConfig, ["--config", str(path)])
    assert (
        cfg.model.name,
        cfg.optim.max_steps,
        cfg.optim.lr,
        cfg.run.progress,
        cfg.run.bf16,
        cfg.optim.lr_schedule,
        cfg.routing.balance,
    ) == (
        "tiny-qwen2-moe",
        7,
        3e-4,
        False,
        True,
        "cosine",
        "aux-free",
    )
    cfg = parse(train, TrainConfig, ["--config", str(path), "--lr", "1e-2", "--epochs", "2", "--balance", "none"])
    assert (cfg.optim.lr, cfg.optim.max_steps, cfg.optim.epochs, cfg.routing.balance, cfg.model.name) == (
        1e-2,
        None,
        2.0,
        None,
        "tiny-qwen2-moe",
    )


def test_config_file_lists_for_repeatable_flags(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("checkpoint: [runs/a, runs/b]\ndata: test.jsonl\noutput: out\nlimit: 8\n")
    cfg = parse(analyze, AnalyzeConfig, ["--config", str(path)])
    assert (cfg.checkpoint, cfg.data, cfg.limit) == (["runs/a", "runs/b"], ["test.jsonl"], 8)
    assert parse(analyze, AnalyzeConfig, ["--config", str(path), "--checkpoint", "c"]).checkpoint == ["c"]


@pytest.mark.parametrize(
    "text,message",
    [
        ("model: m\nmax_step: 3\n", "unknown key 'max_step'; did you mean 'max-steps'?"),
        ("model: m\nlearning-rate: 3\n", "unknown key 'learning-rate'"),
        ("model: m\nmax-steps: 0\n", "max-steps: must be an integer >= 1 (finite), got 0"),
        ("model: m\nmax-steps: two\n", "max-steps: must be an integer >= 1, got 'two'"),
        (
            "model: m\nlr-schedule: cosin\n",
            "lr-schedule: invalid choice 'cosin' (choose from constant, linear, cosine)",
        ),
        ("model: m\nbf16: 1\n", "bf16: must be true or false, got 1"),
        ("model: m\nlr: null\n", "lr: must be set"),
        ("model: m\nmax-steps: 2\nepochs: 1\n", "max-steps and epochs cannot both be set"),
        ("model: m\nmax-steps: 2\nmax_steps: 3\n", "'max_steps' is set twice"),
        ("- model\n", "must hold a mapping of option names to values, got a list"),
        ("model: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_config_files_get_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    line = error(capsys, train, TrainConfig, ["--config", str(path)])
    assert message in line and str(path) in line


def test_config_file_names_and_suffixes(tmp_path, capsys):
    assert "must end in .yaml, .yml, .toml" in error(capsys, train, TrainConfig, ["--config", str(tmp_path / "a.json")])
    assert "no such file" in error(capsys, train, TrainConfig, ["--config", str(tmp_path / "a.yaml")])
    (tmp_path / "b.toml").write_text("model = \n")
    assert "not valid TOML" in error(capsys, train, TrainConfig, ["--config", str(tmp_path / "b.toml")])


@pytest.mark.parametrize("command,config_cls", COMMANDS)
def test_written_config_reads_back(tmp_path, command, config_cls):
    required = {
        TrainConfig: [
            "--model",
            "tiny-olmoe",
            "--max-steps",
            "3",
            "--no-progress",
            "--lr",
            "0.0025",
            "--balance",
            "aux-free",
        ],
        EvalConfig: ["--checkpoint", "c", "--tasks", "mmlu", "--num-fewshot", "0", "--dtype", "bfloat16"],
        AnalyzeConfig: ["--checkpoint", "a", "--checkpoint", "n=b", "--data", "d", "--output", "o"],
    }
    cfg = parse(command, config_cls, required[config_cls])
    config_parser.write(cfg, str(tmp_path / "config.yaml"))
    assert parse(command, config_cls, ["--config", str(tmp_path / "config.yaml")]) == cfg


def test_run_folder_config_resumes_and_a_changed_option_is_named(tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+{i}?", "answer": f"{2 * i}"}) + "\n" for i in range(4)))
    out = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(
        f'model = "tiny-olmoe"\ndata = "{data}"\noutput-dir = "{out}"\nmax-steps = 2\nbatch-size = 2\n'
        "no-progress = true\nstop-after = 1\n"
    )
    assert train.main(["--config", str(config)]) == 0
    saved = out / "config.yaml"
    assert parse(train, TrainConfig, ["--config", str(saved)]) == parse(train, TrainConfig, ["--config", str(config)])
    with pytest.raises(SystemExit) as e:
        train.main(["--config", str(saved), "--resume", "latest", "--stop-after", "2", "--lr", "0.002"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "lr: checkpoint 0.001, now 0.002" in err and "Traceback" not in err
    assert train.main(["--config", str(saved), "--resume", "latest", "--stop-after", "2"]) == 0
    assert "resumed from" in capsys.readouterr().err and (out / "model.safetensors").is_file()
    assert parse(train, TrainConfig, ["--config", str(saved)]).run.resume == "latest"  # the last command's options


def test_model_help_lists_every_built_in_model():
    from probmoe.experiments.models import BUILT_IN

    (model,) = [a for a in train.parser()._actions if a.dest == "model"]
    assert all(name in model.help for name in BUILT_IN) and "local checkpoint directory" in model.help


@pytest.mark.parametrize("command,config_cls", COMMANDS)
@pytest.mark.parametrize("argv", [["--no-such-flag"], ["--batch-size", "0"], ["--device", "tpu"]])
def test_an_error_is_one_line_with_a_pointer_to_help_and_no_usage_block(capsys, command, config_cls, argv):
    with pytest.raises(SystemExit) as e:
        parse(command, config_cls, argv)
    err = capsys.readouterr().err
    prog = command.parser().prog
    assert e.value.code == 2
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith(f"{prog}: error: ") and err.endswith(f"(see {prog} --help)\n")
