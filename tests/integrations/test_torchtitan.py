"""ProbMoE in torchtitan 0.3.0 (one process): the router subclass and its config, the one-call swap,
torchtitan's MoE against the dense reference forward and backward, the aux-free bias, bad input.
The expert-parallel tests (torchrun, 2 ranks) are in test_torchtitan_ep.py."""

import dataclasses

import pytest
import torch

pytest.importorskip("triton")  # torchtitan imports it, also on CPU
tt = pytest.importorskip("probmoe.integrations.torchtitan", exc_type=ImportError)

from torchtitan.models.common.linear import Linear  # noqa: E402
from torchtitan.models.common.moe import GroupedExperts, MoE, RoutedExperts, TokenChoiceTopKRouter  # noqa: E402
from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher  # noqa: E402

from probmoe.integrations.torchtitan import ProbMoERouter, use_probmoe, version  # noqa: E402
from probmoe.integrations.torchtitan.reference import dense_moe  # noqa: E402

E, D, H = 8, 16, 24

pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast")  # the stock router's, on CPU


def moe_config(top_k=3, score_func="softmax", **router):
    return MoE.Config(
        num_experts=E,
        load_balance_coeff=1e-3,
        routed_experts=RoutedExperts.Config(
            inner_experts=GroupedExperts.Config(dim=D, hidden_dim=H, num_experts=E),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=E, top_k=top_k),
        ),
        router=TokenChoiceTopKRouter.Config(
            num_experts=E,
            gate=Linear.Config(in_features=D, out_features=E),
            top_k=top_k,
            score_func=score_func,
            **router,
        ),
    )


def built(cfg, seed=0):
    torch.manual_seed(seed)
    moe = cfg.build()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return moe


CASES = {
    "exact-3-softmax": (dict(top_k=3), dict()),
    "range-1-5-softmax": (dict(top_k=3), dict(kmin=1, top_k=5)),
    "range-2-6-sigmoid-norm-scale": (
        dict(top_k=3, score_func="sigmoid", route_norm=True, route_scale=2.5),
        dict(kmin=2, top_k=6),
    ),
    "group-limited-exact": (dict(top_k=3, num_expert_groups=4, num_limited_groups=2), dict()),
    "group-limited-range": (
        dict(top_k=4, num_expert_groups=4, num_limited_groups=2, score_func="sigmoid"),
        dict(kmin=1),
    ),
}


def grads(moe, x, c, expert_bias, *, reference: bool):
    """(output, {name: gradient}) of Σ c · out through torchtitan's MoE or the dense reference, the router
    drawing from a fresh generator of the same seed each time."""
    moe.zero_grad(set_to_none=True)
    moe.router._generator = None  # re-seeded on first use: the same draws
    x = x.clone().requires_grad_()
    if expert_bias is not None:
        moe.expert_bias_E.copy_(expert_bias)
    if reference:
        w, idx, _ = moe.router(x, moe.expert_bias_E)
        ex = moe.routed_experts.inner_experts
        out = dense_moe(x, w, idx, ex.w1_EFD, ex.w2_EDF, ex.w3_EFD)
    else:
        out = moe(x)
    (out * c).sum().backward()
    return out.detach(), {"x": x.grad, **{n: p.grad for n, p in moe.named_parameters()}}, moe.router.last_routing


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "expert-bias"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", list(CASES))
def test_moe_equals_the_dense_reference(case, training, bias):
    stock, probmoe_fields = CASES[case]
    cfg = use_probmoe(moe_config(**stock), seed=11, **probmoe_fields)
    moe = built(cfg).train(training)
    assert isinstance(moe.router, ProbMoERouter)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 37, D, generator=g)  # 111 tokens
    c = torch.randn(3, 37, D, generator=g)
    b = torch.randn(E, generator=g) if bias else None
    out, got, routing = grads(moe, x, c, b, reference=False)
    want_out, want, routing2 = grads(moe, x, c, b, reference=True)
    assert torch.equal(routing.indices, routing2.indices)  # the same draws
    K = moe.router.top_k
    assert routing.indices.shape == (111, K)
    if probmoe_fields.get("kmin", K) < K:
        assert not routing.mask.all()  # Dynamic-k: unused slots exist, and must not break the MoE
    # fp32 rounding: the experts run in bfloat16 in both, the same products per token and expert
    # (measured: the outputs bit for bit, the gate's and x's gradients within 2e-7 of their largest
    # entry); the experts' gradients sum over their tokens inside one bfloat16 matmul, T rows here
    # and only the routed ones there: equal to bfloat16 rounding (most bit for bit)
    assert (out - want_out).abs().max() <= 1e-6 * want_out.abs().max()
    for name, grad in want.items():
        tol = 2**-7 * grad.abs() if "experts" in name else 0.0  # one bfloat16 ulp of each entry
        assert ((got[name] - grad).abs() <= tol + 1e-6 * grad.abs().max()).all(), name
    assert got["router.gate.weight"].abs().sum() > 0


