"""probmoe-train --fsdp under torchrun --nproc_per_node 2 (gloo, CPU): FSDP2 takes the same steps as
one process, every rank gathers the same full parameters, ProbMoE's draws are per-rank streams
that repeat, resume is exact, activation checkpointing redraws nothing, and the final model is a
stock transformers checkpoint with its routing."""

import json
import os

import pytest
import torch

pytest.importorskip("transformers")

from gsm8k_data import write
from rank_runs import run_ranks

# Runs probmoe-train on each rank, then saves what the test compares: the full parameters each
# rank gathers (every rank gets all of them), and its routing generator's state.
RANK_SCRIPT = """
import os, sys, torch
from probmoe.cli import train
from probmoe.experiments.trainer import Trainer
original_run = Trainer.run
def run(self):
    record = original_run(self)
    if self.cfg.run.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        full = get_model_state_dict(self.net, options=StateDictOptions(full_state_dict=True))
        local = sum(p.to_local().numel() for p in self.net.parameters())
    else:
        full, local = self.net.state_dict(), sum(p.numel() for p in self.net.parameters())
    torch.save({"params": {k: v.detach().clone() for k, v in full.items()}, "local_numel": local,
                "generator": self.generator.get_state()},
               os.path.join(sys.argv[1], f"rank{self.world.rank}.pt"))
    return record
Trainer.run = run
sys.exit(train.main(sys.argv[2:]))
"""


def launch(where, nproc, argv, torchrun_it=True):
    """Run probmoe-train (2 ranks under torchrun, or 1 plain process); the per-rank dumps."""
    run_ranks(where, nproc, RANK_SCRIPT, argv, torchrun_it=torchrun_it)
    return [torch.load(where / f"rank{r}.pt") for r in range(nproc)]


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def losses(out):
    return [json.loads(line)["loss"] for line in open(out / "train_log.jsonl") if '"loss"' in line]


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_fsdp_matches_one_process_and_saves_a_stock_checkpoint(tmp_path):
    """conventional routing: 2 FSDP ranks × batch 2 take the steps of one process × batch 4."""
    from probmoe.experiments.models import load_model
    from probmoe.integrations.transformers import from_pretrained

    data = write(tmp_path, "train.jsonl", 16)
    args = [
        "--model",
        "tiny-olmoe",
        "--data",
        data,
        "--method",
        "conventional",
        "--max-steps",
        "3",
        "--aux-loss",
        "0",
        "--no-progress",
        "--seed",
        "3",
    ]
    ranks = launch(
        tmp_path / "fsdp",
        2,
        [*args, "--fsdp", "--global-batch-size", "4", "--output-dir", str(tmp_path / "fsdp" / "out")],
    )
    (one,) = launch(
        tmp_path / "one",
        1,
        [*args, "--batch-size", "4", "--output-dir", str(tmp_path / "one" / "out")],
        torchrun_it=False,
    )
    assert max_diff(ranks[0]["params"], ranks[1]["params"]) == 0  # every rank gathers the same model
    total = sum(v.numel() for v in one["params"].values())
    assert ranks[0]["local_numel"] + ranks[1]["local_numel"] <= total + 2 * 64 and ranks[0]["local_numel"] < total
    initial = load_model("tiny-olmoe", seed=3).state_dict()
    moved = max_diff(initial, one["params"])
    diff = max_diff(ranks[0]["params"], one["params"])
    assert diff < 1e-5 and moved > 1e-3, (diff, moved)
    loss_fsdp, loss_one = losses(tmp_path / "fsdp" / "out"), losses(tmp_path / "one" / "out")
    assert len(loss_fsdp) == 3 and max(abs(a - b) for a, b in zip(loss_fsdp, loss_one)) < 1e-5
    # the final model: a stock checkpoint (stock architectures, per-expert keys) with its routing
    out = tmp_path / "fsdp" / "out"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["OlmoeForCausalLM"]
    model = from_pretrained(str(out))
    assert model.probmoe_plan.method == "conventional"
    assert max_diff({k: v for k, v in model.state_dict().items()}, ranks[0]["params"]) == 0
    checkpoint = out / "checkpoint-000003"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(os.listdir(checkpoint))
    assert not (checkpoint / "model.safetensors").exists()  # sharded: no rank wrote the whole model


