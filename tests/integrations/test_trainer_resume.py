"""A patched model resumed by transformers.Trainer (and trl's SFTTrainer, and accelerate) ends where
the uninterrupted run ends: 2 steps with a checkpoint after the first, against the second step resumed
from that checkpoint into a model initialised with another seed, every tensor and every routing-state buffer
within 1e-6. Without the workaround (``resume``, ``trainer_resume``) transformers 5.x leaves the
experts as initialised (huggingface/transformers#48805): the last test says when that is fixed."""

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")

import transformers  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

import probmoe.integrations.transformers as pt  # noqa: E402
from probmoe.integrations.transformers import resume, runtime_state  # noqa: E402
from probmoe.integrations.transformers.control_callback import RoutingControlCallback  # noqa: E402
from probmoe.integrations.transformers.testing import tiny_model  # noqa: E402

ARGS = dict(
    max_steps=2,
    save_strategy="steps",
    save_steps=1,
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    seed=0,
    learning_rate=3e-3,
    per_device_train_batch_size=4,
    dataloader_num_workers=0,
    logging_steps=1,
)
STATEFUL = ("defaultmoe", "remoe")  # methods with routing state to resume (and balance="aux-free")


def token_data(rows=16, length=16):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 40, (rows, length), generator=g)
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})


def everything(model) -> dict:
    """Every parameter and persistent buffer, and the routing state (non-persistent buffers)."""
    out = dict(model.state_dict())
    if pt.is_patched(model):
        out.update(runtime_state.state_buffers(model))
    return {name: t.detach().clone() for name, t in out.items()}


def differing(a: dict, b: dict, atol=1e-6) -> list:
    """Names whose tensors differ by more than ``atol``, or, for the routing state (ReMoE's λ starts
    at 1e-8), by more than a relative 1e-6."""
    assert a.keys() == b.keys()
    return [
        name
        for name in a
        if not torch.allclose(a[name].double(), b[name].double(), rtol=0, atol=atol)
        or (
            name.rsplit(".", 1)[-1] in runtime_state.NAMES
            and not torch.allclose(a[name].double(), b[name].double(), rtol=1e-6, atol=0)
        )
    ]


def model_for(family, method, seed, **kwargs):
    model = tiny_model(family, seed=seed)
    if method is not None:
        pt.patch_model(model, method, aux_loss=0.01, generator=None, **kwargs)
        model.config.output_router_logits = True
    return model


def run(family, method, seed, output, resume_from=None, **kwargs):
    model = model_for(family, method, seed, **kwargs)
    callbacks = [RoutingControlCallback()] if method is not None else []
    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=str(output), **ARGS),
        train_dataset=token_data(),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=resume_from)
    return model, trainer


def check_resume(tmp_path, family, method, **kwargs):
    full, _ = run(family, method, 0, tmp_path, **kwargs)
    resumed, trainer = run(family, method, 1, tmp_path / "resumed", tmp_path / "checkpoint-1", **kwargs)
    assert trainer.state.global_step == 2
    want, got = everything(full), everything(resumed)
    assert not differing(want, got), f"{family} {method}: {differing(want, got)} differ from the uninterrupted run"
    if method in STATEFUL or kwargs.get("balance"):  # the routing state moved in training and came back
        state = {
            name: t
            for name, t in want.items()  # DeepSeek-V3 keeps its balance bias in a stock buffer
            if name.rsplit(".", 1)[-1] in runtime_state.NAMES + ("e_score_correction_bias",)
        }
        assert any(bool(t.abs().sum() > 0) for t in state.values()), sorted(state)


AUX_FREE = dict(balance="aux-free")
# in the default run: the families whose checkpoints differ most (OLMoE's fused experts, Qwen3's, DeepSeek-V3's
# expert bias and grouped gate); the others, and every other method, in the slow set
FAMILIES_ONE_METHOD = [(family, "probmoe", {}) for family in ("olmoe", "qwen3_moe", "deepseek_v3")]
# in the default run: the methods whose checkpoints differ (stock routing, dynamic-k's experts, routing state)
STATE_METHODS = [("olmoe", m, {}) for m in ("conventional", "probmoe-dynamic", "defaultmoe", "remoe")]
STATE_METHODS.append(("qwen3_moe", "probmoe", AUX_FREE))


def every_case():
    for family in pt.ALL_FAMILIES:
        grouped = family in pt.GROUPED_FAMILIES
        for method in pt.ALL_METHODS:
            if (method in pt.GROUPED_METHODS and not grouped) or (grouped and method in ("sparsemixer", "remoe")):
                continue
            yield family, method, {}
            if method not in ("sparsemixer", "remoe"):
                yield family, method, AUX_FREE


