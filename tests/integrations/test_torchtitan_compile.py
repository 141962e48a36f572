"""ProbMoE's torchtitan router under torch.compile with a per-rank seed (issue 49, point 4): blocks
compiled as torchtitan's own ``apply_compile`` compiles them (``fullgraph=True``), activation
checkpointing around them as torchtitan wraps them; the draws repeat with the default generator's
seed, differ across ranks, and a checkpoint's recomputation draws what its forward drew."""

import pytest
import torch
from torch import nn

pytest.importorskip("triton")  # torchtitan imports it, also on CPU
tt = pytest.importorskip("probmoe.integrations.torchtitan", exc_type=ImportError)

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper  # noqa: E402
from torchtitan.config import CompileConfig  # noqa: E402
from torchtitan.distributed.compile import apply_compile  # noqa: E402

from probmoe.integrations.scale_out import compiled_seed  # noqa: E402
from probmoe.integrations.torchtitan import use_probmoe  # noqa: E402

from .test_torchtitan import D, built, moe_config  # noqa: E402


class _Dims:
    """What apply_compile reads of torchtitan's ParallelDims: no tensor parallelism here."""

    tp_enabled = False


class Model(nn.Module):
    """torchtitan's shape: ``layers`` of blocks, each a MoE (optionally checkpointed)."""

    def __init__(self, checkpointed: bool, seed: int = 4):
        super().__init__()
        cfg = use_probmoe(moe_config(), kmin=1, top_k=5, seed=seed)
        moe = built(cfg).train()
        self.moe = moe
        self.layers = nn.ModuleDict({"0": checkpoint_wrapper(moe) if checkpointed else moe})

    def forward(self, x):
        return self.layers["0"](x)


def run(model: Model, x: torch.Tensor, c: torch.Tensor, rng_seed: int = 0):
    """(routing indices, the gradients of Σ c · out) of one compiled training step from the default
    generator seeded ``rng_seed``."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    torch.manual_seed(rng_seed)
    (model(x) * c).sum().backward()
    grads = {"x": x.grad, **{n: p.grad for n, p in model.named_parameters() if p.grad is not None}}
    return model.moe.router.last_routing.indices.clone(), grads


def compiled(checkpointed: bool, backend: str = "aot_eager") -> Model:
    model = Model(checkpointed)
    apply_compile(model, compile_config=CompileConfig(enable=True, backend=backend), parallel_dims=_Dims())
    return model


def data():
    g = torch.Generator().manual_seed(6)
    return torch.randn(2, 30, D, generator=g), torch.randn(2, 30, D, generator=g)


@pytest.mark.filterwarnings("ignore:In CPU autocast")
def test_compiled_blocks_train_with_a_seed_and_repeat():
    torch._dynamo.reset()
    x, c = data()
    model = compiled(checkpointed=False)
    i0, g0 = run(model, x, c, rng_seed=0)
    i1, g1 = run(model, x, c, rng_seed=0)
    i2, _ = run(model, x, c, rng_seed=1)
    assert torch.equal(i0, i1)  # the default generator's seed decides the draws: a run repeats
    for name in g0:
        torch.testing.assert_close(g0[name], g1[name], rtol=0, atol=0)
    assert not torch.equal(i0, i2)
    assert g0["moe.router.gate.weight"].abs().sum() > 0


@pytest.mark.filterwarnings("ignore:In CPU autocast")
@pytest.mark.parametrize(
    "backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
)  # torchtitan's default backend is inductor: C++ compiles on the CPU take minutes
def test_checkpointed_compiled_blocks_recompute_the_same_draws(backend):
    """With activation checkpointing (torchtitan wraps blocks before compiling them) the gradients
    are those of the subsets the forward drew: equal to the unwrapped block's, same seed."""
    torch._dynamo.reset()
    x, c = data()
    i0, g0 = run(compiled(checkpointed=False, backend=backend), x, c)
    i1, g1 = run(compiled(checkpointed=True, backend=backend), x, c)
    assert torch.equal(i0, i1)
    for name in g0:
        other = name.replace("layers.0._checkpoint_wrapped_module.", "layers.0.")
        torch.testing.assert_close(g1.get(name, g1.get(other)), g0[name], rtol=1e-6, atol=1e-7)


def test_compiled_seeds_differ_across_ranks_and_stay_in_range():
    r = torch.zeros(4, 8)
    torch.manual_seed(3)
    a = compiled_seed(r, 11, rank=0)
    torch.manual_seed(3)
    b = compiled_seed(r, 11, rank=1)
    torch.manual_seed(3)
    a2 = compiled_seed(r, 11, rank=0)
    assert a.dtype == torch.int64 and a.dim() == 0
    assert int(a) == int(a2) and int(a) != int(b)
    assert 0 <= int(a) < 2**62 and 0 <= int(b) < 2**62


def test_route_takes_a_seed_tensor_and_checks_it():
    import probmoe

    r = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    s = torch.tensor(12345, dtype=torch.int64)
    a = probmoe.route(r, k=3, training=True, generator=s)
    b = probmoe.route(r, k=3, training=True, generator=s.clone())
    assert torch.equal(a.indices, b.indices)  # a function of the seed's value alone
    with pytest.raises(ValueError, match="generator must be a torch.Generator on cpu, a 0-dim int64 seed tensor"):
        probmoe.route(r, k=3, training=True, generator=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="got a torch.float32 tensor"):
        probmoe.route(r, k=3, training=True, generator=torch.tensor(1.0))
    with pytest.raises(ValueError, match="a seed tensor is per call"):  # a module's would repeat its draws
        probmoe.ProbMoERouter(8, 4, k=2, generator=s)
