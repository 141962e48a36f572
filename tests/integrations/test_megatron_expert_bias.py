"""Megatron-Core (0.16.1) updates the expert bias of ProbMoE's router itself: one training step of a
``MoELayer`` with ``moe_router_enable_expert_bias=True`` and Dynamic-k routing, then Megatron's own
``finalize_model_grads`` (one gloo rank; the layer under Megatron's ``_BaseDataParallel``, whose grad
sync is a no-op, since its ``DistributedDataParallel`` allocates its buffers on CUDA). The bias moves
exactly as ``get_updated_expert_bias`` moves it from the used-slot counts, and the counts are reset."""

import warnings

import pytest
import torch

pytest.importorskip("megatron.core")
warnings.filterwarnings("ignore", message="Transformer Engine")

from megatron.core.distributed.data_parallel_base import _BaseDataParallel  # noqa: E402
from megatron.core.distributed.finalize_model_grads import finalize_model_grads  # noqa: E402
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.transformer.mlp import MLPSubmodules  # noqa: E402
from megatron.core.transformer.moe.experts import SequentialMLP  # noqa: E402
from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules  # noqa: E402
from megatron.core.transformer.moe.moe_utils import get_updated_expert_bias  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from probmoe.integrations.megatron import ProbMoEMegatronRouter, probmoe_router  # noqa: E402

from .test_megatron import one_rank  # noqa: E402, F401 (the one gloo rank, autouse for this module too)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
E, H, F, KMAX, RATE = 8, 16, 32, 4, 0.125


def config():
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
        moe_router_topk=KMAX,
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_bias_update_rate=RATE,
    )


class OneRank(_BaseDataParallel):
    """Megatron's no-op data parallelism, with the ``force_all_reduce`` that ``finalize_model_grads``
    passes (0.16.1's ``_BaseDataParallel.finish_grad_sync`` takes no argument)."""

    def finish_grad_sync(self, force_all_reduce=False):
        pass


def layer(cfg):
    torch.manual_seed(0)
    spec = ModuleSpec(
        module=SequentialMLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    )
    return MoELayer(cfg, submodules=MoESubmodules(experts=spec, router=probmoe_router(kmin=1, seed=3)))


def test_finalize_model_grads_updates_the_bias_from_the_used_slots():
    cfg = config()
    moe = layer(cfg).train()
    router = moe.router
    bias0 = torch.randn(E, generator=torch.Generator().manual_seed(2))
    router.expert_bias.copy_(bias0)
    model = [OneRank(cfg, moe)]
    optimizer = torch.optim.SGD(moe.parameters(), lr=0.1)
    x = torch.randn(12, 4, H, generator=torch.Generator().manual_seed(1))  # [S, B, H]

    assert torch.equal(router.local_tokens_per_expert, torch.zeros(E))
    moe(x)[0].square().sum().backward()
    used = router.last_routing.selected()  # [48, E]: the experts each token uses
    counts = used.sum(0).float()
    assert torch.equal(router.local_tokens_per_expert, counts)
    assert counts.sum() < 48 * KMAX  # Dynamic-k slots went unused and were not counted
    assert len(set(counts.tolist())) > 2  # some experts above the mean, some below

    want = get_updated_expert_bias(counts.clone()[None], bias0[None], RATE)[0]  # all-reduce on one rank
    assert torch.equal(want, bias0 + RATE * torch.sign(counts.mean() - counts))
    finalize_model_grads(model)
    optimizer.step()
    assert torch.equal(router.expert_bias, want)
    assert torch.equal(router.local_tokens_per_expert, torch.zeros(E))  # reset for the next batch
    assert "local_tokens_per_expert" not in moe.state_dict() and "router.expert_bias" in moe.state_dict()


def test_counts_follow_megatrons_rules():
    """Counted under grad only (not at eval under no_grad, not in a no-grad first pass of activation
    recompute); tokens whose padding_mask is True left out, as Megatron's ``_apply_expert_bias``."""
    router = ProbMoEMegatronRouter(config=config(), kmin=1, seed=0).train()
    x = torch.randn(6, 2, H, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        router(x)
    assert torch.equal(router.local_tokens_per_expert, torch.zeros(E))
    padding = torch.zeros(6, 2, dtype=torch.bool)
    padding[4:, 1] = True  # [S, B]: the last two positions of the second sequence
    router(x, padding_mask=padding)
    used = router.last_routing.selected().view(6, 2, E)
    assert torch.equal(router.local_tokens_per_expert, used[~padding].sum(0).float())
    assert used[padding].sum() > 0  # the padded tokens were routed, not counted
    router(x)
    assert torch.equal(
        router.local_tokens_per_expert, (used[~padding].sum(0) + router.last_routing.selected().sum(0)).float()
    )


def test_bias_and_counts_stay_float32():
    """Megatron's Float16Module casts the model to bf16; the bias and the counts stay float32."""
    router = ProbMoEMegatronRouter(config=config(), kmin=1, seed=0).train().bfloat16()
    router.expert_bias.fill_(0.3)  # bf16 now
    router(torch.randn(5, 1, H, dtype=torch.bfloat16))
    assert router.expert_bias.dtype == router.local_tokens_per_expert.dtype == torch.float32
    assert router.local_tokens_per_expert.sum() == router.last_routing.mask.sum()
    router.expert_bias.fill_(0.3)  # not a bf16 number
    loaded = ProbMoEMegatronRouter(config=config()).bfloat16()
    loaded.load_state_dict(router.state_dict())
    assert torch.equal(loaded.expert_bias, torch.full((E,), 0.3))  # loaded into float32
