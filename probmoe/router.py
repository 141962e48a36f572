"""``ProbMoERouter``: a linear gate followed by ``probmoe.route``, shaped like HF's ``*TopKRouter``."""

from __future__ import annotations

import collections
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _validate
from .backends import BACKENDS
from .distribution import GRADS
from .route import METHODS, Routing, route


class ProbMoERouter(nn.Module):
    """Gate logits = hidden @ weight.T (no bias), then ProbMoE routing (``probmoe.route``).

    forward(hidden_states [..., D]) -> (router_logits [T, N], weights [T, kmax], indices [T, kmax]),
    the order HF transformers' routers use. Logits are computed in the hidden states' dtype, as
    HF does; routing and the weights are float32 (float64 for float64 inputs). ``self.training``
    selects sampling (train) or MAP (eval). The last ``Routing`` is kept in ``last_routing`` for
    analysis and auxiliary losses (it holds the autograd graph until the next forward).

    generator: draw from this ``torch.Generator`` (reproducible) instead of the global RNG. Under
    ``torch.utils.checkpoint`` the recomputation in backward replays the generator state of the
    forward it recomputes, so it draws the same subsets (the global RNG is restored by
    checkpoint itself). To find that state, every training forward with a generator draws one
    key from the global CPU RNG, which checkpoint restores before recomputing, and remembers
    key -> generator state for the last ``REPLAY_DEPTH`` forwards.
    """

    REPLAY_DEPTH = 64  # generator states kept for checkpoint recomputation
    FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

    def __init__(self, hidden_size: int, num_experts: int, *, k=None, kmin=None, kmax=None,
                 method: str = "probmoe", backend: str = "circuit", grad: str = "exact", normalize: bool = False,
                 generator: torch.Generator | None = None, validate_args=None, device=None, dtype=None):
        super().__init__()
        hidden_size = _validate.int_in("hidden_size", hidden_size, 1, 2**31)
        num_experts = _validate.int_in("num_experts", num_experts, 1, 2**31)
        self.kmin, self.kmax = _validate.cardinality(num_experts, k, kmin, kmax, lowest=1)
        _validate.choice("method", method, METHODS)
        _validate.choice("backend", backend, BACKENDS)
        _validate.choice("grad", grad, GRADS)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.hidden_dim, self.num_experts, self.top_k = hidden_size, num_experts, self.kmax
        self.method, self.backend, self.grad, self.normalize = method, backend, grad, normalize
        self.generator, self.validate_args = generator, validate_args
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's default
        self.last_routing: Routing | None = None
        self._states: collections.OrderedDict[int, Tensor] = collections.OrderedDict()  # key -> generator state

    def extra_repr(self) -> str:
        size = f"k={self.kmin}" if self.kmin == self.kmax else f"kmin={self.kmin}, kmax={self.kmax}"
        return (f"hidden_size={self.hidden_dim}, num_experts={self.num_experts}, {size}, method={self.method!r}, "
                f"backend={self.backend!r}, grad={self.grad!r}, normalize={self.normalize}")

    def _generator(self) -> torch.Generator | None:
        """This call's generator: ``self.generator``, or, inside a backward pass (checkpoint
        recomputation), a copy in the state that the forward being recomputed found.

        The forward is identified by a key from the global CPU RNG, whose state checkpoint
        restores before recomputing, so a recomputation draws the key of its original forward.
        """
        if self.generator is None or not self.training:
            return self.generator
        key = int(torch.randint(2**62, (), dtype=torch.long))
        state = self._states.get(key)
        if torch._C._current_graph_task_id() != -1 and state is not None:  # a recomputation
            replay = torch.Generator(device=self.generator.device)
            replay.set_state(state)
            return replay
        self._states[key] = self.generator.get_state()
        if len(self._states) > self.REPLAY_DEPTH:
            self._states.popitem(last=False)
        return self.generator

    def forward(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if not isinstance(hidden_states, Tensor) or hidden_states.dtype not in self.FLOATS:
            got = hidden_states.dtype if isinstance(hidden_states, Tensor) else type(hidden_states).__name__
            raise ValueError(f"hidden_states must be a tensor of dtype float16, bfloat16, float32 or float64, got {got}")
        if hidden_states.dim() == 0 or hidden_states.shape[-1] != self.hidden_dim:
            raise ValueError(
                f"hidden_states must have shape [..., {self.hidden_dim}], got {list(hidden_states.shape)}"
            )
        h = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(h, self.weight.to(h.dtype))  # [T, D] -> [T, N]
        routing = route(logits.float() if logits.dtype != torch.float64 else logits,
                        kmin=self.kmin, kmax=self.kmax, training=self.training, method=self.method,
                        generator=self._generator(), normalize=self.normalize, backend=self.backend,
                        grad=self.grad, validate_args=self.validate_args)
        self.last_routing = routing
        return logits, routing.weights, routing.indices
