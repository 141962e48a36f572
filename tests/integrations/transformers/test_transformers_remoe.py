"""ReMoE's L1 penalty against the official code (thu-ml/ReMoE, Megatron-LM based, commit c9d3f794),
transcribed below, under the settings users train with: the router gradient the penalty adds
(the gradient with λ minus the same run's with λ = 0) equals the official code's, Megatron's
loss-scale / num_microbatches factor included, to rounding, in every setting: a hand-written
gradient-accumulation loop, transformers.Trainer's gradient accumulation (fp32 and fp16 with its
GradScaler), accelerate's, probmoe-train's, fp16 with torch.amp.GradScaler, bf16 autocast, and
(slow) DDP and FSDP2 over 2 gloo processes. Also: λ per layer by default, the paper's λ/L as
``l1_layers="mean"``, and the λ update at S = Q."""

import os

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.controls import attach, remoe_penalties
from probmoe.integrations.transformers.model import patched_gates
from probmoe.integrations.transformers.remoe import update_coefficient
from probmoe.integrations.transformers.testing import tiny_model

K, N = 2, 8  # the tiny OLMoE's top-k and experts
LAMBDA = 1.0  # large enough that the penalty's router gradient dominates the language model's


# -- the official code, transcribed ------------------------------------------------------------


def switch_load_balancing_loss_func(probs, tokens_per_expert, topk, moe_aux_loss_coeff):
    """megatron/core/transformer/moe/moe_utils.py (no sequence partition group)."""
    num_tokens = probs.shape[0]
    num_experts = probs.shape[1]
    aggregated_probs_per_expert = probs.sum(dim=0)
    aux_loss = torch.sum(aggregated_probs_per_expert * tokens_per_expert) * (
        num_experts * moe_aux_loss_coeff / (num_tokens * num_tokens * topk)
    )
    return aux_loss


class MoEAuxLossAutoScaler(torch.autograd.Function):
    """moe_utils.py: the aux loss's gradient, scaled by ``main_loss_backward_scale``."""

    main_loss_backward_scale: torch.Tensor = torch.tensor(1.0)

    @staticmethod
    def forward(ctx, output, aux_loss):
        ctx.save_for_backward(aux_loss)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (aux_loss,) = ctx.saved_tensors
        scaled_aux_loss_grad = torch.ones_like(aux_loss) * MoEAuxLossAutoScaler.main_loss_backward_scale
        return grad_output, scaled_aux_loss_grad

    @staticmethod
    def set_loss_scale(scale):
        MoEAuxLossAutoScaler.main_loss_backward_scale = scale


def l1_reg_load_balancing(logits, topk, l1_reg_coeff):
    """router.py ``ReLURouter.l1_reg_load_balancing`` + ``apply_l1_reg`` (training, grad enabled):
    probs [T, N] with the L1 penalty attached."""
    probs = torch.relu(logits)
    routing_map = probs > 0
    num_local_tokens_per_expert = routing_map.sum(dim=0)
    l1_reg = switch_load_balancing_loss_func(probs, num_local_tokens_per_expert, topk, l1_reg_coeff)
    return MoEAuxLossAutoScaler.apply(probs, l1_reg)