REST = [case for case in every_case() if case not in FAMILIES_ONE_METHOD + STATE_METHODS]


def case_id(case):
    return "-".join([case[0], case[1]] + list(case[2].values()))


@pytest.mark.parametrize(
    "family,method,kwargs", FAMILIES_ONE_METHOD + STATE_METHODS, ids=map(case_id, FAMILIES_ONE_METHOD + STATE_METHODS)
)
def test_trainer_resume_is_exact(tmp_path, family, method, kwargs):
    check_resume(tmp_path, family, method, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("family,method,kwargs", REST, ids=map(case_id, REST))
def test_trainer_resume_is_exact_for_every_family_and_method(tmp_path, family, method, kwargs):
    check_resume(tmp_path, family, method, **kwargs)


def saved_checkpoint(tmp_path, family="olmoe", method="defaultmoe", **kwargs):
    """A patched model with random routing state, saved with save_pretrained (per-expert keys)."""
    model = model_for(family, method, 0, **kwargs)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for buf in runtime_state.state_buffers(model).values():
            buf.copy_(torch.rand(buf.shape, generator=g))
    model.save_pretrained(tmp_path / "saved")
    return model, tmp_path / "saved"


def test_load_state_dict_takes_the_saved_layout_whole_and_sharded(tmp_path):
    """save_pretrained's keys differ from the model's (the bug's cause); a patched model's
    load_state_dict takes them, whole or shard by shard (load_sharded_checkpoint, Trainer's path
    for sharded checkpoints) with a layer's gate and up projections in different shards."""
    from safetensors.torch import load_file
    from transformers.trainer_utils import load_sharded_checkpoint

    trained = model_for("mixtral", "probmoe", 0)
    trained.save_pretrained(tmp_path / "one")
    saved = load_file(tmp_path / "one" / "model.safetensors")
    assert "model.layers.0.block_sparse_moe.experts.3.w1.weight" in saved
    assert not set(saved) <= set(trained.state_dict())
    fresh = model_for("mixtral", "probmoe", 1)
    result = fresh.load_state_dict(saved, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert not differing(everything(trained), everything(fresh))

    trained.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    index = (tmp_path / "sharded" / "model.safetensors.index.json").read_text()
    import json

    where = json.loads(index)["weight_map"]
    assert (
        where["model.layers.0.block_sparse_moe.experts.0.w1.weight"]
        != where["model.layers.0.block_sparse_moe.experts.0.w3.weight"]
    )  # gate_up_proj from two shards
    fresh = model_for("mixtral", "probmoe", 1)
    load_sharded_checkpoint(fresh, tmp_path / "sharded", strict=False)
    assert not differing(everything(trained), everything(fresh))


def test_a_state_dict_in_the_model_layout_passes_unchanged(tmp_path):
    model = model_for("olmoe", "probmoe", 0)
    state = model.state_dict()
    assert resume.to_model_layout(model, state) is state


def test_nothing_is_converted_from_the_release_that_fixes_the_bug(tmp_path, monkeypatch):
    trained, directory = saved_checkpoint(tmp_path, method="conventional")
    from safetensors.torch import load_file

    saved = load_file(directory / "model.safetensors")
    version = resume.release(transformers.__version__)
    monkeypatch.setattr(resume, "FIXED_IN", version)
    assert not resume.needed(transformers.__version__)
    assert resume.needed(".".join(map(str, version[:1] + (version[1] - 1,))))
    result = model_for("olmoe", "conventional", 1).load_state_dict(saved, strict=False)
    assert "model.layers.0.mlp.experts.gate_up_proj" in result.missing_keys  # transformers' own behaviour


def test_routing_state_warns_without_the_trainer_hook(tmp_path, monkeypatch):
    """model.safetensors lacks the routing state: loading it keeps the model's own, with a warning
    naming the file that holds it (unless a Trainer is about to read that file)."""
    from safetensors.torch import load_file

    trained, directory = saved_checkpoint(tmp_path)
    saved = load_file(directory / "model.safetensors")
    assert not any(runtime_state.is_state_key(key) for key in saved)  # a stock checkpoint
    monkeypatch.setattr(runtime_state, "trainer_reads_state", lambda: False)
    fresh = model_for("olmoe", "defaultmoe", 1)
    before = {name: buf.clone() for name, buf in runtime_state.state_buffers(fresh).items()}
    with pytest.warns(UserWarning, match="probmoe_defaults .* runtime_state.load"):
        result = fresh.load_state_dict(saved, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert all(torch.equal(before[name], buf) for name, buf in runtime_state.state_buffers(fresh).items())
    runtime_state.load(fresh, directory)
    assert not differing(everything(trained), everything(fresh))


def test_the_state_dict_carries_the_routing_state(tmp_path):
    """model.state_dict() holds the routing state (so any whole-model checkpoint keeps it), and
    load_state_dict of it restores it without a warning."""
    import warnings

    trained, _ = saved_checkpoint(tmp_path)
    state = trained.state_dict()
    assert set(runtime_state.state_buffers(trained)) <= set(state)
    fresh = model_for("olmoe", "defaultmoe", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh.load_state_dict(state)
    assert not differing(everything(trained), everything(fresh))


def test_load_best_model_restores_weights_and_routing_state(tmp_path):
    trained, directory = saved_checkpoint(tmp_path)
    fresh = model_for("olmoe", "defaultmoe", 1)
    trainer = Trainer(
        model=fresh, args=TrainingArguments(output_dir=str(tmp_path / "x"), **ARGS), train_dataset=token_data()
    )
    trainer.state.best_model_checkpoint = str(directory)
    trainer._load_best_model()
    assert not differing(everything(trained), everything(fresh))


def test_sft_trainer_resume_is_exact(tmp_path):
    trl = pytest.importorskip("trl")
    from probmoe.experiments.tokenizer import VOCAB_SIZE, byte_tokenizer

    rows = datasets.Dataset.from_list(
        [{"prompt": f"{a}+{b}=", "completion": f"{a + b}."} for a in range(4) for b in range(4)]
    )

    def sft(seed, output, resume_from=None):
        model = pt.patch_model(tiny_model("olmoe", seed=seed, vocab_size=VOCAB_SIZE), "defaultmoe", aux_loss=0.01)
        model.config.output_router_logits = True
        args = trl.SFTConfig(output_dir=str(output), max_length=32, **ARGS)
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=byte_tokenizer())
        trainer.train(resume_from_checkpoint=resume_from)
        del model.forward  # trl's fused LM head on the instance: not a tensor, left out of the comparison
        return model

    full = sft(0, tmp_path)
    resumed = sft(1, tmp_path / "resumed", tmp_path / "checkpoint-1")
    assert not differing(everything(full), everything(resumed))


ACCELERATE_CASES = [
    ("olmoe", "defaultmoe", {}),
    ("olmoe", "remoe", {}),
    ("qwen3_moe", "probmoe", AUX_FREE),
    ("mixtral", "probmoe-dynamic", {}),
]


@pytest.mark.parametrize("family,method,kwargs", ACCELERATE_CASES, ids=map(case_id, ACCELERATE_CASES))
def test_accelerate_save_state_and_load_state_are_exact(tmp_path, family, method, kwargs):
    """accelerate writes model.state_dict() as it is (fused experts: nothing to convert), routing
    state included (persistent buffers): nothing to register."""
    check_accelerate_resume(tmp_path, family, method, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize(
    "family,method,kwargs",
    [c for c in every_case() if c not in ACCELERATE_CASES],
    ids=map(case_id, [c for c in every_case() if c not in ACCELERATE_CASES]),
)
def test_accelerate_resume_is_exact_for_every_family_and_method(tmp_path, family, method, kwargs):
    check_accelerate_resume(tmp_path, family, method, **kwargs)


def check_accelerate_resume(tmp_path, family, method, **kwargs):
    """2 steps uninterrupted = 1 step, save_state, then load_state into a model initialised with
    another seed and the second step (the routing controls after each step, as the callback runs them)."""
    from accelerate import Accelerator

    from probmoe.integrations.transformers import controls

    def steps(model, accelerator, optimizer, batches):
        for x in batches:
            loss = model(x, labels=x).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            controls.after_step(accelerator.unwrap_model(model))

    x = torch.tensor(token_data(8)["input_ids"])
    batches = [x[:4], x[4:]]

    def setup(seed):
        accelerator = Accelerator(cpu=True)
        model = model_for(family, method, seed, **kwargs)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model, optimizer = accelerator.prepare(model, optimizer)
        return accelerator, model, optimizer

    accelerator, full, optimizer = setup(0)
    steps(full, accelerator, optimizer, batches[:1])
    accelerator.save_state(str(tmp_path / "state"))
    steps(full, accelerator, optimizer, batches[1:])
    accelerator, resumed, optimizer = setup(1)
    accelerator.load_state(str(tmp_path / "state"))
    steps(resumed, accelerator, optimizer, batches[1:])
    want, got = everything(full), everything(resumed)
    assert not differing(want, got), f"{family} {method}: {differing(want, got)} differ from the uninterrupted run"
    if method in STATEFUL or kwargs.get("balance"):
        state = {
            name: t
            for name, t in want.items()
            if name.rsplit(".", 1)[-1] in runtime_state.NAMES + ("e_score_correction_bias",)
        }
        assert any(bool(t.abs().sum() > 0) for t in state.values()), sorted(state)


# Each rank: 2 DDP steps (accelerate, gloo) = 1 step, save_state, load_state into a model initialised with
# another seed, the second step; writes its max difference and whether the routing state moved.
ACCELERATE_RANK = """
import json, os, sys, torch
from accelerate import Accelerator
import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers import controls
from probmoe.integrations.transformers.testing import tiny_model
where, rank = sys.argv[1], int(os.environ["RANK"])

def setup(seed):
    accelerator = Accelerator(cpu=True)
    model = pt.patch_model(tiny_model("olmoe", seed=seed), "defaultmoe", aux_loss=0.01)
    model.config.output_router_logits = True
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return (accelerator, *accelerator.prepare(model, optimizer))

def steps(model, accelerator, optimizer, batches):
    for x in batches:
        accelerator.backward(model(x, labels=x).loss)
        optimizer.step()
        optimizer.zero_grad()
        controls.after_step(accelerator.unwrap_model(model))

x = torch.randint(3, 40, (16, 16), generator=torch.Generator().manual_seed(0))[rank::2]
accelerator, full, optimizer = setup(0)
assert type(full).__name__ == "DistributedDataParallel", type(full)
steps(full, accelerator, optimizer, [x[:4]])
accelerator.save_state(os.path.join(where, "state"))
steps(full, accelerator, optimizer, [x[4:]])
accelerator, resumed, optimizer = setup(1)
accelerator.load_state(os.path.join(where, "state"))
steps(resumed, accelerator, optimizer, [x[4:]])
a, b = (accelerator.unwrap_model(m).state_dict() for m in (full, resumed))
moved = [float(a[k].abs().sum()) for k in a if k.endswith("probmoe_defaults")]
with open(os.path.join(where, f"rank{rank}.json"), "w") as f:
    json.dump({"diff": max((a[k] - b[k]).abs().max().item() for k in a), "moved": moved}, f)
"""


@pytest.mark.slow
def test_accelerate_resume_is_exact_with_two_processes(tmp_path):
    """The DDP-wrapped model's load_state_dict (the wrapper's, not the patched model's) restores the
    routing state too: DefaultMoE over 2 gloo ranks under torchrun, bit for bit on both."""
    import json

    from rank_runs import run_ranks

    run_ranks(tmp_path, 2, ACCELERATE_RANK, [])
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["diff"] == 0 and len(result["moved"]) == 2 and min(result["moved"]) > 0, result


def test_upstream_trainer_resume_still_loses_the_experts(tmp_path):
    """The bug the workaround is for, on a stock (unpatched) OLMoE under the installed transformers.
    When this fails, the installed release resumes MoE experts by itself: set resume.FIXED_IN to
    it, and remove resume.py (and this test) once the lowest supported transformers has the fix."""
    trained = tiny_model("olmoe", seed=0)
    trained.save_pretrained(tmp_path / "saved")
    fresh = tiny_model("olmoe", seed=1)
    trainer = Trainer(model=fresh, args=TrainingArguments(output_dir=str(tmp_path / "x"), **ARGS))
    trainer._load_from_checkpoint(str(tmp_path / "saved"))
    lost = differing(everything(trained), everything(fresh))
    assert lost == [name for name in everything(trained) if ".experts." in name], lost
    assert lost, (
        f"transformers {transformers.__version__} resumes the experts itself ({resume.ISSUE} fixed): set "
        f"probmoe/integrations/transformers/resume.py FIXED_IN = {resume.release(transformers.__version__)}"
        " and drop the workaround when the lowest supported release has the fix"
    )
    assert resume.needed(transformers.__version__)


def test_the_recipe_for_unpatched_models(tmp_path):
    """docs/transformers.md's Trainer subclass for a model that is not patched."""
    from probmoe.integrations.transformers.resume import to_model_layout

    class MoETrainer(Trainer):
        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            model = self.model if model is None else model
            load = model.load_state_dict
            model.load_state_dict = lambda state, *a, **k: load(to_model_layout(model, state), *a, **k)
            try:
                super()._load_from_checkpoint(resume_from_checkpoint, model)
            finally:
                del model.load_state_dict

    trained = tiny_model("mixtral", seed=0)
    trained.save_pretrained(tmp_path / "saved")
    fresh = tiny_model("mixtral", seed=1)
    trainer = MoETrainer(model=fresh, args=TrainingArguments(output_dir=str(tmp_path / "x"), **ARGS))
    trainer._load_from_checkpoint(str(tmp_path / "saved"))
    assert not differing(everything(trained), everything(fresh))
    assert "load_state_dict" not in vars(fresh)
