"""The routing state a patched model updates while it trains: in its state dict, beside its checkpoint.

The buffers patching adds are persistent, so ``model.state_dict()`` / ``load_state_dict`` carry
them wherever a whole-model state dict is saved and restored (accelerate's ``save_state`` /
``load_state``, torch.distributed.checkpoint under FSDP, a plain ``torch.save``), wrapped or not.
``save_pretrained`` keeps the checkpoint stock (``model.safetensors`` holds nothing the stock
model lacks: ``without_state``) and writes them to ``probmoe_state.safetensors``, read back by
``from_pretrained``, by ``probmoe-train --resume`` and by a ``Trainer`` resume (``trainer_resume``):

    <router>.probmoe_remoe      [3] float32   ReMoE: λ, Σ sparsity, forwards since the last step
    <experts>.probmoe_defaults  [N, D] float32  DefaultMoE: the default outputs Ê
    <router>.probmoe_bias       [N] float32   aux-free balancing: the selection bias (DeepSeek-V3
                                              keeps its own e_score_correction_bias, a stock key)
    <router>.probmoe_load       [N] float32   aux-free balancing: tokens per expert since the last step

(names are the modules' names in the model). A model without such state writes no file. Reading
checks that the file holds exactly the model's state names, each of the buffer's shape and
dtype and finite; anything else is a ValueError naming the file. A state dict without them (a
stock checkpoint's, as ``Trainer`` loads ``model.safetensors``) leaves them as they are
(``model.PatchedModel.load_state_dict``).
"""

from __future__ import annotations

import os
import sys

import torch

from probmoe.methods import get_method, methods

FILENAME = "probmoe_state.safetensors"
OWN = ("probmoe_defaults", "probmoe_bias", "probmoe_load")  # DefaultMoE's experts; the aux-free bias, loads


def names() -> tuple[str, ...]:
    """The routing-state buffer names: each registered method's state (``Method.state_buffer``), and ``OWN``."""
    rules = (get_method(name) for name in methods())
    return (*(m.state_buffer for m in rules if m.state_buffer is not None), *OWN)


NAMES = names()  # the built-in methods' (kept for its importers; ``names()`` sees a method registered later)
TRAINER_LOADS = ("_load_from_checkpoint", "_load_best_model")  # the Trainer methods trainer_resume wraps


def trainer_reads_state() -> bool:
    """Whether ``Trainer`` resumes read this state (``trainer_resume.install`` has wrapped its loads)."""
    trainer = sys.modules.get("transformers.trainer")
    return trainer is not None and all(
        getattr(getattr(trainer.Trainer, name), "probmoe_resume", False) for name in TRAINER_LOADS
    )


def state_buffers(model) -> dict[str, torch.Tensor]:
    """name -> the live buffer, for every routing-state buffer of ``model``."""
    out = {}
    for module_name, module in model.named_modules():
        for name in names():
            buf = module._buffers.get(name)
            if buf is not None:
                out[f"{module_name}.{name}"] = buf
    return out


def is_state_key(key: str) -> bool:
    """Whether state-dict ``key`` names a routing-state buffer."""
    return key.rsplit(".", 1)[-1] in names()


def without_state(state_dict: dict) -> dict:
    """``state_dict`` without the routing-state keys (the stock keys ``save_pretrained`` writes)."""
    return {key: value for key, value in state_dict.items() if not is_state_key(key)}


def initial(module, name: str, like: torch.Tensor) -> torch.Tensor:
    """The value routing-state buffer ``name`` of ``module`` has when patching adds it: a method's
    state its ``initial_state`` (ReMoE's [λ₀, 0, 0], λ₀ from the router's plan), zeros for the
    others; ``like``'s shape, dtype, device."""
    plan = getattr(module, "probmoe_plan", None)
    if plan is not None and name == plan.rules.state_buffer:
        return torch.tensor(plan.rules.initial_state(plan.options), dtype=like.dtype, device=like.device)
    return torch.zeros_like(like)


def reset(model) -> None:
    """Every routing-state buffer back to ``initial`` (after ``to_empty`` gave them storage)."""
    with torch.no_grad():
        for module in model.modules():
            for name in names():
                buf = module._buffers.get(name)
                if buf is not None:
                    buf.copy_(initial(module, name, buf))


def save(model, directory) -> str | None:
    """Write the state into ``directory`` (None and no file when the model has none)."""
    from safetensors.torch import save_file

    buffers = state_buffers(model)
    if not buffers:
        return None
    path = os.path.join(os.fspath(directory), FILENAME)
    tmp = f"{path}.tmp-{os.getpid()}"
    save_file({name: buf.detach().cpu().contiguous() for name, buf in buffers.items()}, tmp)
    os.replace(tmp, path)
    return path


def load(model, directory) -> None:
    """Copy the state saved in ``directory`` into ``model``'s buffers (nothing to do when the
    model has none). ValueError if the file is missing, unreadable or does not fit the model."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    buffers = state_buffers(model)
    if not buffers:
        return
    path = os.path.join(os.fspath(directory), FILENAME)
    if not os.path.isfile(path):
        raise ValueError(f"{path} is missing: the model routes with state saved there ({', '.join(sorted(buffers))})")
    try:
        saved = load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{path} is unreadable ({e})") from e
    _copy_in(buffers, saved, path)


def _copy_in(buffers: dict, saved: dict, source: str) -> None:
    if set(saved) != set(buffers):
        raise ValueError(f"{source} must hold exactly {sorted(buffers)}; got {sorted(saved)}")
    for name, buf in buffers.items():
        value = saved[name]
        if (
            not isinstance(value, torch.Tensor)
            or value.shape != buf.shape
            or value.dtype != buf.dtype
            or not bool(torch.isfinite(value).all())
        ):
            got = f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(
                f"{source}: {name} must be a finite {buf.dtype} tensor of shape {list(buf.shape)}; got {got}"
            )
    with torch.no_grad():
        for name, buf in buffers.items():
            buf.copy_(saved[name])