@pytest.mark.slow
def test_fsdp_probmoe_draws_per_rank_and_repeat(tmp_path):
    """Each rank draws from its own generator stream (different states), and a second run with the
    same seed repeats every draw (identical parameters and generator states); bf16 compute with
    fp32 reduction (MixedPrecisionPolicy) keeps fp32 shards."""
    data = write(tmp_path, "train.jsonl", 16)
    args = [
        "--model",
        "tiny-olmoe",
        "--data",
        data,
        "--method",
        "probmoe",
        "--max-steps",
        "2",
        "--no-progress",
        "--fsdp",
        "--batch-size",
        "2",
        "--bf16",
    ]
    a = launch(tmp_path / "a", 2, [*args, "--output-dir", str(tmp_path / "a" / "out")])
    b = launch(tmp_path / "b", 2, [*args, "--output-dir", str(tmp_path / "b" / "out")])
    assert not torch.equal(a[0]["generator"], a[1]["generator"])
    for r in range(2):
        assert torch.equal(a[r]["generator"], b[r]["generator"])
    assert max_diff(a[0]["params"], b[0]["params"]) == 0
    assert max_diff(a[0]["params"], a[1]["params"]) == 0
    assert all(v.dtype == torch.float32 for v in a[0]["params"].values())


@pytest.mark.slow
def test_fsdp_resume_is_exact_and_checkpointing_redraws_nothing(tmp_path):
    """4 uninterrupted steps = stop after 2, then resume to 4, bit for bit, with sampled Dynamic-k
    routing, gradient accumulation and a decaying LR; activation checkpointing (recomputing every
    layer, routing included) gives the same parameters."""
    from safetensors.torch import load_file

    data = write(tmp_path, "train.jsonl", 16)
    args = [
        "--model",
        "tiny-qwen2-moe",
        "--data",
        data,
        "--method",
        "probmoe-dynamic",
        "--max-steps",
        "4",
        "--batch-size",
        "2",
        "--grad-accum",
        "2",
        "--lr-schedule",
        "linear",
        "--warmup-steps",
        "1",
        "--no-progress",
        "--fsdp",
    ]
    launch(tmp_path / "a", 2, [*args, "--output-dir", str(tmp_path / "a" / "out")])
    launch(tmp_path / "b", 2, [*args, "--output-dir", str(tmp_path / "b" / "out"), "--stop-after", "2"])
    assert not (tmp_path / "b" / "out" / "model.safetensors").exists()
    launch(tmp_path / "b", 2, [*args, "--output-dir", str(tmp_path / "b" / "out"), "--resume", "latest"])
    launch(tmp_path / "c", 2, [*args, "--output-dir", str(tmp_path / "c" / "out"), "--gradient-checkpointing"])
    final = {name: load_file(tmp_path / name / "out" / "model.safetensors") for name in "abc"}
    assert max_diff(final["a"], final["b"]) == 0
    assert max_diff(final["a"], final["c"]) < 1e-6
    assert losses(tmp_path / "a" / "out") == losses(tmp_path / "b" / "out")


