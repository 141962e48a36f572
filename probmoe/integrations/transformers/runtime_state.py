"""The routing state a patched model updates while it trains, saved beside its checkpoint.

Checkpoints keep the stock keys (``model.safetensors`` holds nothing the stock model lacks), so the
buffers patching adds are written by ``save_pretrained`` to ``probmoe_state.safetensors`` and read
back by ``from_pretrained`` and by ``probmoe-train --resume``:

    <router>.probmoe_remoe      [3] float32   ReMoE: λ, Σ sparsity, forwards since the last step
    <experts>.probmoe_defaults  [N, D] float32  DefaultMoE: the default outputs Ê
    <router>.probmoe_bias       [N] float32   aux-free balancing: the selection bias (DeepSeek-V3
                                              keeps its own e_score_correction_bias, a stock key)
    <router>.probmoe_load       [N] float32   aux-free balancing: tokens per expert since the last step

(names are the modules' names in the model). A model without such state writes no file. Reading
checks that the file holds exactly the model's state names, each of the buffer's shape and
dtype and finite; anything else is a ValueError naming the file. ``Trainer`` resume reads it too
(``trainer_resume``); accelerate's ``save_state`` / ``load_state`` carry it as ``Checkpointable``.
"""

from __future__ import annotations

import os

import torch

FILENAME = "probmoe_state.safetensors"
NAMES = ("probmoe_remoe", "probmoe_defaults", "probmoe_bias", "probmoe_load")


def state_buffers(model) -> dict[str, torch.Tensor]:
    """name -> the live buffer, for every routing-state buffer of ``model``."""
    out = {}
    for module_name, module in model.named_modules():
        for name in NAMES:
            buf = module._buffers.get(name)
            if buf is not None:
                out[f"{module_name}.{name}"] = buf
    return out


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
        if (not isinstance(value, torch.Tensor) or value.shape != buf.shape or value.dtype != buf.dtype
                or not bool(torch.isfinite(value).all())):
            got = f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"{source}: {name} must be a finite {buf.dtype} tensor of shape {list(buf.shape)}; "
                             f"got {got}")
    with torch.no_grad():
        for name, buf in buffers.items():
            buf.copy_(saved[name])


class Checkpointable:
    """A patched model's routing state as an object with ``state_dict`` / ``load_state_dict``, for
    checkpointing that saves ``model.state_dict()`` alone (accelerate's ``save_state``: the state
    buffers are not persistent)::

        accelerator.register_for_checkpointing(runtime_state.Checkpointable(model))

    ``load_state_dict`` checks as ``load`` does (ValueError naming what does not fit)."""

    def __init__(self, model):
        if not state_buffers(model):
            raise ValueError("model has no routing state to checkpoint (its method keeps none)")
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: buf.detach().cpu().clone() for name, buf in state_buffers(self.model).items()}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise ValueError(f"the routing state must be a dict of tensors, got {type(state).__name__}")
        _copy_in(state_buffers(self.model), state, "the routing state")