def official_penalty_grad(
    model, micro_batches, coeff=LAMBDA, num_microbatches=None, loss_scale=1.0, layers_mean=False, autocast=None
):
    """The router weights' gradient [L, N, D] from the official penalty over ``micro_batches``:
    for each, ``schedules.py`` sets the scale loss_scale / num_microbatches, each layer's router
    applies λ (λ/L: the paper's mean), and a backward pass with zero main-loss gradient leaves
    only the penalties' (the model's routing is ReLU in eval as in training; eval keeps our own
    penalty off). fp32, or the forward under ``autocast`` (a dtype) as the run compared."""
    num_microbatches = num_microbatches or len(micro_batches)
    gates = patched_gates(model)
    weights = [g.weight for g in gates]
    was_training = model.training
    model.eval()
    total = [torch.zeros_like(w) for w in weights]
    coeff = coeff / len(gates) if layers_mean else coeff
    for ids in micro_batches:
        captured = []
        handles = [g.register_forward_hook(lambda m, a, out: captured.append(out[0])) for g in gates]
        try:
            with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
                model(**ids) if isinstance(ids, dict) else model(ids)
        finally:
            for h in handles:
                h.remove()
        MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(loss_scale / num_microbatches))
        probs = [l1_reg_load_balancing(logits.float(), K, coeff) for logits in captured]
        main = sum((p * 0).sum() for p in probs)  # the main loss's gradient is left out: only the penalties'
        for t, g in zip(total, torch.autograd.grad(main, weights)):
            t += g
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    model.train(was_training)
    return torch.stack(total)


def update_l1_coeff(coeff, moe_relu_sparsity, num_layers, num_microbatches, topk, num_experts, multiplier):
    """training.py 1493-1506 (one data-parallel rank, one pipeline stage)."""
    moe_relu_sparsity = moe_relu_sparsity / (num_layers * num_microbatches)
    target_sparsity = 1 - topk / num_experts
    if moe_relu_sparsity < target_sparsity:
        coeff *= multiplier
    else:
        coeff /= multiplier
    return coeff


# -- helpers -------------------------------------------------------------------------------------


def remoe_model(seed=0, **kwargs):
    return pt.patch_model(tiny_model("olmoe", seed=seed), "remoe", l1_coef=LAMBDA, **kwargs).train()


def micro_batches(count=2, rows=2, length=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (rows, length), generator=g) for _ in range(count)]


def router_grads(model) -> torch.Tensor:
    return torch.stack([g.weight.grad.detach().float().cpu().clone() for g in patched_gates(model)])


def set_coef(model, value):
    for g in patched_gates(model):
        g.probmoe_remoe[0] = value


def penalty_grad(run, model_factory):
    """The router gradient ``run(model)`` leaves with λ minus the one with λ = 0 (same seeds)."""
    grads = []
    for coef in (LAMBDA, 0.0):
        model = model_factory()
        set_coef(model, coef)
        torch.manual_seed(0)
        grads.append(run(model))
    return grads[0] - grads[1]


def assert_close_rel(got, want, rel):
    err = float((got - want).abs().max()) / float(want.abs().max())
    print(f"relative error {err:.2e} (allowed {rel:.0e})")
    assert err <= rel, f"max error {err:.2e} of the largest entry (allowed {rel:.0e})"
    return err


# -- per layer, the paper's mean, the λ update ---------------------------------------------------


@pytest.mark.parametrize("layers", ["sum", "mean"])
def test_one_batch_equals_the_official_code(layers):
    """One batch, the model's own loss: λ per layer (official, default) or λ/L (``"mean"``)."""
    ids = micro_batches(1)[0]

    def run(model):
        model(ids, labels=ids).loss.backward()
        return router_grads(model)

    kwargs = {} if layers == "sum" else {"l1_layers": "mean"}
    got = penalty_grad(run, lambda: remoe_model(**kwargs))
    want = official_penalty_grad(remoe_model(), [ids], layers_mean=layers == "mean")
    assert_close_rel(got, want, 1e-5)
    assert remoe_model(**kwargs).probmoe_plan.options.l1_layers == layers


def test_l1_layers_default_follows_the_official_code_and_is_checked():
    assert remoe_model().probmoe_plan.options.l1_layers == "sum"
    with pytest.raises(ValueError, match="l1_layers must be one of 'sum', 'mean'"):
        remoe_model(l1_layers="avg")
    with pytest.raises(ValueError, match="apply only to method 'remoe'"):
        pt.patch_model(tiny_model("olmoe"), "probmoe", l1_layers="mean")