@pytest.mark.slow
@pytest.mark.parametrize(
    "method",
    [["--method", "remoe"], ["--method", "probmoe", "--balance", "aux-free"], ["--method", "defaultmoe"]],
    ids=["remoe", "aux-free", "defaultmoe"],
)
def test_fsdp_resume_restores_the_routing_state(tmp_path, method):
    """The routing state (ReMoE's λ, the aux-free bias and loads, DefaultMoE's default outputs) is
    in the model shards: 4 uninterrupted steps = stop after 2, then resume to 4, weights and
    probmoe_state.safetensors bit for bit."""
    from safetensors.torch import load_file

    data = write(tmp_path, "train.jsonl", 16)
    args = [
        "--model",
        "tiny-olmoe",
        "--data",
        data,
        *method,
        "--max-steps",
        "4",
        "--batch-size",
        "2",
        "--no-progress",
        "--fsdp",
    ]
    launch(tmp_path / "a", 2, [*args, "--output-dir", str(tmp_path / "a" / "out")])
    launch(tmp_path / "b", 2, [*args, "--output-dir", str(tmp_path / "b" / "out"), "--stop-after", "2"])
    launch(tmp_path / "b", 2, [*args, "--output-dir", str(tmp_path / "b" / "out"), "--resume", "latest"])
    for name in ("model.safetensors", "probmoe_state.safetensors"):
        a, b = (load_file(tmp_path / run / "out" / name) for run in "ab")
        assert max_diff(a, b) == 0, name
    state = load_file(tmp_path / "a" / "out" / "probmoe_state.safetensors")
    assert any(bool(t.abs().sum() > 0) for t in state.values())  # it moved in training


