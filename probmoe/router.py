"""``ProbMoERouter``: a linear gate followed by ``probmoe.route``, shaped like HF's ``*TopKRouter``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _validate
from .config import RoutingConfig
from .replay import GeneratorReplay
from .route import Routing, route


def router_logits(hidden_states: Tensor, weight: Tensor, *, float32: bool = False) -> Tensor:
    """The gate's logits as HF's routers compute them: hidden_states [..., D], weight [N, D] ->
    [T, N], in the hidden states' dtype (``float32``: in float32, as DeepSeek-V3's router)."""
    h = hidden_states.reshape(-1, weight.shape[-1])  # [T, D]
    if float32:
        return F.linear(h.float(), weight.float())
    return F.linear(h, weight.to(h.dtype))


def routed(
    logits: Tensor,
    config: RoutingConfig,
    *,
    training: bool,
    generator: torch.Generator | None,
    replay: GeneratorReplay,
    validate_args=None,
) -> Routing:
    """One router forward's ``route`` of logits [T, N] (float16/bfloat16 are routed in float32),
    drawing from ``generator`` through ``replay`` in training (the same draws when activation
    checkpointing recomputes the forward). Under torch.compile the generator is used as it is: the
    replay's bookkeeping reads values on the host, and the default generator (None) needs no
    replay anywhere, since checkpointing restores it."""
    if generator is not None and training and not torch.compiler.is_compiling():
        generator = replay.generator(generator)
    return route(logits, config, training=training, generator=generator, validate_args=validate_args)


class ProbMoERouter(nn.Module):
    """Gate logits = hidden @ weight.T (no bias), then ProbMoE routing (``probmoe.route``).

    forward(hidden_states [..., D]) -> (router_logits [T, N], weights [T, kmax], indices [T, kmax]),
    the order HF transformers' routers use. Logits are computed in the hidden states' dtype, as
    HF does; routing and the weights are float32 (float64 for float64 inputs). ``self.training``
    selects sampling (train) or MAP (eval). The last ``Routing`` is kept in ``last_routing`` for
    analysis and auxiliary losses (it holds the autograd graph until the next forward).

    Routing options: a ``RoutingConfig`` as ``config``, or its fields as keywords (k or
    kmin/kmax or constraint, estimator, algorithm, grad, normalize, scores; ``method`` and
    ``backend``, their old names, with a DeprecationWarning); ``self.config`` holds them
    either way. With a ``constraint`` (a ``circuits.Circuit`` over the N experts or a spec such as
    ``circuits.GroupLimited``) ``top_k`` is its largest subset and eval takes its MAP.

    generator: draw from this ``torch.Generator`` (reproducible) instead of the global RNG. Under
    ``torch.utils.checkpoint`` the recomputation in backward draws the same subsets as the
    forward it recomputes (``probmoe.replay.GeneratorReplay``; with the global RNG, checkpoint
    restores its state itself).
    """

    FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        *,
        config: RoutingConfig | None = None,
        k=None,
        kmin=None,
        kmax=None,
        constraint=None,
        estimator: str | None = None,
        algorithm: str | None = None,
        grad: str | None = None,
        normalize: bool | None = None,
        scores: str | None = None,
        generator: torch.Generator | None = None,
        validate_args=None,
        device=None,
        dtype=None,
        method: str | None = None,
        backend: str | None = None,
    ):
        super().__init__()
        hidden_size = _validate.int_in("hidden_size", hidden_size, 1, 2**31)
        num_experts = _validate.int_in("num_experts", num_experts, 1, 2**31)
        self.config = RoutingConfig.resolve(
            num_experts,
            config,
            k=k,
            kmin=kmin,
            kmax=kmax,
            constraint=constraint,
            grad=grad,
            normalize=normalize,
            scores=scores,
            estimator=estimator,
            algorithm=algorithm,
            method=method,
            backend=backend,
        )
        if isinstance(generator, torch.Tensor):  # route takes one per call; a module's would repeat its draws
            raise ValueError(
                "generator must be a torch.Generator or None, got a tensor (a seed tensor is per call: route)"
            )
        _validate.generator(generator)
        self.hidden_dim, self.num_experts, self.top_k = hidden_size, num_experts, self.config.kmax  # HF's names
        self.generator, self.validate_args = generator, validate_args
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's default
        self.last_routing: Routing | None = None
        self.replay = GeneratorReplay()

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"hidden_size={self.hidden_dim}, num_experts={self.num_experts}, {c.describe()}, "
            f"estimator={c.estimator!r}, algorithm={c.algorithm!r}, grad={c.grad!r}, normalize={c.normalize}, scores={c.scores!r}"
        )

    def forward(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if not isinstance(hidden_states, Tensor) or hidden_states.dtype not in self.FLOATS:
            got = hidden_states.dtype if isinstance(hidden_states, Tensor) else type(hidden_states).__name__
            raise ValueError(
                f"hidden_states must be a tensor of dtype float16, bfloat16, float32 or float64, got {got}"
            )
        if hidden_states.dim() == 0 or hidden_states.shape[-1] != self.hidden_dim:
            raise ValueError(f"hidden_states must have shape [..., {self.hidden_dim}], got {list(hidden_states.shape)}")
        logits = router_logits(hidden_states, self.weight)  # [T, N]
        routing = routed(
            logits,
            self.config,
            training=self.training,
            generator=self.generator,
            replay=self.replay,
            validate_args=self.validate_args,
        )
        self.last_routing = routing
        return logits, routing.weights, routing.indices