def test_old_settings_file_without_l1_layers_reads_as_the_mean_it_trained_with(tmp_path):
    import json

    from probmoe.integrations import settings_file

    data = {
        "format": settings_file.FORMAT,
        "version": 2,
        "model_type": "olmoe",
        "num_experts": 8,
        "top_k": 2,
        "method": "remoe",
        "aux_loss": 0.0,
        "z_loss": 0.0,
        "routing": None,
    }
    for options, layers in [({"l1_coef": 1e-8, "l1_rate": 1.2}, "mean"), ({"l1_layers": "sum"}, "sum")]:
        data["options"] = options
        data["sha256"] = settings_file.digest(data)
        (tmp_path / settings_file.FILENAME).write_text(json.dumps(data))
        assert settings_file.read(tmp_path)["options"].l1_layers == layers


@pytest.mark.parametrize("sparsity", [0.5, 0.75, 0.9])
def test_coefficient_update_equals_the_official_rule(sparsity):
    """S < Q: λ · α; S ≥ Q (S = Q included): λ / α, as training.py (Q = 1 − 2/8 = 0.75)."""
    layers, micro = 2, 3
    states = [torch.tensor([1e-3, sparsity * micro, float(micro)]) for _ in range(layers)]
    update_coefficient(states, 1 - K / N, 1.2)
    want = update_l1_coeff(1e-3, sparsity * layers * micro, layers, micro, K, N, 1.2)
    assert all(float(s[0]) == pytest.approx(want, rel=1e-6) for s in states)


# -- gradient accumulation, GradScaler, bf16: one process ---------------------------------------


def test_gradient_accumulation_hand_loop():
    """loss / G per micro-batch (the model's own loss): the penalty's gradient is the official
    code's with loss scale 1/G, not G times it."""
    batches = micro_batches(3)  # 3, not L = 2: the old λ/L at scale 1 would equal λ/G

    def run(model):
        for ids in batches:
            (model(ids, labels=ids).loss / len(batches)).backward()
        return router_grads(model)

    got = penalty_grad(run, remoe_model)
    assert_close_rel(got, official_penalty_grad(remoe_model(), batches), 1e-5)


def test_accumulation_equals_one_large_batch_where_micro_batches_route_alike():
    """3 micro-batches that route alike (copies of one) accumulate to the penalty gradient of the
    one large batch of all their tokens in fp32 (where they differ, each counts c_i over its own
    tokens, as Megatron's: test_gradient_accumulation_hand_loop)."""
    ids = micro_batches(1)[0]

    def accumulated(model):
        for _ in range(3):
            (model(ids, labels=ids).loss / 3).backward()
        return router_grads(model)

    def large(model):
        big = ids.repeat(3, 1)
        model(big, labels=big).loss.backward()
        return router_grads(model)

    assert_close_rel(penalty_grad(accumulated, remoe_model), penalty_grad(large, remoe_model), 1e-5)


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing(reentrant):
    """Gradient checkpointing: non-reentrant (transformers 5.x's default) recomputes as the forward
    did, so the penalty stays on the loss (1/G); reentrant runs the first pass without grad, so only
    the recomputation (inside the backward, no loss to ride on) has the penalty: scale 1 per
    micro-batch (documented)."""
    batches = micro_batches(3)

    def make():
        model = remoe_model()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        return model

    def run(model):
        for ids in batches:
            (model(ids, labels=ids).loss / len(batches)).backward()
        return router_grads(model)

    got = penalty_grad(run, make)
    want = official_penalty_grad(remoe_model(), batches, num_microbatches=1 if reentrant else None)
    assert_close_rel(got, want, 1e-5)


def test_own_loss_with_remoe_penalties_as_probmoe_train():
    """A loop computing its own loss from the logits (no labels to the model) puts the penalties on
    it with ``remoe_penalties`` and ``attach``."""
    batches = micro_batches(3)  # 3, not L = 2: the old λ/L at scale 1 would equal λ/G

    def run(model):
        for ids in batches:
            with remoe_penalties(model) as penalties:
                logits = model(ids).logits
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
            )
            attach(loss / len(batches), penalties, 1 / len(batches)).backward()
        return router_grads(model)

    got = penalty_grad(run, remoe_model)
    assert_close_rel(got, official_penalty_grad(remoe_model(), batches), 1e-5)


