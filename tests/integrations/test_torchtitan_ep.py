"""Expert parallelism with the ProbMoE router, under ``torchrun --nproc-per-node 2`` on gloo (CPU):
torchtitan's own EP plan (``Module.parallelize``: experts sharded over the ranks, tokens exchanged by
all-to-all with uneven counts) equals EP = 1 (outputs and router gradients exactly, expert gradients
to bfloat16 rounding); FSDP2 + EP trains; the per-rank generator draws reproducibly and differently
on the two ranks."""

import json

import pytest

pytest.importorskip("triton")  # torchtitan imports it, also on CPU
pytest.importorskip("probmoe.integrations.torchtitan", exc_type=ImportError)

from rank_runs import run_ranks

RANK_SCRIPT = r"""
import json, os, sys, warnings
import torch
import torch.distributed as dist
warnings.filterwarnings("ignore")
from torchtitan.models.common.linear import Linear
from torchtitan.models.common.moe import GroupedExperts, MoE, RoutedExperts, TokenChoiceTopKRouter
from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher
from probmoe.integrations.torchtitan import rank_generator, router_stats, use_probmoe
from probmoe.integrations.torchtitan.parallel import expert_parallel, expert_parallel_config, use_cpu_device

where, case = sys.argv[1], sys.argv[2]
use_cpu_device()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
E, D, H, SEED = 8, 16, 24, 7
STOCK, FIELDS = {
    "range": (dict(score_func="softmax"), dict(kmin=1, top_k=5)),
    "sigmoid-groups": (dict(score_func="sigmoid", route_norm=True, route_scale=2.0, num_expert_groups=4,
                            num_limited_groups=2), dict(kmin=2, top_k=4)),
}[case]


def config():
    cfg = MoE.Config(
        num_experts=E, load_balance_coeff=1e-3,
        routed_experts=RoutedExperts.Config(inner_experts=GroupedExperts.Config(dim=D, hidden_dim=H, num_experts=E),
                                            token_dispatcher=LocalTokenDispatcher.Config(num_experts=E, top_k=2)),
        router=TokenChoiceTopKRouter.Config(num_experts=E, gate=Linear.Config(in_features=D, out_features=E),
                                            top_k=2, **STOCK))
    return use_probmoe(cfg, seed=SEED, **FIELDS)


def init(moe):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        moe.expert_bias_E.copy_(torch.randn(E, generator=g) * 0.3)  # the aux-free bias, also routed
    return moe


def data(r):
    g = torch.Generator().manual_seed(100 + r)
    L = (13, 29)[r]  # uneven: 26 and 58 tokens
    return torch.randn(2, L, D, generator=g), torch.randn(2, L, D, generator=g)


# EP = 1 on every rank: one MoE with all experts, each rank's tokens with that rank's generator
ref = init(config().build()).train()
ref_out = []
for r in range(world):
    ref.router._generator = rank_generator(SEED, rank=r)
    x, c = data(r)
    y = ref(x)
    (y * c).sum().backward()
    ref_out.append(y.detach())

# EP = 2: torchtitan's plan; this rank's tokens, this rank's generator (seeded on first use)
cfg = config()
expert_parallel_config(cfg, world)
torch.manual_seed(0)
moe = init(cfg.build()).train()
expert_parallel(moe, cfg, world)
ex = moe.routed_experts.inner_experts
assert ex.w1_EFD.to_local().shape[0] == E // world
x, c = data(rank)
y = moe(x)
(y * c).sum().backward()
routing = moe.router.last_routing
counts = torch.bincount(routing.indices[routing.mask], minlength=E)
gate_grad = moe.router.gate.weight.grad.clone()
dist.all_reduce(gate_grad)
lo = rank * (E // world)
result = {
    "out_equal": bool(torch.equal(y.detach(), ref_out[rank])),
    "out_diff": float((y.detach() - ref_out[rank]).abs().max()),
    "gate_grad_equal": bool(torch.equal(gate_grad, ref.router.gate.weight.grad)),
    "gate_grad_diff": float((gate_grad - ref.router.gate.weight.grad).abs().max()),
    # EP sums both ranks' tokens inside one bfloat16 matmul, EP = 1 adds two (each rounded to bfloat16)
    "expert_grad_rel": max(float((getattr(ex, n).grad.to_local() - want).abs().max() / want.abs().max())
                           for n in ("w1_EFD", "w2_EDF", "w3_EFD")
                           for want in [getattr(ref.routed_experts.inner_experts, n).grad[lo:lo + E // world]]),
    "expert_grads_equal_entries": sum(int((getattr(ex, n).grad.to_local() == getattr(ref.routed_experts.inner_experts,
                                          n).grad[lo:lo + E // world]).sum()) for n in ("w1_EFD", "w2_EDF", "w3_EFD")),
    "expert_grads_entries": 3 * (E // world) * D * H,
    "unused_slots": int((~routing.mask).sum()),
    "tokens_per_expert": counts.tolist(),
    "stats": router_stats(moe)["router"],
}

# the draws: the same input on both ranks draws differently; a fresh generator repeats them
same = torch.randn(1, 64, D, generator=torch.Generator().manual_seed(5))
with torch.no_grad():
    moe.router._generator = None
    a = moe.router(same)[1]
    moe.router._generator = None
    b = moe.router(same)[1]
    theirs = [torch.empty_like(a) for _ in range(world)]
    dist.all_gather(theirs, a)
result["draws_repeat"] = bool(torch.equal(a, b))
result["draws_differ_across_ranks"] = not torch.equal(theirs[0], theirs[1])

# FSDP2 + EP trains: the gate sharded over the data-parallel ranks, the experts over EP
from torch.distributed.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh
fully_shard(moe.router.gate, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",)))
opt = torch.optim.AdamW(moe.parameters(), lr=3e-2)
target = torch.tanh(x @ torch.randn(D, D, generator=torch.Generator().manual_seed(9)))
losses = []
for step in range(25):
    opt.zero_grad()
    loss = ((moe(x) - target) ** 2).mean()
    loss.backward()
    opt.step()
    t = loss.detach().clone()
    dist.all_reduce(t)
    losses.append(float(t) / world)
result["losses"] = losses
result["gate_is_sharded"] = type(moe.router.gate.weight).__name__ == "DTensor"
with open(os.path.join(where, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("case", ["range", pytest.param("sigmoid-groups", marks=pytest.mark.slow)])
def test_ep2_equals_ep1_and_fsdp_ep_trains(tmp_path, case):
    run_ranks(tmp_path, 2, RANK_SCRIPT, [case], timeout=600)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, res in enumerate(ranks):
        assert res["out_equal"], (r, res["out_diff"])
        assert res["gate_grad_equal"], (r, res["gate_grad_diff"])
        assert res["expert_grad_rel"] <= 2**-7, (r, res["expert_grad_rel"])  # bfloat16 rounding, twice
        assert res["unused_slots"] > 0  # Dynamic-k: padded slots went through the all-to-all
        assert res["draws_repeat"] and res["draws_differ_across_ranks"]
        assert res["gate_is_sharded"]
        assert res["losses"][-1] < 0.7 * res["losses"][0], res["losses"]
        assert 1 <= res["stats"]["experts_per_token"] <= 5
    assert ranks[0]["tokens_per_expert"] != ranks[1]["tokens_per_expert"]  # uneven counts
    assert ranks[0]["losses"] == ranks[1]["losses"]
