"""``GeneratorReplay``: the same draws when gradient checkpointing recomputes a forward.

``torch.utils.checkpoint`` recomputes a forward inside the backward pass. It restores the global
RNG state first, so draws from the global RNG repeat by themselves, but a router with its own
``torch.Generator`` has moved on. ``GeneratorReplay.generator`` hands each training forward the
generator to draw from: the router's own, or, when the call is a recomputation, a copy in the
state the original forward found.

How a recomputation is recognised: every training forward draws a key from the global CPU RNG
(which checkpoint restores, so a recomputation draws its original forward's key again) and
remembers key -> generator state for the last ``depth`` forwards. A call is a replay when its key
is remembered and it runs inside a backward pass; the second condition keeps a user who reseeds
the global RNG before every step from replaying ordinary forwards.
"""

from __future__ import annotations

import collections

import torch
from torch import Tensor


def in_backward() -> bool:
    """Whether this call runs inside an autograd backward pass (checkpoint recomputation does).

    torch has no public API for this; ``torch.utils.checkpoint`` itself asks the same private
    function. Where it is missing, every call counts as inside, and the keys alone decide.
    """
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is None or task_id() != -1


class GeneratorReplay:
    """Generator states of recent training forwards, for checkpoint recomputation to replay.

    depth: how many forwards are remembered (a checkpointed segment recomputed later than
    ``depth`` forwards after it ran draws fresh subsets instead of the same ones).
    """

    def __init__(self, depth: int = 64):
        self.depth = depth
        self._states: collections.OrderedDict[int, Tensor] = collections.OrderedDict()  # key -> state

    def generator(self, generator: torch.Generator) -> torch.Generator:
        """The generator this forward draws from: ``generator``, or a copy in the state that the
        forward being recomputed found."""
        key = int(torch.randint(2**62, (), dtype=torch.long))  # restored by checkpoint: same key on replay
        state = self._states.get(key)
        if state is not None and in_backward():
            replay = torch.Generator(device=generator.device)
            replay.set_state(state)
            return replay
        self._states[key] = generator.get_state()
        if len(self._states) > self.depth:
            self._states.popitem(last=False)
        return generator

    def __len__(self) -> int:
        return len(self._states)