def strip_routing_state(checkpoint) -> None:
    """Make ``checkpoint`` as FSDP checkpoints were before they kept the routing state: its shards
    rewritten without it (one file), the manifest's checksums updated to match."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    from probmoe.experiments import state
    from probmoe.integrations.transformers import runtime_state

    full = checkpoint.parent / "full.pt"
    dcp_to_torch_save(checkpoint, full)
    saved = torch.load(full, weights_only=False)
    saved.pop("routing")
    saved["model"] = {k: v for k, v in saved["model"].items() if not runtime_state.is_state_key(k)}
    for f in checkpoint.iterdir():
        if f.suffix == ".distcp" or f.name == ".metadata":
            f.unlink()
    torch.save(saved, full)
    torch_save_to_dcp(full, checkpoint)
    manifest = json.loads((checkpoint / state.MANIFEST).read_text())
    manifest["sha256"] = {
        f.name: state.sha256_file(str(f)) for f in sorted(checkpoint.iterdir()) if f.name != state.MANIFEST
    }
    (checkpoint / state.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.slow
def test_fsdp_resumes_a_checkpoint_without_routing_state_with_a_warning(tmp_path):
    """A checkpoint written before FSDP checkpoints kept the routing state resumes (the state from
    its initial values) with one warning saying the resume is not exact, not a failed load."""
    data = write(tmp_path, "train.jsonl", 16)
    out = tmp_path / "run" / "out"
    args = [
        "--model",
        "tiny-olmoe",
        "--data",
        data,
        "--method",
        "remoe",
        "--max-steps",
        "3",
        "--batch-size",
        "2",
        "--no-progress",
        "--fsdp",
        "--output-dir",
        str(out),
    ]
    launch(tmp_path / "run", 2, [*args, "--stop-after", "2"])
    strip_routing_state(out / "checkpoint-000002")
    done = run_ranks(tmp_path / "run", 2, RANK_SCRIPT, [*args, "--resume", "latest"])
    warnings = [line for line in done.stderr.splitlines() if "kept the routing state" in line]
    assert len(warnings) == 1 and "checkpoint-000002" in warnings[0] and "not exact" in warnings[0], done.stderr
    assert "(routing state) are not in the state dict" not in done.stderr
    assert (out / "model.safetensors").exists() and (out / "checkpoint-000003").is_dir()


def test_fsdp_refusals_before_loading(tmp_path, capsys):
    """--fsdp without torchrun, and a global batch the processes do not divide: status 2, one line."""
    from probmoe.cli import train

    data = write(tmp_path, "train.jsonl", 8)
    base = ["--model", "tiny-olmoe", "--data", data, "--output-dir", str(tmp_path / "o"), "--max-steps", "1"]
    env = {k: os.environ.pop(k) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK") if k in os.environ}
    try:
        with pytest.raises(SystemExit) as e:
            train.main([*base, "--fsdp"])
        assert e.value.code == 2 and "start it under torchrun" in capsys.readouterr().err
        with pytest.raises(SystemExit) as e:
            train.main([*base, "--global-batch-size", "3", "--grad-accum", "2"])
        assert e.value.code == 2 and "use a multiple of 2" in capsys.readouterr().err
    finally:
        os.environ.update(env)
    assert not (tmp_path / "o").exists()


SMALL_SHAPE = (
    "olmoe",
    dict(
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_experts=8,
        num_experts_per_tok=2,
        vocab_size=300,
    ),
)


def _meta_build_rank(rank, port, out):
    """One of 2 gloo ranks: fsdp.build of a published-shape model (a small stand-in for the real
    widths, through the same path), recording every full tensor the initialiser produces."""
    import weakref

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from probmoe.experiments import distributed, fsdp, models
    from probmoe.integrations.transformers import patch_model

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank)
    )
    models.SHAPES["small-olmoe-shape"] = SMALL_SHAPE
    world = distributed.setup("cpu")
    calls, alive, most_alive = [], [], [0]
    real = models.initial_tensor

    def spy(model, name, seed):
        value = real(model, name, seed)
        calls.append(name)
        alive.append(weakref.ref(value))
        most_alive[0] = max(most_alive[0], sum(r() is not None for r in alive))
        return value

    models.initial_tensor = spy
    net = fsdp.build(
        "small-olmoe-shape",
        seed=4,
        dtype=torch.float32,
        layers=None,
        world=world,
        patch=lambda m: patch_model(m, "conventional"),
        checkpointing=False,
        bf16=False,
        fresh=True,
    )
    full = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True))
    torch.save(
        {
            "calls": calls,
            "most_alive": most_alive[0],
            "full": full,
            "local": sum(p.to_local().numel() for p in net.parameters()),
        },
        os.path.join(out, f"rank{rank}.pt"),
    )
    distributed.teardown()


@pytest.mark.slow
def test_meta_init_never_puts_the_whole_model_on_a_rank(tmp_path):
    """The shape path under FSDP: rank 1 never sees a full tensor, rank 0 one at a time, each rank
    keeps half the parameters, and the gathered model equals the one-process build of the seed."""
    import socket

    import torch.multiprocessing as mp

    from probmoe.experiments import models

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_meta_build_rank, args=(port, str(tmp_path)), nprocs=2)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    models.SHAPES["small-olmoe-shape"] = SMALL_SHAPE
    try:
        one = models.load_model("small-olmoe-shape", seed=4)
    finally:
        del models.SHAPES["small-olmoe-shape"]
    total = sum(p.numel() for p in one.parameters())
    assert r1["calls"] == [] and sorted(r0["calls"]) == sorted(one.state_dict()) and r0["most_alive"] == 1
    assert r0["local"] < total and r1["local"] < total and r0["local"] + r1["local"] >= total
    assert max_diff(r0["full"], one.state_dict()) == 0 and max_diff(r1["full"], one.state_dict()) == 0


@pytest.mark.slow
def test_fsdp_from_a_checkpoint_directory_in_bf16(tmp_path):
    """--model DIR --fsdp --param-dtype bfloat16: rank 0 loads the checkpoint straight into bf16 and
    scatters it; with a learning rate far below bf16's resolution the final model is the checkpoint,
    rounded to bf16, bit for bit."""
    from safetensors.torch import load_file

    from probmoe.experiments.models import load_model, load_tokenizer

    source = tmp_path / "source"
    load_model("tiny-mixtral", seed=6).save_pretrained(source)
    load_tokenizer("tiny-mixtral").save_pretrained(source)
    data = write(tmp_path, "train.jsonl", 8)
    launch(
        tmp_path / "run",
        2,
        [
            "--model",
            str(source),
            "--data",
            data,
            "--method",
            "conventional",
            "--max-steps",
            "1",
            "--batch-size",
            "2",
            "--lr",
            "1e-30",
            "--no-progress",
            "--fsdp",
            "--param-dtype",
            "bfloat16",
            "--output-dir",
            str(tmp_path / "run" / "out"),
        ],
    )
    saved, final = load_file(source / "model.safetensors"), load_file(tmp_path / "run" / "out" / "model.safetensors")
    assert saved.keys() == final.keys()
    for name, value in final.items():
        assert value.dtype == torch.bfloat16 and torch.equal(value, saved[name].to(torch.bfloat16)), name
