"""Checkpoints that resume exactly: the model as ``save_pretrained`` writes it, plus the training state.

``output_dir/checkpoint-000005/`` holds

    config.json, model.safetensors, tokenizer files, probmoe_routing.json   (the stock checkpoint)
    training_state.pt      step, optimizer, LR scheduler (rank 0's; DDP keeps them equal on all ranks)

(under ``--fsdp``: config.json, probmoe_routing.json, the tokenizer files, every rank's model and
optimizer shards in ``.metadata`` and ``__<r>_0.distcp`` (torch.distributed.checkpoint,
``fsdp.save_shards``), and training_state.pt without the optimizer), and in both cases

    rng_rank{r}.pt         rank r's RNG states: Python, NumPy, torch CPU, its GPU, the routing generator
    training_state.json    the run's fingerprint, the step, the world size, sha256 of every other file

and is written under a temporary name, synced, then renamed, so a crash never leaves half a
checkpoint (a save cut short by a forced interrupt removes its temporary folder); an existing
checkpoint is never replaced. Reading trusts nothing: the JSON's fields, the checksums of every
file (weights included) before anything is loaded, the fingerprint against the resuming run
(``RESUME_KEYS``: anything that changes the trajectory; the total number of steps too under a
decaying schedule), and every .pt file is read with ``weights_only=True``. ``--resume latest``
takes the newest checkpoint that passes these checks (``newest_valid``); the trainer sets the
damaged newer ones aside (``set_aside``).

The final model in ``output_dir`` (``save_final``) is vouched for by ``final_model.json`` (its
step and the sha256 of each file), written last; ``check_final`` reads it back, so that a
``--resume latest`` of a finished run notices a damaged or missing final file and rewrites the
final model from the last checkpoint instead of reporting the run complete; the loaders of the
folder verify it too (``probmoe.integrations.final_model``).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil

import numpy as np
import torch

from probmoe.integrations import final_model
from probmoe.integrations.final_model import sha256_file
from probmoe.integrations.routing_options import OLD_NAMES

from . import config_parser
from .run_config import TrainConfig

FORMAT = "probmoe-training-state"
VERSION = 1
STATE = "training_state.pt"
MANIFEST = "training_state.json"
FINAL = final_model.FILENAME  # in the output folder: the final model's step and checksums
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# fingerprint fields that must match for a resume to continue the same trajectory: the options marked
# so (run_config.trajectory, and every routing option), and what the run derives
DERIVED_KEYS = ("data_sha256", "world_size", "device_type", "schedule_steps")
RESUME_KEYS = config_parser.resume_keys(TrainConfig) + DERIVED_KEYS
# how a resume's refusal names a fingerprint field that is not a flag of the same name (the others: --max-grad-norm ...)
RESUME_NAMES = {
    "schedule_steps": "the learning-rate schedule's steps (--max-steps or --epochs)",
    "data_sha256": "the --data file's contents (SHA-256)",
    "world_size": "processes (world size)",
    "device_type": "device type",
}
# what a checkpoint written before an option existed ran with: its default (every new option's default
# is the behaviour before it), but for --data-format, whose default (told by the fields) came with formats
RESUME_DEFAULTS = {
    **{leaf.name: leaf.default for leaf in config_parser.leaves(TrainConfig) if leaf.resume},
    "data_format": "question-answer",
}


def checkpoint_dir(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, f"checkpoint-{step:06d}")


def checkpoints(output_dir: str) -> list[str]:
    """The checkpoint directories in ``output_dir``, newest (highest step) first."""
    if not os.path.isdir(output_dir):
        return []
    steps = [int(m.group(1)) for name in os.listdir(output_dir) if (m := CHECKPOINT.match(name))]
    return [checkpoint_dir(output_dir, step) for step in sorted(steps, reverse=True)]


def latest_checkpoint(output_dir: str) -> str | None:
    """The checkpoint of the highest step in ``output_dir``, or None."""
    found = checkpoints(output_dir)
    return found[0] if found else None


def newest_valid(output_dir: str, rank: int) -> tuple[str, dict, list[tuple[str, str]]]:
    """``--resume latest``: (the newest checkpoint of ``output_dir`` that passes ``read_manifest``
    and ``verify``, its manifest, [(newer checkpoint, why it failed)]). ValueError when there is
    none, naming each one and its fault."""
    skipped = []
    for directory in checkpoints(output_dir):
        try:
            manifest = read_manifest(directory)
            verify(directory, manifest, rank)
        except ValueError as e:
            skipped.append((directory, str(e).removeprefix(f"--resume {directory!r}: ")))
            continue
        return directory, manifest, skipped
    if not skipped:
        raise ValueError(f"--resume latest: no checkpoint-* in --output-dir {output_dir!r}")
    raise ValueError(
        f"--resume latest: no checkpoint in --output-dir {output_dir!r} passes its checks ("
        + "; ".join(f"{directory}: {why}" for directory, why in skipped)
        + ")"
    )


def set_aside(directory: str) -> str:
    """Rename a damaged checkpoint to ``<name>.damaged`` (``-2``, ``-3``... if taken), out of the
    way of the save of its step, its files kept for a look; returns the new path."""
    target, n = f"{directory}.damaged", 1
    while os.path.exists(target):
        n += 1
        target = f"{directory}.damaged-{n}"
    os.replace(directory, target)
    return target


def rng_state(generator: torch.Generator | None, device: torch.device) -> dict:
    """Every RNG this process draws from, as tensors and plain numbers (loadable with
    ``weights_only=True``). The routing generator may be None (the routers draw from the global RNG)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, torch.tensor(internal, dtype=torch.int64), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "routing": generator.get_state() if generator is not None else None,
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, generator: torch.Generator | None, device: torch.device) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal.tolist()), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if (state["routing"] is None) != (generator is None):
        raise ValueError("the checkpoint's routing generator does not match this run's")
    if generator is not None:
        generator.set_state(state["routing"])


