"""ProbMoE behind Megatron-Core's RouterInterface (megatron-core 0.16.1), as far as a CPU goes: its
routing math against Megatron's own (``topk_routing_with_score_function``, eval Exact-k), and
Megatron's ``MoELayer`` (allgather dispatcher, ``SequentialMLP`` experts, one gloo rank) with this
router against the dense reference, forward and backward. Megatron's ``TopKRouter`` and its
alltoall dispatcher need CUDA (``torch.cuda.current_device()``, ``torch.cuda.Stream()``): not run."""

import os
import warnings

import pytest
import torch

pytest.importorskip("megatron.core")
warnings.filterwarnings("ignore", message="Transformer Engine")

import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.transformer.mlp import MLPSubmodules  # noqa: E402
from megatron.core.transformer.moe.experts import SequentialMLP  # noqa: E402
from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules  # noqa: E402
from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from probmoe.integrations.megatron import ProbMoEMegatronRouter, probmoe_router  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
E, H, F = 8, 16, 32


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    """Megatron's model-parallel state on one gloo rank (what its layers read at construction and its
    all-reduces use; test_megatron_expert_bias.py imports it)."""
    made = not dist.is_initialized()
    if made:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    if made:
        dist.destroy_process_group()


def config(**kw):
    return TransformerConfig(
        num_layers=1,
        hidden_size=H,
        ffn_hidden_size=F,
        moe_ffn_hidden_size=F,
        num_attention_heads=2,
        num_moe_experts=E,
        use_cpu_initialization=True,
        moe_token_dispatcher_type="allgather",
        add_bias_linear=False,
        gated_linear_unit=False,
        **{"moe_router_topk": 2, **kw},
    )


def layer(cfg, **options):
    torch.manual_seed(0)
    spec = ModuleSpec(
        module=SequentialMLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    )
    return MoELayer(cfg, submodules=MoESubmodules(experts=spec, router=probmoe_router(**options)))


CASES = {
    "exact-2-softmax": (dict(), dict()),
    "range-1-4-softmax": (dict(moe_router_topk=4), dict(kmin=1)),
    "range-2-4-sigmoid-scaled": (
        dict(moe_router_topk=4, moe_router_score_function="sigmoid", moe_router_topk_scaling_factor=2.5),
        dict(kmin=2),
    ),
    "groups-pre-softmax": (
        dict(moe_router_topk=3, moe_router_num_groups=4, moe_router_group_topk=2, moe_router_pre_softmax=True),
        dict(kmin=1),
    ),
    "expert-bias": (
        dict(moe_router_topk=3, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True),
        dict(kmin=1),
    ),
}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", list(CASES))
def test_moe_layer_equals_the_dense_reference(case, training):
    cfg_fields, options = CASES[case]
    moe = layer(config(**cfg_fields), seed=3, **options).train(training)
    router = moe.router
    assert isinstance(router, ProbMoEMegatronRouter)
    if router.expert_bias is not None:
        router.expert_bias.copy_(torch.randn(E, generator=torch.Generator().manual_seed(2)) - 2.0)  # fewer drawn
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 3, H, generator=g)  # [S, B, H]
    c = torch.randn(9, 3, H, generator=g)

    def run(reference: bool):
        moe.zero_grad(set_to_none=True)
        router._generator = None  # the same draws
        xx = x.clone().requires_grad_()
        if reference:
            probs, routing_map = router(xx)  # [T, E] each
            outs = torch.stack([expert(xx.reshape(-1, H))[0] for expert in moe.experts.local_experts])  # [E, T, H]
            out = torch.einsum("te,eth->th", probs, outs).view_as(xx)
        else:
            out = moe(xx)[0]
        (out * c).sum().backward()
        return out.detach(), {"x": xx.grad, **{n: p.grad for n, p in moe.named_parameters()}}, router.last_routing

    out, got, routing = run(False)
    want_out, want, _ = run(True)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    assert got["router.weight"].abs().sum() > 0
    if options.get("kmin", router.topk) < router.topk:
        assert not routing.mask.all()  # Dynamic-k slots unused, computed at weight 0


@pytest.mark.parametrize(
    "fields",
    [
        dict(),
        dict(moe_router_pre_softmax=True),
        dict(moe_router_topk=3),
        dict(moe_router_score_function="sigmoid", moe_router_topk=3),
        dict(moe_router_score_function="sigmoid", moe_router_topk=1),
        dict(moe_router_topk_scaling_factor=2.0),
    ],
    ids=["softmax", "pre-softmax", "top3", "sigmoid-top3", "sigmoid-top1", "scaled"],
)
def test_eval_exact_k_is_megatrons_routing(fields):
    """Exact-k at eval is the MAP, top-k: Megatron's probs and routing map, to float rounding."""
    cfg = config(**fields)
    router = ProbMoEMegatronRouter(config=cfg).eval()
    x = torch.randn(50, 2, H, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        probs, routing_map = router(x)
        logits = x.reshape(-1, H) @ router.weight.T
        want_probs, want_map = topk_routing_with_score_function(
            logits,
            cfg.moe_router_topk,
            use_pre_softmax=cfg.moe_router_pre_softmax,
            scaling_factor=cfg.moe_router_topk_scaling_factor,
            score_function=cfg.moe_router_score_function,
        )
    assert torch.equal(routing_map, want_map)
    torch.testing.assert_close(probs, want_probs, rtol=1e-6, atol=1e-7)


def test_routing_map_has_kmax_experts_per_token():
    """Megatron's dropless dispatchers size their buffers as tokens × moe_router_topk: every row of the
    map has exactly kmax experts, a Dynamic-k token's unused ones at probability exactly 0."""
    router = ProbMoEMegatronRouter(config=config(moe_router_topk=5), kmin=1, seed=0).train()
    probs, routing_map = router(torch.randn(40, 2, H, generator=torch.Generator().manual_seed(5)))
    assert (routing_map.sum(-1) == 5).all()
    assert (probs[~routing_map] == 0).all()
    used = router.last_routing.selected()
    assert torch.equal(probs.detach() > 0, used) and (used.sum(-1) < 5).any()


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(moe_expert_capacity_factor=1.0), "moe_expert_capacity_factor"),
        (dict(moe_aux_loss_coeff=1e-2), "moe_aux_loss_coeff"),
        (dict(moe_z_loss_coeff=1e-3), "moe_z_loss_coeff"),
        (dict(moe_input_jitter_eps=0.01), "moe_input_jitter_eps"),
    ],
)
def test_unsupported_megatron_options_are_one_clear_error(fields, match):
    with pytest.raises(ValueError, match=match):
        ProbMoEMegatronRouter(config=config(**fields))


def test_bad_sizes():
    with pytest.raises(ValueError, match="kmin must be in 1..moe_router_topk = 2"):
        ProbMoEMegatronRouter(config=config(), kmin=3)
    cfg = config()
    cfg.moe_router_topk = 9  # kmax above the experts (TransformerConfig does not check it)
    with pytest.raises(ValueError, match="moe_router_topk"):
        ProbMoEMegatronRouter(config=cfg)
    with pytest.raises(ValueError, match="moe_router_num_groups"):
        ProbMoEMegatronRouter(config=config(moe_router_topk=3, moe_router_num_groups=4, moe_router_group_topk=1))
