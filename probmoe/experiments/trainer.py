"""The training loop behind ``probmoe-train``: one process or many (torchrun), exact resume.

One optimizer step sees a global batch of ``batch_size × world_size × grad_accum`` examples taken
in the order ``data.epoch_order`` fixes (incomplete last batches of an epoch are dropped). Rank r
takes rows [r·B, (r+1)·B) of each micro-batch. The loss of a step is the mean cross-entropy over
every answer token of the global batch: each rank's micro-batch loss is its token sum divided by
the global token count (summed over ranks before the step) times the world size, because DDP
averages gradients over ranks. So N ranks with batch B take the same steps as one process with
batch N·B, up to float summation order; FSDP (``--fsdp``, ``fsdp``) averages gradients the same
way, so the same holds sharded. Load-balancing and z-losses (coefficients from the
routing plan) are added per micro-batch, averaged over micro-batches and ranks.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from . import (
    config_parser,
    data,
    determinism,
    distributed,
    formats,
    fsdp,
    interrupts,
    memory_plan,
    models,
    run_lock,
    state,
)
from .run_config import TrainConfig


def lr_factor(schedule: str, warmup: int, total: int):
    """The LR multiplier of step s (LambdaLR): linear warm-up over ``warmup`` steps, then constant,
    linear decay to 0 at ``total``, or cosine decay to 0 at ``total``."""

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        if schedule == "constant":
            return 1.0
        frac = min(1.0, (s - warmup) / max(1, total - warmup))
        return 1.0 - frac if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))

    return factor


def answer_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token cross-entropies over the answer tokens, their number):
    logits [B, L, V], labels [B, L] (``data.IGNORE`` off the answer) -> ([], [])."""
    shift_logits, shift_labels = logits[:, :-1].float(), labels[:, 1:]  # position t predicts token t + 1
    total = F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]),
        shift_labels.reshape(-1),
        ignore_index=data.IGNORE,
        reduction="sum",
    )
    return total, (shift_labels != data.IGNORE).sum()


def routing_summary(model, attention_mask: torch.Tensor) -> list[dict]:
    """Per MoE layer, over the real (non-pad) tokens of the last forward: mean experts per token
    (where there is a real token), expert-load coefficient of variation and MaxVio (these two only
    where the layer sent some token to an expert: a ReMoE layer may send none); never NaN."""
    from probmoe.analysis.metrics import load_cv, max_vio
    from probmoe.integrations.transformers import router_stats

    keep = attention_mask.reshape(-1).bool()  # [B·L]
    out = []
    for layer in router_stats(model):
        if layer["selected"] is None:
            continue
        selected = layer["selected"][keep.to(layer["selected"].device)]  # [T, N] bool
        load = selected.sum(dim=0).float()  # [N]
        record = {"layer": layer["layer"]}
        if selected.shape[0]:
            record["experts_per_token"] = selected.sum(dim=-1).float().mean().item()
        if bool(load.sum() > 0):
            record.update(load_cv=load_cv(load), max_vio=max_vio(load))
        out.append(record)
    return out


def fingerprint(cfg: TrainConfig, world, total_steps: int, data_format: str) -> dict:
    """The settings an exact resume must share (``state.RESUME_KEYS``); ``data_format`` is the format
    the records were read in (given or detected: the same file read as another format is other
    examples)."""
    fields = {**config_parser.flat(cfg), "data_format": data_format}
    with open(cfg.data.path, "rb") as f:
        fields["data_sha256"] = hashlib.sha256(f.read()).hexdigest()
    fields.update(
        world_size=world.size,
        device_type=world.device.type,
        schedule_steps=None if cfg.optim.lr_schedule == "constant" else total_steps,
    )
    return {key: fields[key] for key in config_parser.resume_keys(type(cfg)) + state.DERIVED_KEYS}


