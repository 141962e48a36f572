"""``Trainer`` resume of a patched model's routing state (``probmoe_state.safetensors``).

``Trainer`` saves a checkpoint with ``save_pretrained``, which for a patched model also writes the
routing state (``runtime_state``: ReMoE's λ, DefaultMoE's default outputs, the aux-free balance
bias and load); it resumes by ``load_state_dict`` of ``model.safetensors`` alone, so that state
would start again from its initial values. ``install`` wraps ``Trainer._load_from_checkpoint``
and ``Trainer._load_best_model`` (so trl's ``SFTTrainer`` and every other subclass too): after
transformers loads the weights, a patched model's routing state is read from the same
checkpoint. Models that are not patched load exactly as before.

``patch_model`` (and this package's import) installs it when ``transformers.trainer`` is already
imported (``from transformers import Trainer`` before patching: importing it here would add
seconds to every ``patch_model``); ``install()`` may be called at any time, and more than once.
A patched model with routing state warns in ``load_state_dict`` while it is not installed: that
state is not in ``model.safetensors`` (``model.PatchedModel``).
"""

from __future__ import annotations

import functools
import os
import sys

from . import runtime_state
from .model import PatchedModel

installed = runtime_state.trainer_reads_state  # whether install() has wrapped Trainer's loads


def install() -> None:
    """Wrap ``transformers.Trainer``'s checkpoint loading (idempotent)."""
    from transformers import Trainer

    if installed():
        return
    original = Trainer._load_from_checkpoint, Trainer._load_best_model

    @functools.wraps(original[0])
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        result = original[0](self, resume_from_checkpoint, model)
        _load_state(self.model, resume_from_checkpoint)
        return result

    @functools.wraps(original[1])
    def _load_best_model(self):
        result = original[1](self)
        _load_state(self.model, self.state.best_model_checkpoint)
        return result

    for method in (_load_from_checkpoint, _load_best_model):
        method.probmoe_resume = True
        setattr(Trainer, method.__name__, method)


def install_if_imported() -> None:
    """``install`` if ``transformers.trainer`` is imported already; nothing otherwise."""
    if "transformers.trainer" in sys.modules:
        install()


def _patched(model):
    return next((m for m in model.modules() if isinstance(m, PatchedModel)), None) if model is not None else None


def _load_state(model, directory) -> None:
    patched = _patched(model)
    if patched is not None and directory is not None and os.path.isdir(os.fspath(directory)):
        runtime_state.load(patched, directory)