def test_the_former_padding_breaks_torchtitan():
    """Why the routing contract has distinct ids: unused slots repeating slot 0's expert make MoE's
    boolean routing map undercount, and the output is wrong (the dense reference adds the weights)."""
    cfg = use_probmoe(moe_config(), kmin=1, top_k=5, seed=2)
    moe = built(cfg).train()
    x = torch.randn(2, 20, D, generator=torch.Generator().manual_seed(3))
    real = ProbMoERouter.forward

    def padded(self, x, bias=None):
        w, idx, scores = real(self, x, bias)
        used = self.last_routing.mask.view(idx.shape)
        return w, torch.where(used, idx, idx[..., :1]), scores

    with torch.no_grad():
        out = moe(x)
        moe.router._generator = None
        ProbMoERouter.forward = padded
        try:
            bad = moe(x)
        finally:
            ProbMoERouter.forward = real
    assert not torch.allclose(out, bad, rtol=0, atol=1e-2)  # wrong (grouped_mm rows past the offsets: garbage)


def test_expert_bias_moves_the_draws_not_the_weights():
    cfg = use_probmoe(moe_config(top_k=2), seed=5)
    moe = built(cfg).train()
    x = torch.randn(1, 400, D, generator=torch.Generator().manual_seed(4))
    b = torch.zeros(E)
    b[7] = 6.0  # expert 7 drawn for nearly every token ...
    w, idx, scores = moe.router(x, b)
    routing = moe.router.last_routing
    assert (idx == 7).any(-1).float().mean() > 0.9
    pi = torch.softmax(moe.router.gate(x).float(), -1)  # ... but weighted by its unbiased score
    torch.testing.assert_close(w, pi.gather(-1, idx), rtol=1e-6, atol=0)
    torch.testing.assert_close(scores, pi, rtol=1e-6, atol=0)
    assert routing.mask.all()
    # a zero bias is no bias: the same weights and gradients
    moe.router._generator = None
    w0, _, _ = moe.router(x, torch.zeros(E))
    moe.router._generator = None
    w1, _, _ = moe.router(x, None)
    gw = torch.randn(w0.shape, generator=torch.Generator().manual_seed(1))
    g0 = torch.autograd.grad((w0 * gw).sum(), moe.router.gate.weight)[0]
    g1 = torch.autograd.grad((w1 * gw).sum(), moe.router.gate.weight)[0]
    torch.testing.assert_close(w0, w1, rtol=1e-6, atol=0)
    torch.testing.assert_close(g0, g1, rtol=1e-5, atol=1e-7)


def test_load_counter_counts_used_slots_only():
    cfg = use_probmoe(moe_config(), kmin=1, top_k=5, seed=4)
    moe = built(cfg).train()
    x = torch.randn(2, 30, D, generator=torch.Generator().manual_seed(6))
    moe(x)
    routing = moe.router.last_routing
    every_slot = torch.bincount(routing.indices.flatten(), minlength=E).float()
    assert torch.equal(moe.tokens_per_expert_E, every_slot)  # torchtitan counts the unused slots too
    assert not routing.mask.all()
    moe.tokens_per_expert_E.zero_()
    handles = tt.count_used_slots(moe)
    moe(x)
    routing = moe.router.last_routing
    assert torch.equal(moe.tokens_per_expert_E, routing.selected().sum(0).float())
    with torch.no_grad():
        moe.eval()(x)  # eval forwards count nothing, before or after
    assert torch.equal(moe.tokens_per_expert_E, routing.selected().sum(0).float())
    for h in handles:
        h.remove()