def _sync_tree(directory: str) -> None:
    """fsync every file of ``directory``, then the directory itself."""
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f:
            os.fsync(f.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(
    directory: str,
    *,
    step: int,
    fingerprint: dict,
    world,
    model,
    tokenizer,
    optimizer,
    scheduler,
    generator,
    sharded: bool = False,
) -> None:
    """Write the checkpoint of ``step`` to ``directory``, which must not exist (every rank calls
    this; rank 0 writes the model, the optimizer and the manifest, each rank its own RNG file;
    ``sharded``: each rank its model and optimizer shards)."""
    if os.path.exists(directory):
        raise FileExistsError(f"{directory} exists already; a checkpoint is never overwritten")
    tmp = f"{directory}.tmp"
    try:
        _write(
            directory,
            tmp,
            step=step,
            fingerprint=fingerprint,
            world=world,
            model=model,
            tokenizer=tokenizer,
            optimizer=optimizer,
            scheduler=scheduler,
            generator=generator,
            sharded=sharded,
        )
    except BaseException:  # a forced interrupt (interrupts.Interrupted) or a failure: no half checkpoint stays
        if world.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write(
    directory: str, tmp: str, *, step, fingerprint, world, model, tokenizer, optimizer, scheduler, generator, sharded
) -> None:
    """``save``'s body: everything into ``tmp``, synced, then renamed to ``directory``."""
    from . import distributed, fsdp

    if world.main:
        shutil.rmtree(tmp, ignore_errors=True)  # what a crashed save of this step left
        os.makedirs(tmp)
        if sharded:
            fsdp.save_config(tmp, model)
        else:
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        optim = {} if sharded else {"optimizer": optimizer.state_dict()}
        torch.save({"step": step, **optim, "scheduler": scheduler.state_dict()}, os.path.join(tmp, STATE))
    distributed.barrier()
    if sharded:
        fsdp.save_shards(tmp, model, optimizer)
    torch.save(rng_state(generator, world.device), os.path.join(tmp, f"rng_rank{world.rank}.pt"))
    distributed.barrier()
    if world.main:
        files = sorted(os.listdir(tmp))
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "step": step,
            "world_size": world.size,
            "fingerprint": fingerprint,
            "sha256": {f: sha256_file(os.path.join(tmp, f)) for f in files},
        }
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")
        _sync_tree(tmp)
        os.replace(tmp, directory)
    distributed.barrier()