class Trainer:
    """Set up from a ``TrainConfig``, then ``run()``, then ``close()``. Every check (flags, data,
    output folder, resume checkpoint) runs on every process before any weights load, and the
    processes agree on the outcome before the first collective, so a bad input stops all of them
    with its message. From its first look at the output folder until ``close()`` the run holds it
    (``run_lock``): another run started on it is refused."""

    lock = None  # run_lock.Lock on the output folder (rank 0), from the checks until close()

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.world = distributed.setup(cfg.run.device)
        self.nothing_to_do = None  # why, when the resumed checkpoint is already at the last step
        try:
            self._set_up()
        except BaseException:  # refused or interrupted: let go of the folder (removed if made here, empty)
            self.close()
            raise

    def close(self) -> None:
        """Let go of the output folder (``run_lock.release``); the run writes nothing after this."""
        run_lock.release(self.lock)
        self.lock = None

    def _set_up(self) -> None:
        """The checks and the build (``_check_and_build``), their outcome agreed by every process, then
        the damaged checkpoints set aside and the model wrapped for DDP."""
        error = None
        try:
            self._check_and_build()
        except (ValueError, FileNotFoundError) as e:
            error = e
        distributed.agree(error)
        if self.nothing_to_do is not None:
            return
        self._set_aside_damaged()
        self.model = self.net
        if self.world.size > 1 and not self.cfg.run.fsdp:
            ids = [self.world.local_rank] if self.world.device.type == "cuda" else None
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.net, device_ids=ids, gradient_as_bucket_view=True
            )

    def _check_and_build(self) -> None:
        """Every check, then the model, the optimizer and the resumed state, in this order."""
        self._check_flags()
        self._read_data()
        self._plan_steps()
        if self._check_resume():
            return
        memory_plan.check_fits(self.cfg, self.world)
        self._seed()
        self.net = self._build_model()
        self.plan = self.net.probmoe_plan
        self._build_optimizer()
        self.log_path = os.path.join(self.cfg.run.output_dir, "train_log.jsonl")

    def _check_flags(self) -> None:
        """What the flags alone decide: FSDP needs torchrun; --global-batch-size sets --batch-size."""
        cfg = self.cfg
        if cfg.run.fsdp:
            fsdp.require_torchrun()
        cfg.optim.batch_size = memory_plan.per_process_batch(cfg.optim, self.world.size)

    def _read_data(self) -> None:
        """The output folder locked, the records, the checkpoint to resume from, the output folder
        checked, then the tokenized examples."""
        cfg = self.cfg
        self._lock_output_dir()
        self.records = formats.read(cfg.data.path, cfg.data.data_format)
        self.resume_dir = self._resume_dir()
        self._check_output_dir()
        self.tokenizer = models.load_tokenizer(cfg.model.name)
        self.encoded = data.encode_all(self.tokenizer, self.records, cfg.data.max_length)
        self.no_answer = data.check_loss_tokens(self.encoded, cfg.data.max_length, cfg.data.path)

    def _plan_steps(self) -> None:
        """The global batch, the steps per epoch and in all, where this run ends, its fingerprint."""
        cfg, world = self.cfg, self.world
        self.global_batch = cfg.optim.batch_size * world.size * cfg.optim.grad_accum
        self.steps_per_epoch = len(self.encoded) // self.global_batch
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"{cfg.data.path} has {len(self.encoded)} examples, fewer than one global batch "
                f"(--batch-size {cfg.optim.batch_size} × {world.size} processes × --grad-accum "
                f"{cfg.optim.grad_accum} = {self.global_batch})"
            )
        self.total_steps = (
            cfg.optim.max_steps
            if cfg.optim.max_steps is not None
            else max(1, math.floor(cfg.optim.epochs * self.steps_per_epoch))
        )
        if cfg.run.stop_after is not None and cfg.run.stop_after > self.total_steps:
            raise ValueError(
                f"--stop-after must be between 1 and the run's last step {self.total_steps} ("
                f"{'--max-steps' if cfg.optim.max_steps is not None else '--epochs'}), got {cfg.run.stop_after}"
            )
        self.end = self.total_steps if cfg.run.stop_after is None else cfg.run.stop_after
        self.fingerprint = fingerprint(cfg, world, self.total_steps, self.records.format)

    repair = None  # why the final model of a finished run is rewritten from its last checkpoint

    def _check_resume(self) -> bool:
        """The resume checkpoint's manifest, settings and checksums (``--resume latest`` read and
        verified it already); True, with ``nothing_to_do`` set, when it is at or past this run's end
        (and a finished run's final files are whole: else ``repair`` says why they are rewritten)."""
        cfg = self.cfg
        if self.resume_dir is None:
            return False
        explicit = self.manifest is None  # --resume DIR: the settings first, then the (slower) checksums
        if explicit:
            self.manifest = state.read_manifest(self.resume_dir)
        state.check_resume(self.manifest, self.fingerprint, self.resume_dir)
        if explicit:
            state.verify(self.resume_dir, self.manifest, self.world.rank)
        if self.manifest["step"] < self.end:
            return False
        if self.manifest["step"] == self.total_steps == self.end:  # finished: are the final files whole?
            self.repair = state.check_final(cfg.run.output_dir, self.total_steps)
            if self.repair is not None:
                return False  # resumed at the last step: no step to train, then save_final writes them again
        self.step = self.manifest["step"]
        where = (
            f"already complete at step {self.step}"
            if self.step == self.total_steps
            else f"at step {self.step}, past this run's last step {self.end}"
            if self.step > self.end
            else f"at step {self.step}, where --stop-after {cfg.run.stop_after} ends this run"
        )
        self.nothing_to_do = f"{self.resume_dir}: {where}; nothing trained or written"
        return True

    def _seed(self) -> None:
        """Python's, NumPy's and torch's RNGs from --seed; this rank's routing generator."""
        cfg, world = self.cfg, self.world
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.manual_seed(cfg.run.seed)
        self.generator = torch.Generator(world.device).manual_seed(cfg.run.seed * 1_000_003 + 7919 * (world.rank + 1))

    def _build_model(self):
        """The model, new or from the resume checkpoint, patched with the run's routing, on its device
        (sharded under --fsdp)."""
        from probmoe.integrations.transformers import patch_model, runtime_state

        cfg, world = self.cfg, self.world

        def patch(net):
            patch_model(net, options=cfg.routing, generator=self.generator)

        dtype = getattr(torch, cfg.model.param_dtype)
        if cfg.run.fsdp:
            return fsdp.build(
                cfg.model.name,
                seed=cfg.run.seed,
                dtype=dtype,
                layers=cfg.model.layers,
                world=world,
                patch=patch,
                checkpointing=cfg.model.gradient_checkpointing,
                bf16=cfg.run.bf16,
                fresh=self.resume_dir is None,
            )
        net = (
            models.load_model(cfg.model.name, cfg.run.seed, dtype, cfg.model.layers)
            if self.resume_dir is None
            else self._weights_from(self.resume_dir, dtype)
        )
        patch(net)
        if self.resume_dir is not None:  # the routing state (ReMoE's λ, DefaultMoE's defaults, the bias)
            runtime_state.load(net, self.resume_dir)
        if cfg.model.gradient_checkpointing:
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return net.to(world.device)

    def _build_optimizer(self) -> None:
        """AdamW and the LR schedule, with their state (and the shards under --fsdp) from the resume
        checkpoint; ``step`` and ``start_step`` where training starts."""
        cfg = self.cfg
        params = [p for p in self.net.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(cfg.optim.lr_schedule, cfg.optim.warmup_steps, self.total_steps)
        )
        self.step = 0
        if self.resume_dir is not None:
            self.step = state.load(
                self.resume_dir,
                self.manifest,
                world=self.world,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                generator=self.generator,
                sharded_model=self.net if cfg.run.fsdp else None,
            )
        self.start_step = self.step

    def _resume_dir(self) -> str | None:
        """The checkpoint --resume names; for 'latest', the newest in --output-dir that passes its
        checks (its manifest in ``manifest``, the damaged newer ones in ``damaged``)."""
        resume = self.cfg.run.resume
        self.manifest, self.damaged = None, []
        if resume is None:
            return None
        if resume == "latest":
            directory, self.manifest, self.damaged = state.newest_valid(self.cfg.run.output_dir, self.world.rank)
            return directory
        if not os.path.isdir(resume):
            raise ValueError(f"--resume {resume!r}: not a checkpoint directory (or 'latest')")
        return resume

    def _set_aside_damaged(self) -> None:
        """Rename the damaged checkpoints --resume latest skipped out of the way of this run's saves,
        with one warning each (rank 0; the others wait)."""
        if self.world.main:
            for directory, why in self.damaged:
                moved = state.set_aside(directory)
                print(
                    f"warning: skipped the damaged checkpoint {directory} ({why}); moved it to {moved}", file=sys.stderr
                )
        if self.damaged:
            distributed.barrier()

    def _lock_output_dir(self) -> None:
        """Rank 0 takes the output folder (``run_lock``; the launch's other ranks share it), unless it
        is not a folder."""
        out = self.cfg.run.output_dir
        if os.path.exists(out) and not os.path.isdir(out):
            raise ValueError(f"--output-dir {out!r} exists and is not a directory")
        if self.world.main:
            self.lock = run_lock.acquire(out)

    def _check_output_dir(self) -> None:
        """Nothing is overwritten: a new run needs an empty or new folder; a resume, an empty folder or
        the folder whose newest checkpoint (damaged ones aside) it resumes from."""
        out = self.cfg.run.output_dir
        if not os.path.isdir(out) or not run_lock.content(out):
            return
        if self.resume_dir is None:
            raise ValueError(
                f"--output-dir {out!r} is not empty; choose a new folder, or pass --resume latest to "
                "continue the run in it"
            )
        damaged = {directory for directory, _ in self.damaged}
        latest = next((c for c in state.checkpoints(out) if c not in damaged), None)
        if latest is None or os.path.realpath(latest) != os.path.realpath(self.resume_dir):
            raise ValueError(
                f"--output-dir {out!r} is not empty and --resume {self.cfg.run.resume!r} is not its newest "
                f"checkpoint ({latest}); resume into an empty folder, or from the newest checkpoint"
            )

    def _weights_from(self, directory: str, dtype: torch.dtype):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)

    def _micro_batches(self, step: int):
        """This rank's micro-batches of optimizer step ``step``: a list of collated dicts."""
        cfg, world = self.cfg, self.world
        epoch, index = divmod(step, self.steps_per_epoch)
        order = data.epoch_order(len(self.encoded), cfg.run.seed, epoch)
        chosen = order[index * self.global_batch : (index + 1) * self.global_batch]
        per_micro = cfg.optim.batch_size * world.size
        batches = []
        for a in range(cfg.optim.grad_accum):
            rows = chosen[a * per_micro : (a + 1) * per_micro][
                world.rank * cfg.optim.batch_size : (world.rank + 1) * cfg.optim.batch_size
            ]
            batches.append(data.collate([self.encoded[i] for i in rows], self.tokenizer.pad_token_id))
        return epoch, batches

    def _train_step(self, batches) -> dict:
        from probmoe.integrations.transformers.controls import after_step, attach, remoe_penalties

        cfg, world, dev = self.cfg, self.world, self.world.device
        tokens = distributed.all_sum(
            torch.stack([(b["labels"][:, 1:] != data.IGNORE).sum() for b in batches]).sum().to(dev)
        )
        total_tokens = max(1, int(tokens.item()))
        want_router = bool(self.plan.options.aux_loss or self.plan.options.z_loss)
        ce_sum, aux_sum = torch.zeros((), device=dev), torch.zeros((), device=dev)
        # under FSDP, --bf16 is its MixedPrecisionPolicy (bf16 compute, fp32 reduction), not autocast
        autocast = (
            torch.autocast(dev.type, dtype=torch.bfloat16) if cfg.run.bf16 and not cfg.run.fsdp else nullcontext()
        )
        for i, batch in enumerate(batches):
            batch = {key: value.to(dev) for key, value in batch.items()}
            sync = nullcontext() if (world.size == 1 or cfg.run.fsdp or i == len(batches) - 1) else self.model.no_sync()
            with sync:
                with autocast, remoe_penalties(self.net) as penalties:  # ReMoE's L1 terms, for the loss
                    out = self.model(
                        input_ids=batch["input_ids"],
                        attention_mask=batch["attention_mask"],
                        output_router_logits=want_router,
                        use_cache=False,
                    )
                ce, _ = answer_loss_sum(out.logits, batch["labels"])
                loss = attach(ce * world.size / total_tokens, penalties, 1.0 / len(batches))  # as Megatron: 1/G
                aux = torch.zeros((), device=dev)
                if want_router:
                    if self.plan.options.aux_loss:
                        aux = aux + self.plan.options.aux_loss * out.aux_loss.float()
                    if self.plan.options.z_loss:
                        aux = aux + self.plan.options.z_loss * self.net.probmoe_last_z_loss.float()
                    loss = loss + aux / len(batches)
                loss.backward()
            ce_sum += ce.detach()
            aux_sum += aux.detach() / len(batches)
        norm = (
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), cfg.optim.max_grad_norm)
            if cfg.optim.max_grad_norm
            else None
        )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        control = after_step(self.net)  # per-step routing updates (ReMoE's λ, the aux-free bias)
        real = distributed.all_sum(torch.stack([b["attention_mask"].sum() for b in batches]).sum().to(dev))
        stats = {
            "loss": distributed.all_sum(ce_sum).item() / total_tokens,  # router_loss: the weighted aux + z terms
            "router_loss": distributed.all_sum(aux_sum).item() / world.size,
            "lr": lr,
            "answer_tokens": total_tokens,
            "tokens": int(real.item()),
        }
        if norm is not None:
            stats["grad_norm"] = float(norm)
        stats["routing"] = routing_summary(self.net, batch["attention_mask"])
        stats.update(control)
        return stats

    tracker = None  # a tracking.Tracker (--report-to) that every step record logged is sent to too

    def _log(self, record: dict) -> None:
        if self.world.main:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if self.tracker is not None and "event" not in record:
                self.tracker.log(record)

    def _trim_log(self) -> int:
        """On resume: the step records past the resumed step (steps trained after that checkpoint,
        which this run trains again) move from train_log.jsonl to train_log.superseded.jsonl, so
        that the log holds each step once; returns how many moved. Lines that are not step records
        (events, anything unreadable) stay."""
        path = self.log_path
        if not os.path.isfile(path):
            return 0
        keep, drop = [], []
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                past = (
                    isinstance(record, dict)
                    and "event" not in record
                    and isinstance(record.get("step"), int)
                    and record["step"] > self.step
                )
                (drop if past else keep).append(line if line.endswith("\n") else line + "\n")
        if drop:
            with open(path.removesuffix(".jsonl") + ".superseded.jsonl", "a", encoding="utf-8") as f:
                f.writelines(drop)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.writelines(keep)
            os.replace(path + ".tmp", path)
        return len(drop)

    def save(self, directory: str) -> None:
        state.save(
            directory,
            step=self.step,
            fingerprint=self.fingerprint,
            world=self.world,
            model=self.net,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            generator=self.generator,
            sharded=self.cfg.run.fsdp,
        )

    def _loop(self, bar) -> dict:
        """The steps from ``step`` to ``end``, logging and saving as told; the last step's record.
        Raises ``interrupts.Interrupted`` at the first step boundary after a SIGINT or SIGTERM reached
        any rank (all ranks stop there; the checkpoints written so far stay)."""
        cfg = self.cfg
        record = {}
        while self.step < self.end:
            start = time.perf_counter()
            epoch, batches = self._micro_batches(self.step)
            stats = self._train_step(batches)
            self.step += 1
            elapsed = time.perf_counter() - start
            record = {
                "step": self.step,
                "epoch": epoch,
                **stats,
                "tokens_per_s": stats["tokens"] / elapsed,
                "step_s": elapsed,
            }
            if self.step % cfg.run.log_every == 0 or self.step == self.total_steps:
                self._log(record)
            bar.set_postfix(loss=f"{stats['loss']:.4f}", lr=f"{stats['lr']:.2e}")
            bar.update(1)
            if cfg.run.save_every and self.step % cfg.run.save_every == 0 and self.step < self.end:
                self.save(state.checkpoint_dir(cfg.run.output_dir, self.step))
            signum = distributed.any_signal(interrupts.requested())
            if signum is not None:
                raise interrupts.Interrupted(signum, step=self.step, at_boundary=True)
        return record

    def run(self) -> dict:
        """Train from ``self.step`` to ``total_steps`` (or ``stop_after``), write a checkpoint there and,
        at ``total_steps``, the final model into the output folder; returns the last step's log record
        ({} and nothing written when ``nothing_to_do``)."""
        from tqdm.auto import tqdm

        cfg, world = self.cfg, self.world
        if self.nothing_to_do is not None:
            return {}
        if world.main:
            os.makedirs(cfg.run.output_dir, exist_ok=True)
            event = "repair" if self.repair else "resume" if self.resume_dir else "start"
            superseded = {} if self.resume_dir is None else {"superseded_steps": self._trim_log()}
            self._log(
                {
                    "event": event,
                    "step": self.step,
                    **superseded,
                    "total_steps": self.total_steps,
                    "world_size": world.size,
                    "examples": len(self.encoded),
                    "examples_without_answer_tokens": self.no_answer,
                    "config": config_parser.flat(cfg),
                }
            )
        self.model.train()
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc=f"train {cfg.routing.method}",
            unit="step",
            disable=not (world.main and cfg.run.progress),
            dynamic_ncols=True,
        )
        try:
            with interrupts.deferred(), determinism.kernels(cfg.run.deterministic, world.device):
                record = self._loop(bar)  # a signal from here on waits for the next step boundary, or the end
                bar.close()
                self._save_end()
        except interrupts.Interrupted as e:  # a second Ctrl-C: the step or save under way is dropped
            e.step = self.step if e.step is None else e.step
            raise
        finally:
            bar.close()
        return record

    def _save_end(self) -> None:
        """The checkpoint of the last step (unless the run resumed there) and, at ``total_steps``, the
        final model and tokenizer in the output folder."""
        cfg, world = self.cfg, self.world
        if self.step > self.start_step or self.resume_dir is None:
            self.save(state.checkpoint_dir(cfg.run.output_dir, self.step))
        if self.step == self.total_steps:
            state.save_final(cfg.run.output_dir, world, self._write_final, step=self.step)
        distributed.barrier()

    def _write_final(self, directory: str) -> None:
        """The final model (gathered from the shards under --fsdp) and the tokenizer into ``directory``."""
        if self.cfg.run.fsdp:
            fsdp.save_final(directory, self.net, self.world)
        elif self.world.main:
            self.net.save_pretrained(directory)
        if self.world.main:
            self.tokenizer.save_pretrained(directory)
