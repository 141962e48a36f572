"""Routing as registered torch operators: ``torch.library.opcheck`` for every operator, zero graph
breaks for ``route`` under ``torch._dynamo.explain``, and compiled routing equal to eager routing
(the same draws from the same global seed, the same gradients)."""

from __future__ import annotations

import pytest
import torch

import circuits
import probmoe

CASES = {
    "exactly 8": dict(k=8),
    "range 4..8": dict(kmin=4, kmax=8),
    "group-limited": dict(constraint=circuits.GroupLimited(64, 8, groups=8, max_groups=4)),
}


def logits(T=64, N=64, seed=0, dtype=torch.float32):
    return torch.randn(T, N, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- opcheck: schema, fake implementation, autograd registration, aot dispatch --------------------
ALIVE = []


def chosen_slots(slots: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices [7, slots] int32 (distinct per row, unused slots too) and their mask [7, slots], as
    ``chosen_scores`` makes them."""
    idx = torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(t))[:slots] for t in range(7)])
    mask = torch.arange(slots) < torch.tensor([slots, 2, 3, slots, 1, slots, 2]).clamp(max=slots).unsqueeze(-1)
    return idx.to(torch.int32), mask


def circuit_samples(dtype):
    """(op, args) pairs over an exactly-k and a range circuit (an unsmooth one), r with and without grad."""
    out = []
    for spec, (kmin, kmax) in ((circuits.ExactlyK(12, 3), (3, 3)), (circuits.RangeK(12, 2, 5), (2, 5))):
        c = circuits.compile_circuit(spec)
        ALIVE.append(c)  # an operator's handle is valid while its circuit lives
        r = logits(7, 12, dtype=dtype).requires_grad_()
        shift = c._shift(r.detach())
        seed = circuits.ops.seed(None, r)
        v = torch.randn(7, 12, dtype=dtype)
        out += [
            (torch.ops.circuits.log_partition.default, (r, c.handle, True)),
            (torch.ops.circuits.log_partition.default, (r.detach(), c.handle, False)),
            (torch.ops.circuits.marginals.default, (r, shift, seed, c.handle, True, False)),
            (torch.ops.circuits.marginals.default, (r, shift, None, c.handle, False, True)),
            (torch.ops.circuits.marginals_jvp.default, (r.detach(), shift, v, c.handle)),
            (torch.ops.circuits.sample.default, (r.detach(), shift, seed, c.handle)),
            (torch.ops.circuits.map.default, (r.detach(), shift, c.handle)),
            (torch.ops.circuits.chosen_scores.default, (r, seed, kmin, kmax, c.handle, kmax, "softmax", False)),
            (
                torch.ops.circuits.chosen_scores_backward.default,
                (
                    r.detach(),
                    *chosen_slots(kmax, 12),
                    torch.randn(7, kmax, dtype=dtype),
                    kmin,
                    kmax,
                    c.handle,
                    "sigmoid",
                    kmin == kmax,
                ),
            ),
        ]
    x = logits(9, 10, dtype=dtype).round(decimals=1)  # ties
    out += [(torch.ops.circuits.kth_largest.default, (x, 3)), (torch.ops.circuits.topk.default, (x, 4))]
    z = (torch.rand(9, 10, generator=torch.Generator().manual_seed(2)) < 0.4).to(dtype)
    out += [(torch.ops.circuits.topk_chosen.default, (z, torch.softmax(x, -1), 4))]
    r = logits(7, 10, dtype=dtype).requires_grad_()
    dps = {size: circuits.CardinalityDP(circuits.RangeK(10, *size)) for size in ((2, 4), (3, 3))}
    ALIVE.extend(dps.values())  # the chosen_scores operators take a DP's handle
    out += [
        (torch.ops.circuits.dp_marginals.default, (r, circuits.ops.seed(None, r), 2, 4, True)),
        (torch.ops.circuits.dp_marginals.default, (r, None, 3, 3, False)),
        (torch.ops.circuits.dp_cov_vec.default, (r.detach(), torch.randn(7, 10, dtype=dtype), 2, 4)),
        (torch.ops.circuits.dp_log_counts.default, (r, 2, 4, False)),
        (torch.ops.circuits.dp_log_counts.default, (r, 3, 3, True)),
        (torch.ops.circuits.dp_log_counts_backward.default, (r.detach(), torch.randn(7, 3, dtype=dtype), 2, 4, True)),
        (
            torch.ops.circuits.chosen_scores.default,
            (r, circuits.ops.seed(None, r), 2, 4, dps[2, 4].handle, 4, "softmax", False),
        ),
        (
            torch.ops.circuits.chosen_scores.default,
            (r, circuits.ops.seed(None, r), 3, 3, dps[3, 3].handle, 3, "sigmoid", True),
        ),
    ]
    for kind, paper in [("softmax", False), ("sigmoid", True)]:
        out.append(
            (
                torch.ops.circuits.chosen_scores_backward.default,
                (r.detach(), *chosen_slots(4, 10), torch.randn(7, 4, dtype=dtype), 2, 4, dps[2, 4].handle, kind, paper),
            )
        )
    group = circuits.GroupDP(circuits.GroupLimited(10, None, [4, 3, 3], 2, kmin=1, kmax=4))
    ALIVE.append(group)  # the circuit operators and the group log counts take its handle
    seed = circuits.ops.seed(None, r)
    out += [
        (torch.ops.circuits.log_partition.default, (r, group.handle, True)),
        (torch.ops.circuits.marginals.default, (r, None, seed, group.handle, True, False)),
        (torch.ops.circuits.marginals_jvp.default, (r.detach(), None, torch.randn(7, 10, dtype=dtype), group.handle)),
        (torch.ops.circuits.sample.default, (r.detach(), None, seed, group.handle)),
        (torch.ops.circuits.map.default, (r.detach(), None, group.handle)),
        (torch.ops.circuits.chosen_scores.default, (r, seed, 1, 4, group.handle, 4, "softmax", False)),
        (torch.ops.circuits.group_log_counts.default, (r, group.handle, 1, 4, False)),
        (torch.ops.circuits.group_log_counts.default, (r, group.handle, 1, 4, True)),
        (
            torch.ops.circuits.group_log_counts_backward.default,
            (r.detach(), torch.randn(7, 4, dtype=dtype), group.handle, True),
        ),
    ]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_opcheck_every_operator(dtype):
    # the random operators draw fresh samples per call: opcheck compares repeated calls, so their
    # seed is a fixed tensor here (as it is within one routing call)
    for op, args in circuit_samples(dtype):
        torch.library.opcheck(op, args)
    torch.library.opcheck(
        torch.ops.circuits.draw_seed.default, (logits(),), test_utils=("test_schema", "test_faketensor")
    )


def test_every_operator_is_checked():
    """A new operator gets an opcheck sample above (or this test fails)."""
    from torch._library.custom_ops import CustomOpDef

    registered = {
        v._qualname for module in (circuits.ops,) for v in vars(module).values() if isinstance(v, CustomOpDef)
    }
    checked = {op.name().removesuffix(".default") for op, _ in circuit_samples(torch.float32)} | {"circuits::draw_seed"}
    assert registered == checked


# --- no graph breaks -----------------------------------------------------------------------------------
@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
@pytest.mark.parametrize("backend", ["circuit", "dp"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_route_has_no_graph_break(case, backend, training):
    x = logits().requires_grad_()

    def f(x):
        # value checks on (importing torch._dynamo turns torch.distributions' default off)
        return probmoe.route(x, **CASES[case], training=training, backend=backend, validate_args=True).weights

    f(x)  # compiles the circuit (a graph break on a cold cache only)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(f)(x)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.parametrize("validate", [False, True])
def test_circuit_queries_have_no_graph_break(validate):
    """A circuit's own checks (validate = True) are assertions in the graph, not host reads."""
    c = circuits.compile_circuit(circuits.RangeK(16, 2, 5))
    c.validate = validate

    def f(x):
        c.check_satisfiable(x)
        return c.log_partition(x).sum() + c.marginals(x).sum() + c.sample(x).sum() + c.map(x).sum()

    explained = torch._dynamo.explain(f)(logits(8, 16))
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


def test_compiled_circuit_checks_raise_inside_the_graph():
    """The circuit's checks in a compiled graph stop NaN, +inf and rows that satisfy nothing, with
    the eager messages (RuntimeError from the assertion; the row is not named)."""
    torch._dynamo.reset()
    c = circuits.compile_circuit(circuits.RangeK(16, 2, 5))
    f = torch.compile(lambda x: c.marginals(x), fullgraph=True, backend="aot_eager")
    g = torch.compile(lambda x: c.check_satisfiable(x), fullgraph=True, backend="aot_eager")
    x = logits(8, 16)
    torch.testing.assert_close(f(x), c.marginals(x))
    for bad, match in [(float("nan"), "logits contain NaN"), (float("inf"), r"logits contain \+inf")]:
        y = x.clone()
        y[3, 5] = bad
        with pytest.raises(ValueError, match=match):
            c.marginals(y)
        with pytest.raises(RuntimeError, match=match):
            f(y)
    y = x.clone()
    y[6, 1:] = -torch.inf  # one expert left, at least 2 to choose
    for call in (f, g):
        with pytest.raises(RuntimeError, match=r"some row of the logits makes the constraint .* unsatisfiable"):
            call(y)
    with pytest.raises(ValueError, match="unsatisfiable at row 6: no subset of its 1 finite logits"):
        c.check_satisfiable(y)


# --- compiled equals eager ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["circuit", "dp"])
@pytest.mark.parametrize("case", ["exactly 8", "range 4..8"])
def test_compiled_route_equals_eager(case, backend, device):
    """fullgraph=True: the same draws from the same global seed (the seed is drawn by an operator),
    the same weights and the same logit gradients. On the CPU through aot_eager (tracing and
    autograd, no C++ build); on CUDA through inductor, whose Triton code is what users run."""
    torch._dynamo.reset()
    weights = torch.randn(64, 8, device=device)

    def f(x):
        out = probmoe.route(x, **CASES[case], training=True, backend=backend)
        return out.indices, out.weights, (out.weights * weights).sum()

    compiled = torch.compile(f, fullgraph=True, backend="inductor" if device.type == "cuda" else "aot_eager")
    results = []
    for fn in (f, compiled):
        x = logits(seed=3).to(device).requires_grad_()
        torch.manual_seed(11)
        idx, w, loss = fn(x)
        (grad,) = torch.autograd.grad(loss, x)
        results.append((idx, w.detach(), grad))
    (i0, w0, g0), (i1, w1, g1) = results
    assert torch.equal(i0, i1)
    torch.testing.assert_close(w1, w0, atol=1e-6, rtol=0)
    torch.testing.assert_close(g1, g0, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", ["circuit", "dp"])
def test_compiled_route_follows_changing_sizes(backend):
    """One compiled function called with other token counts, expert counts and k: dynamo makes a
    changed size a symbol, and each size must still route with its own circuit (a symbolic size
    cannot pick one) and equal eager routing."""
    torch._dynamo.reset()

    def f(x, k):
        return probmoe.route(x, k=k, training=True, backend=backend).weights

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for T, N, k in [(64, 64, 8), (64, 64, 4), (32, 128, 8), (48, 16, 3), (80, 64, 8)]:
        x = logits(T, N, seed=T + N + k)
        torch.manual_seed(5)
        want = f(x, k)
        torch.manual_seed(5)
        torch.testing.assert_close(compiled(x, k), want, atol=1e-6, rtol=0)


def test_compiled_validation_raises_inside_the_graph():
    """Value checks are asynchronous assertions in a compiled graph: no graph break, and NaN logits
    still stop the call (a RuntimeError naming the problem); validate_args=False leaves them out."""
    torch._dynamo.reset()
    f = torch.compile(
        lambda x: probmoe.route(x, k=8, training=False, validate_args=True).weights, fullgraph=True, backend="aot_eager"
    )
    x = logits()
    f(x)
    x[3, 5] = float("nan")
    with pytest.raises(RuntimeError, match="logits contain NaN"):
        f(x)
    x[3, 5] = 0.0
    x[7, 4:] = -torch.inf  # 4 experts left, 8 to choose
    with pytest.raises(RuntimeError, match="fewer than kmin = 8 experts above -inf"):
        f(x)
    g = torch.compile(
        lambda x: probmoe.route(x, k=8, training=False, validate_args=False).weights,
        fullgraph=True,
        backend="aot_eager",
    )
    assert g(x).shape == (64, 8)  # garbage in, no check


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_patched_decoder_layer_compiles_with_fullgraph(device):
    """A patched tiny OLMoE decoder layer, forward + backward, compiled with fullgraph=True (inductor),
    equals the eager layer: the same draws, output and router gradient."""
    pytest.importorskip("transformers", minversion="5.0")
    import probmoe.integrations.transformers as pt
    from probmoe.integrations.transformers.testing import tiny_model

    torch._dynamo.reset()
    model = pt.patch_model(tiny_model("olmoe").to(device), "probmoe").train()
    layer = model.model.layers[0]
    h = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0)).to(device)
    positions = torch.arange(8, device=device).unsqueeze(0)
    emb = model.model.rotary_emb(h, positions)

    def step(fn):
        layer.zero_grad()
        torch.manual_seed(5)
        out = fn(h, position_embeddings=emb, attention_mask=None)
        out = out[0] if isinstance(out, tuple) else out
        out.square().mean().backward()
        return out.detach(), layer.mlp.gate.weight.grad.clone()

    want_out, want_grad = step(layer)
    got_out, got_grad = step(torch.compile(layer, fullgraph=True))
    torch.testing.assert_close(got_out, want_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=1e-4)
    assert want_grad.abs().sum() > 0


def test_two_compiled_draws_take_two_seeds():
    """Two routing calls in one graph draw two seeds, as eagerly (a compiler once merged two
    draw_seed calls with equal arguments into one, so every router drew from the same seed)."""
    torch._dynamo.reset()

    def f(a, b):
        return (probmoe.route(a, k=8, training=True).indices, probmoe.route(b, k=8, training=True).indices)

    a, b = logits(seed=1), logits(seed=1) * 1.0  # equal logits: only the seeds can tell the draws apart
    torch.manual_seed(2)
    want = f(a, b)
    torch.manual_seed(2)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(a, b)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.equal(want[0], want[1])