def save_final(directory: str, world, write, step: int | None = None) -> None:
    """The final model into ``directory`` (every rank calls this): ``write(tmp)`` (collective under
    FSDP; rank 0 writes) fills ``directory/.final.tmp``, then rank 0 syncs it and renames each file
    up into ``directory``, so a forced interrupt leaves each file whole or absent, never truncated;
    ``FINAL`` (``step`` and the files' checksums) is written last (``check_final``)."""
    from . import distributed

    tmp = os.path.join(directory, ".final.tmp")
    try:
        if world.main:
            shutil.rmtree(tmp, ignore_errors=True)  # what a killed save left
            os.makedirs(tmp)
        distributed.barrier()
        write(tmp)
        distributed.barrier()
        if world.main:
            _sync_tree(tmp)
            names = sorted(os.listdir(tmp))
            sums = {name: sha256_file(os.path.join(tmp, name)) for name in names}
            if os.path.exists(os.path.join(directory, FINAL)):  # the files change: the old vouching goes first
                os.remove(os.path.join(directory, FINAL))
            for name in names:
                os.replace(os.path.join(tmp, name), os.path.join(directory, name))
            os.rmdir(tmp)
            with open(os.path.join(directory, FINAL + ".tmp"), "w", encoding="utf-8") as f:
                json.dump({"format": final_model.FORMAT, "step": step, "sha256": sums}, f, indent=2, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(os.path.join(directory, FINAL + ".tmp"), os.path.join(directory, FINAL))
    except BaseException:
        if world.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_final(directory: str, step: int) -> str | None:
    """None when the final model in ``directory`` is whole: ``FINAL`` is there, for ``step``, and
    every file it lists matches its checksum; else what is wrong, in a few words."""
    try:
        final = final_model.read(directory)
    except FileNotFoundError:
        return f"{FINAL} is missing or unreadable"
    except ValueError as e:  # unreadable, malformed
        return f"{FINAL} is {e}"
    if final.get("step") != step:
        return f"{FINAL} is for step {final.get('step')!r}, the last checkpoint for step {step}"
    for name, digest in sorted(final["sha256"].items()):
        file = os.path.join(directory, name)
        if not os.path.isfile(file) or sha256_file(file) != digest:
            return f"{name} is missing or does not match its checksum in {FINAL} (damaged or modified)"
    return None


def read_manifest(directory: str) -> dict:
    """The checked manifest of a checkpoint directory; ValueError if missing, unreadable or malformed."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"--resume {directory!r}: {MANIFEST} is missing or unreadable ({e}); "
            "it is not a checkpoint written by probmoe-train"
        ) from None
    fields = {"format", "version", "step", "world_size", "fingerprint", "sha256"}
    if not isinstance(manifest, dict) or set(manifest) != fields:
        raise ValueError(f"{path}: must be an object with the fields {sorted(fields)}")
    if manifest["format"] != FORMAT or manifest["version"] != VERSION:
        raise ValueError(f"{path}: format {manifest['format']!r} v{manifest['version']!r} is not {FORMAT} v{VERSION}")
    if not isinstance(manifest["step"], int) or manifest["step"] < 0:
        raise ValueError(f"{path}: step must be an integer >= 0, got {manifest['step']!r}")
    if not isinstance(manifest["fingerprint"], dict) or not isinstance(manifest["sha256"], dict):
        raise ValueError(f"{path}: fingerprint and sha256 must be objects")
    for name, digest in manifest["sha256"].items():
        if os.path.basename(name) != name or not isinstance(digest, str):
            raise ValueError(f"{path}: sha256 must map file names to hex digests, got {name!r}: {digest!r}")
    return manifest


def verify(directory: str, manifest: dict, rank: int) -> None:
    """Every file the manifest lists (weights included) and this rank's state files are there and
    match their checksums; ValueError otherwise."""
    listed = manifest["sha256"]
    for name in (STATE, f"rng_rank{rank}.pt"):
        if name not in listed:
            raise ValueError(f"--resume {directory!r}: {MANIFEST} does not list {name}")
    for name, expected in listed.items():
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or sha256_file(path) != expected:
            raise ValueError(
                f"--resume {directory!r}: {name} is missing or does not match its checksum in "
                f"{MANIFEST} (damaged or modified)"
            )


def saved_fingerprint(manifest: dict) -> dict:
    """The manifest's fingerprint with the options' old names read as their names (a run written
    before issue 47 says "backend" for "algorithm": it resumes)."""
    return {OLD_NAMES.get(key, key): value for key, value in manifest["fingerprint"].items()}


def check_resume(manifest: dict, fingerprint: dict, directory: str) -> None:
    """ValueError listing every trajectory setting (``fingerprint``'s keys: ``RESUME_KEYS`` for a
    ``TrainConfig``) in which the resuming run differs."""
    saved = {**RESUME_DEFAULTS, **saved_fingerprint(manifest)}
    diffs = [
        f"{RESUME_NAMES.get(key) or '--' + key.replace('_', '-')}: checkpoint {saved.get(key)!r}, now "
        f"{fingerprint.get(key)!r}"
        for key in fingerprint
        if saved.get(key) != fingerprint.get(key)
    ]
    if diffs:
        raise ValueError(
            f"--resume {directory!r} was written by a run with other settings; an exact resume needs "
            f"the same ones ({'; '.join(diffs)})"
        )


def load(directory: str, manifest: dict, *, world, optimizer, scheduler, generator, sharded_model=None) -> int:
    """Restore optimizer, scheduler and this rank's RNGs from ``directory`` (``verify`` first), and
    the model and optimizer shards into ``sharded_model`` and ``optimizer`` when given (``--fsdp``);
    returns the step."""
    from . import fsdp

    files = {
        name: torch.load(os.path.join(directory, name), map_location="cpu", weights_only=True)
        for name in (STATE, f"rng_rank{world.rank}.pt")
    }
    state = files[STATE]
    if state.get("step") != manifest["step"]:
        raise ValueError(
            f"--resume {directory!r}: {STATE} is for step {state.get('step')}, {MANIFEST} says {manifest['step']}"
        )
    if sharded_model is not None:
        fsdp.load_shards(directory, sharded_model, optimizer)
    else:
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(files[f"rng_rank{world.rank}.pt"], generator, world.device)
    return manifest["step"]