def test_eval_is_the_stock_top_k_for_exact_k():
    """Exact-k softmax at eval is the MAP = the stock router's top-k (same experts, same weights)."""
    stock = built(moe_config(top_k=3)).eval()
    ours = built(use_probmoe(moe_config(top_k=3))).eval()
    x = torch.randn(2, 30, D, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        w0, i0, s0 = stock.router(x)
        w1, i1, s1 = ours.router(x)
        i0s, order = i0.sort(-1)
        i1s, order1 = i1.sort(-1)
        assert torch.equal(i0s, i1s)
        torch.testing.assert_close(w0.gather(-1, order), w1.gather(-1, order1), rtol=1e-6, atol=0)
        torch.testing.assert_close(stock(x), ours(x), rtol=1e-5, atol=1e-6)


def test_swap_keeps_every_stock_field_and_the_model_builds():
    from torchtitan.models.deepseek_v3 import model_registry

    spec = model_registry("debugmodel")
    cfg = spec.model
    routers = [c for _, c, _, _ in cfg.traverse(TokenChoiceTopKRouter.Config)]
    assert routers and not any(isinstance(r, ProbMoERouter.Config) for r in routers)
    before = [{f.name: getattr(r, f.name) for f in dataclasses.fields(r)} for r in routers]
    out = use_probmoe(cfg, kmin=1, seed=0)
    assert out is cfg
    swapped = [c for _, c, _, _ in cfg.traverse(TokenChoiceTopKRouter.Config)]
    assert len(swapped) == len(routers) and all(isinstance(r, ProbMoERouter.Config) for r in swapped)
    for old, new in zip(before, swapped):
        for key, value in old.items():
            assert getattr(new, key) is value or getattr(new, key) == value, key
        assert new.kmin == 1 and new.seed == 0
    for _, moe, _, _ in cfg.traverse(MoE.Config):
        assert moe.routed_experts.token_dispatcher.top_k == moe.router.top_k
    with torch.device("meta"):
        model = cfg.build()
    assert sum(isinstance(m, ProbMoERouter) for m in model.modules()) == len(routers)


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(top_k=9), "top_k"),  # kmax above the experts
        (dict(top_k=0), "top_k"),
        (dict(kmin=4, top_k=3), "kmin"),
        (dict(kmin=0), "kmin"),
        (dict(method="dense"), "method"),
        (dict(backend="gpu"), "backend"),
        (dict(seed=-1), "seed"),
    ],
)
def test_bad_router_values_fail_when_the_config_is_made(fields, match):
    with pytest.raises(ValueError, match=match):
        use_probmoe(moe_config(), **fields)


def test_bad_group_values():
    with pytest.raises(ValueError, match="num_expert_groups"):
        use_probmoe(moe_config(num_expert_groups=3, num_limited_groups=1))
    with pytest.raises(ValueError, match="num_limited_groups"):
        use_probmoe(moe_config(num_expert_groups=4, num_limited_groups=5))
    with pytest.raises(ValueError, match="do not fit"):
        use_probmoe(moe_config(top_k=3, num_expert_groups=4, num_limited_groups=1))


def test_expert_parallel_degree_must_divide_the_experts():
    with pytest.raises(ValueError, match=r"expert_parallel_degree = 3 must divide num_experts = 8"):
        use_probmoe(moe_config(), expert_parallel_degree=3)
    with pytest.raises(ValueError, match="expert_parallel_degree"):
        tt.check_expert_parallel(8, 0)
    use_probmoe(moe_config(), expert_parallel_degree=4)


def test_unsupported_torchtitan_versions_are_one_clear_error():
    for found in ("0.2.0", "0.4.0", "0.3.0.dev20260101"):
        with pytest.raises(ImportError, match=rf"torchtitan==0\.3\.0 only, found torchtitan {found}"):
            version.check(found)
    with pytest.raises(ImportError, match="not installed"):
        version.check(None)
    version.check("0.3.0")


def test_a_config_without_routers_is_an_error():
    with pytest.raises(ValueError, match="no TokenChoiceTopKRouter"):
        use_probmoe(GroupedExperts.Config(dim=D, hidden_dim=H, num_experts=E))


def test_rank_seeds_differ_and_repeat():
    assert tt.rank_seed(7, 0) != tt.rank_seed(7, 1) != tt.rank_seed(8, 0)
    a = torch.rand(4, generator=tt.rank_generator(7, rank=1))
    b = torch.rand(4, generator=tt.rank_generator(7, rank=1))
    assert torch.equal(a, b)