def test_without_a_loss_the_penalty_keeps_megatrons_default_scale():
    """No labels, no remoe_penalties: the penalty enters the gates' gradient at scale 1, whatever
    the loss is multiplied by (documented)."""
    ids = micro_batches(1)[0]

    def run(model):
        (model(ids).logits.float().square().mean() * 1e-3).backward()
        return router_grads(model)

    got = penalty_grad(run, remoe_model)
    assert_close_rel(got, official_penalty_grad(remoe_model(), [ids]), 1e-5)


def test_fp16_grad_scaler():
    """autocast fp16 with torch.amp.GradScaler("cpu"): the penalty is scaled with the loss, so after
    unscale_ it is the official gradient (Megatron: loss_scale / num_microbatches, then unscaled)."""
    batches = micro_batches(3)  # 3, not L = 2: the old λ/L at scale 1 would equal λ/G

    def run(model):
        # 2^8, not GradScaler's 2^16: router gradients of about 1 overflow fp16 (65504) at 2^16, where a
        # real run would skip the step and lower the scale; the penalty unscaled would still be 256x off
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        for ids in batches:
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(ids, labels=ids).loss / len(batches)
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        return router_grads(model)

    got = penalty_grad(run, remoe_model)
    want = official_penalty_grad(remoe_model(), batches, autocast=torch.float16)  # the same fp16 forward
    assert_close_rel(got, want, 2e-3)  # the logits' gradient is fp16 (11 bits)
    assert_close_rel(got, official_penalty_grad(remoe_model(), batches), 2e-2)  # and the fp32 run's


def test_bf16_autocast():
    batches = micro_batches(3)  # 3, not L = 2: the old λ/L at scale 1 would equal λ/G

    def run(model):
        for ids in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(ids, labels=ids).loss / len(batches)
            loss.backward()
        return router_grads(model)

    got = penalty_grad(run, remoe_model)
    want = official_penalty_grad(remoe_model(), batches, autocast=torch.bfloat16)  # the same bf16 forward
    assert_close_rel(got, want, 1e-2)  # the logits' gradient is bf16 (8 bits)
    assert_close_rel(got, official_penalty_grad(remoe_model(), batches), 1e-1)  # and the fp32 run's, to bf16's reach


