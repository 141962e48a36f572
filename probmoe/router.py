"""``ProbMoERouter``: a linear gate followed by ``probmoe.route``, shaped like HF's ``*TopKRouter``."""

from __future__ import annotations

import collections
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _validate
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
    checkpoint itself).
    """

    REPLAY_DEPTH = 64  # generator states kept for checkpoint recomputation

    def __init__(self, hidden_size: int, num_experts: int, *, k=None, kmin=None, kmax=None,
                 method: str = "probmoe", backend: str = "dp", grad: str = "exact", normalize: bool = False,
                 generator: torch.Generator | None = None, validate_args=None, device=None, dtype=None):
        super().__init__()
        hidden_size = _validate._int_in("hidden_size", hidden_size, 1, 2**31)
        num_experts = _validate._int_in("num_experts", num_experts, 1, 2**31)
        self.kmin, self.kmax = _validate.cardinality(num_experts, k, kmin, kmax, lowest=1)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.hidden_dim, self.num_experts, self.top_k = hidden_size, num_experts, self.kmax
        self.method, self.backend, self.grad, self.normalize = method, backend, grad, normalize
        self.generator, self.validate_args = generator, validate_args
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's default
        self.last_routing: Routing | None = None
        self._states: collections.deque = collections.deque(maxlen=self.REPLAY_DEPTH)

    def extra_repr(self) -> str:
        size = f"k={self.kmin}" if self.kmin == self.kmax else f"kmin={self.kmin}, kmax={self.kmax}"
        return (f"hidden_size={self.hidden_dim}, num_experts={self.num_experts}, {size}, method={self.method!r}, "
                f"backend={self.backend!r}, grad={self.grad!r}, normalize={self.normalize}")

    def _generator(self) -> torch.Generator | None:
        """This call's generator: ``self.generator``, or a copy in the state of the forward being
        recomputed when called inside a backward pass (checkpoint recomputation)."""
        if self.generator is None or not self.training:
            return self.generator
        if torch._C._current_graph_task_id() == -1:  # not inside a backward pass: remember the state
            self._states.append(self.generator.get_state())
            return self.generator
        replay = torch.Generator(device=self.generator.device)
        replay.set_state(self._states.pop() if self._states else self.generator.get_state())
        return replay

    def forward(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if hidden_states.shape[-1] != self.hidden_dim:
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