def test_accelerate_gradient_accumulation():
    accelerate = pytest.importorskip("accelerate")
    batches = micro_batches(3)  # 3, not L = 2: the old λ/L at scale 1 would equal λ/G

    def run(model):
        accelerator = accelerate.Accelerator(gradient_accumulation_steps=3, cpu=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        wrapped, opt = accelerator.prepare(model, opt)
        for ids in batches:
            with accelerator.accumulate(wrapped):
                accelerator.backward(wrapped(ids, labels=ids).loss)
                if accelerator.sync_gradients:
                    grads = router_grads(model)
        accelerate.state.AcceleratorState._reset_state(True)
        return grads

    got = penalty_grad(run, remoe_model)
    assert_close_rel(got, official_penalty_grad(remoe_model(), batches), 1e-5)


@pytest.mark.parametrize("fp16", [False, True])
def test_trainer_gradient_accumulation(fp16, tmp_path):
    """transformers.Trainer, gradient_accumulation_steps=3 (its loss normalised by
    num_items_in_batch, so not divided by 3), fp32, or fp16=True with its GradScaler (on a GPU:
    accelerate runs fp16=True on the CPU without autocast or scaler, so there it is skipped): the
    router gradient it steps with (read before the optimizer step, divided by the scaler's scale)
    has the official penalty's."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    cuda = torch.cuda.is_available()
    rows = torch.cat(micro_batches(3))
    data = datasets.Dataset.from_dict({"input_ids": rows.tolist(), "labels": rows.tolist()})
    seen, grads = [], []

    class Grab(TrainerCallback):
        trainer = None

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            scaler = self.trainer.accelerator.scaler
            grads.append(router_grads(model).cpu() / (float(scaler.get_scale()) if scaler is not None else 1.0))

    def run(model):
        handle = model.register_forward_pre_hook(
            lambda m, a, kw: seen.append(kw["input_ids"].cpu().clone()), with_kwargs=True
        )
        args = TrainingArguments(
            output_dir=str(tmp_path / "run"),
            max_steps=1,
            gradient_accumulation_steps=3,
            per_device_train_batch_size=2,
            report_to=[],
            use_cpu=not cuda,
            disable_tqdm=True,
            seed=0,
            learning_rate=0.0,
            max_grad_norm=0.0,
            save_strategy="no",
            fp16=fp16,
        )
        grab = Grab()
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[grab])
        if fp16 and trainer.accelerator.scaler is None:
            pytest.skip("accelerate runs fp16=True without autocast or GradScaler on the CPU")
        grab.trainer = trainer
        trainer.train()
        handle.remove()
        return grads[-1]

    got = penalty_grad(run, lambda: remoe_model().to("cuda" if cuda else "cpu"))
    batches = seen[-3:]
    assert len(batches) == 3 and not torch.equal(batches[0], batches[1])
    want = official_penalty_grad(remoe_model(), batches)
    assert_close_rel(got, want, 2e-2 if fp16 else 1e-5 if not cuda else 1e-4)


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_probmoe_train_gradient_accumulation(tmp_path, monkeypatch):
    """probmoe-train --grad-accum 3 (its own answer-token loss): the router gradient of its step has
    the official penalty's with loss scale 1/3 (the λ run minus a λ = 1e-30 run)."""
    import copy

    from gsm8k_data import write

    from probmoe.cli import train
    from probmoe.experiments import trainer as trainer_mod

    data = write(tmp_path, "train.jsonl", 6)
    original = trainer_mod.Trainer._train_step
    seen = {}

    def spy(self, batches):
        seen["model"] = copy.deepcopy(self.net)
        seen["batches"] = [{"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]} for b in batches]
        step = self.optimizer.step

        def grab(*args, **kwargs):
            seen.setdefault("grads", []).append(router_grads(self.net))
            return step(*args, **kwargs)

        self.optimizer.step = grab
        try:
            return original(self, batches)
        finally:
            del self.optimizer.step

    monkeypatch.setattr(trainer_mod.Trainer, "_train_step", spy)
    for name, coef in (("on", LAMBDA), ("off", 1e-30)):
        assert (
            train.main(
                [
                    "--model",
                    "tiny-olmoe",
                    "--data",
                    str(data),
                    "--output-dir",
                    str(tmp_path / name),
                    "--batch-size",
                    "2",
                    "--grad-accum",
                    "3",
                    "--max-steps",
                    "1",
                    "--max-grad-norm",
                    "0",
                    "--method",
                    "remoe",
                    "--l1-coef",
                    str(coef),
                    "--no-progress",
                ]
            )
            == 0
        )
    got = seen["grads"][0] - seen["grads"][1]
    assert len(seen["batches"]) == 3
    assert_close_rel(got, official_penalty_grad(seen["model"], seen["batches"]), 1e-5)


# -- DDP and FSDP2: 2 gloo processes (slow) --------------------------------------------------------


def _distributed_rank(rank, port, out, mode):
    """One of 2 gloo ranks: the model's own loss on this rank's micro-batch under DDP or FSDP2
    (fully_shard per decoder layer and the whole), with λ and with λ = 0; saves the full router
    gradients (averaged over the ranks by the wrapper)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        ids = micro_batches(2)[rank]
        grads = []
        for coef in (LAMBDA, 0.0):
            model = remoe_model()
            set_coef(model, coef)
            if mode == "ddp":
                wrapped = torch.nn.parallel.DistributedDataParallel(model)
            else:
                from torch.distributed.fsdp import fully_shard

                for layer in model.model.layers:
                    fully_shard(layer)
                wrapped = fully_shard(model)
            wrapped(ids, labels=ids).loss.backward()
            full = [
                g.weight.grad.full_tensor() if hasattr(g.weight.grad, "full_tensor") else g.weight.grad
                for g in patched_gates(model)
            ]
            grads.append(torch.stack([g.detach().float().clone() for g in full]))
        torch.save(grads[0] - grads[1], os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_distributed(mode, tmp_path):
    """DDP / FSDP2 over 2 gloo ranks, one micro-batch each: both ranks step with the official
    penalty's gradient, Megatron's data-parallel average of the ranks' penalties."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_distributed_rank, args=(port, str(tmp_path), mode), nprocs=2)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    want = official_penalty_grad(remoe_model(), micro_batches(2))  # (∇P_0 + ∇P_1) / 2
    for g in got:
        assert_close_rel(g, want, 1e-5)


TRAINER_DDP_SCRIPT = """
import sys, torch, datasets
from transformers import Trainer, TrainerCallback, TrainingArguments
import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.model import patched_gates
from probmoe.integrations.transformers.testing import tiny_model

out, rows = sys.argv[1], torch.load(sys.argv[2])
data = datasets.Dataset.from_dict({"input_ids": rows.tolist(), "labels": rows.tolist()})
grads, seen = [], []

class Grab(TrainerCallback):
    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads.append(torch.stack([g.weight.grad.detach().clone() for g in patched_gates(model)]))

for coef in (1.0, 0.0):
    model = pt.patch_model(tiny_model("olmoe", seed=0), "remoe", l1_coef=1.0)
    for g in patched_gates(model):
        g.probmoe_remoe[0] = coef
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].clone()), with_kwargs=True)
    args = TrainingArguments(output_dir=out + "/run", max_steps=1, gradient_accumulation_steps=2,
                             per_device_train_batch_size=2, report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
                             learning_rate=0.0, max_grad_norm=0.0, save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Grab()])
    trainer.train()
rank = torch.distributed.get_rank()
torch.save({"grad": grads[0] - grads[1], "batches": seen[-2:], "first": seen[:2]}, f"{out}/rank{rank}.pt")
"""


@pytest.mark.slow
def test_trainer_ddp_gradient_accumulation(tmp_path):
    """transformers.Trainer under torchrun (2 gloo processes, DDP), 2 micro-batches each:
    num_items_in_batch counts the label tokens of all processes and the Trainer multiplies the loss
    by 2; the penalty follows the loss, so both ranks step with Megatron's (1/(G·W)) Σ of the 4
    micro-batches' penalties. (torchrun, not `accelerate launch`: accelerate 1.15 launches a
    MULTI_CPU config as one plain process unless mpirun is used.)"""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("accelerate")
    pytest.importorskip("datasets")
    root = Path(__file__).resolve().parents[3]
    (tmp_path / "run.py").write_text(TRAINER_DDP_SCRIPT)
    torch.save(torch.cat(micro_batches(4)), tmp_path / "rows.pt")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        str(tmp_path / "run.py"),
        str(tmp_path),
        str(tmp_path / "rows.pt"),
    ]
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    done = subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all((tmp_path / f"rank{r}.pt").exists() for r in range(2)), done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    batches = [b for r in ranks for b in r["batches"]]
    assert all(torch.equal(a, b) for r in ranks for a, b in zip(r["first"], r["batches"]))  # same data both runs
    assert len({tuple(b.flatten().tolist()) for b in batches}) == 4  # 4 distinct micro-batches
    want = official_penalty_grad(remoe_model(), batches, num_microbatches=4)  # Σ_r Σ_b P / (G·W)
    for r in ranks:
        assert_close_rel(r["grad"], want, 1e-5)
