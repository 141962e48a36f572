"""tools/grad_variance.py: the exact-gradient oracle, the metrics, the estimators' forward values, the command."""

import itertools
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from tool_modules import load_tool

import probmoe

gv = load_tool("grad_variance")
TOOL = gv.__file__


def reinforce_draws(problem, k, samples, generator):
    """Unbiased single-draw gradients of the ProbMoE expected loss: [samples, T, n].

    S ~ P(S | r) from ``probmoe.SubsetDistribution``; the gradient of L(S, r) with S held fixed
    (the path through softmax) plus the score-function term L(S, r) ∇_r log P(S | r).
    """
    tokens, n = problem.logits.shape
    r = problem.logits.repeat(samples, 1).requires_grad_()
    dist = probmoe.SubsetDistribution(r, k=k, backend="dp")
    z = dist.sample(generator=generator)
    losses = gv.token_losses((z * torch.softmax(r, dim=-1)).view(samples, tokens, n), problem.experts, problem.targets)
    surrogate = losses.sum() + (losses.detach().flatten() * dist.log_prob(z)).sum()
    return torch.autograd.grad(surrogate, r)[0].view(samples, tokens, n)


@pytest.mark.parametrize("probs", [gv.probmoe_probs, gv.gumbel_topk_probs])
def test_exact_gradient_matches_finite_differences(probs):
    problem = gv.make_problem(seed=3, n=5, tokens=2, dim=3)
    exact = gv.exact_gradient(problem, 2, probs)
    masks, h = gv.subset_masks(5, 2), 1e-6
    numeric = torch.zeros_like(exact)
    for t, i in itertools.product(range(2), range(5)):
        step = torch.zeros_like(problem.logits)
        step[t, i] = h
        up, down = (
            gv.expected_loss(problem.logits + s, problem.experts, problem.targets, masks, probs) for s in (step, -step)
        )
        numeric[t, i] = (up - down) / (2 * h)
    torch.testing.assert_close(exact, numeric, rtol=1e-7, atol=1e-8)
    assert exact.abs().min() > 1e-4  # every entry is checked, none is trivially 0


def test_subset_distributions_against_enumeration():
    logits = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    masks = gv.subset_masks(5, 2)
    assert masks.shape == (math.comb(5, 2), 5) and bool((masks.sum(1) == 2).all())
    scores = logits @ masks.T  # Σ_{i∈S} r_i
    torch.testing.assert_close(gv.probmoe_probs(logits, masks), scores.exp() / scores.exp().sum(-1, keepdim=True))
    # Gumbel top-k = drawing k experts without replacement from softmax(r): sum over the orders of each subset
    pi = torch.softmax(logits, dim=-1)
    plackett_luce = torch.zeros(3, len(masks), dtype=torch.float64)
    for c, row in enumerate(masks):
        for a, b in itertools.permutations(row.nonzero().flatten().tolist()):
            plackett_luce[:, c] += pi[:, a] * pi[:, b] / (1 - pi[:, a])
    torch.testing.assert_close(gv.gumbel_topk_probs(logits, masks), plackett_luce, rtol=1e-12, atol=1e-14)


def test_estimator_forward_values_and_draws():
    """Every estimator's weights have the value z ⊙ softmax(r) with |z| = k; Gumbel-ST's subsets follow
    the Gumbel-top-k probabilities; the two ProbMoE rows draw the same subsets from one seed."""
    logits = torch.randn(1, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64).repeat(40_000, 1)
    pi = torch.softmax(logits, dim=-1)
    weights = {
        name: est(logits, 2, torch.Generator().manual_seed(7)).detach()
        for name, est in gv.estimators(0.5).items()
        if name not in ("defaultmoe", "sparsemixer", "remoe")
    }
    for name, w in weights.items():
        z = (w > 0).double()
        assert bool((z.sum(-1) == 2).all()), name
        torch.testing.assert_close(w, z * pi, rtol=0, atol=0, msg=name)
    assert torch.equal(weights["probmoe"], weights["probmoe-exact"])
    assert torch.equal(weights["densemixer"][0], (pi[0] >= pi[0].topk(2).values[-1]) * pi[0])
    masks = gv.subset_masks(4, 2)
    counts = ((weights["gumbel-st"] > 0).double() @ masks.T == 2).double().sum(0)  # draws of each subset
    expected = gv.gumbel_topk_probs(logits[:1], masks)[0] * len(logits)
    assert float(((counts - expected).abs() / expected.sqrt()).max()) < 5  # within 5 standard deviations


def test_defaultmoe_and_sparsemixer_rows():
    """DefaultMoE: DenseMixer's forward value; its gradient adds <∂L/∂y, Ê_i> at the unselected
    experts, Ê_i the mean output of i over the tokens that selected it. SparseMixer: k distinct
    experts, each weight at most the expert's softmax over all scores' band (so at most 1)."""
    problem = gv.make_problem(seed=3, n=5, tokens=4, dim=3)
    logits = problem.logits.clone().requires_grad_()
    weights, extra = gv.defaultmoe_weights(logits, 2, None, problem.experts)
    dense = gv.densemixer_weights(problem.logits, 2, None)
    assert torch.equal(weights.detach(), dense) and torch.equal(extra.detach(), torch.zeros(4, 3, dtype=torch.float64))
    grads = gv.draws(problem, gv.defaultmoe_weights, 2, 1, None)[0]  # [T, n]
    pi = torch.softmax(problem.logits, -1)
    chosen = pi.topk(2, -1).indices
    mask = torch.zeros_like(pi).scatter(1, chosen, 1.0)
    defaults = torch.stack(
        [
            problem.experts[mask[:, i] > 0, i].mean(0) if mask[:, i].any() else torch.zeros(3, dtype=torch.float64)
            for i in range(5)
        ]
    )
    y = torch.einsum("tn,tnd->td", mask * pi, problem.experts)
    dy = 2 * (y - problem.targets)  # [T, d]
    g_pi = torch.where(mask > 0, torch.einsum("td,tnd->tn", dy, problem.experts), dy @ defaults.T)  # dL/dπ
    want = pi * (g_pi - (pi * g_pi).sum(-1, keepdim=True))  # through the softmax
    torch.testing.assert_close(grads, want)
    w = gv.sparsemixer_weights(problem.logits.repeat(50, 1), 2, torch.Generator().manual_seed(0))
    assert bool(((w > 0).sum(-1) == 2).all()) and bool((w <= 1).all())


def test_remoe_row_is_the_gradient_of_its_relu_gated_loss():
    """ReMoE: weights ReLU(r) over every expert; its one (deterministic) gradient is that of
    Σ_t ||Σ_i ReLU(r_ti) f_i - y_t||², worked out by hand: 2 <y - target, f_i> where r_ti > 0, else 0."""
    problem = gv.make_problem(seed=4, n=5, tokens=4, dim=3)
    grads = gv.draws(problem, gv.remoe_weights, 2, 3, None)  # [3, T, n]: three identical draws
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])
    gates = torch.relu(problem.logits)
    y = torch.einsum("tn,tnd->td", gates, problem.experts)
    want = torch.einsum("td,tnd->tn", 2 * (y - problem.targets), problem.experts) * (problem.logits > 0)
    torch.testing.assert_close(grads[0], want)


def test_reinforce_converges_where_probmoe_stays_biased():
    """The oracle and the bias metric can tell: an unbiased estimator's bias falls to the Monte Carlo
    floor with many draws, while the straight-through estimator's stays well above it."""
    problem = gv.make_problem(seed=0, n=6, tokens=3, dim=4)
    exact = gv.exact_gradient(problem, 3)
    reinforce = reinforce_draws(problem, 3, 100_000, torch.Generator().manual_seed(0))
    unbiased = gv.metrics(reinforce, exact)
    probmoe_row = gv.metrics(
        gv.draws(problem, gv.estimators(1.0)["probmoe-exact"], 3, 100_000, torch.Generator().manual_seed(0)), exact
    )
    assert unbiased["bias"] < 2e-4
    assert probmoe_row["bias"] > 10 * unbiased["bias"]
    # a wrong oracle is caught too: against the Gumbel-top-k objective the same draws are far off
    # (6-11x the Monte Carlo floor over generator seeds 0..5)
    wrong = gv.exact_gradient(problem, 3, gv.gumbel_topk_probs)
    assert gv.metrics(reinforce, wrong)["bias"] > 4 * unbiased["bias"]


def test_metrics_by_hand():
    exact = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    draws = torch.tensor([[[1.0, 1.0]], [[1.0, -1.0]]], dtype=torch.float64)  # mean [1, 0]: no bias
    out = gv.metrics(draws, exact)
    assert out["bias"] == pytest.approx(0.0, abs=1e-15)
    assert out["variance"] == pytest.approx(0.0, abs=1e-15)  # both at cos 1/√2 to the mean
    assert out["error"] == pytest.approx(1 - 2**-0.5)
    assert out["mse"] == pytest.approx(1.0)


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_command_writes_the_json(tmp_path):
    path = tmp_path / "out.json"
    root = os.path.dirname(os.path.dirname(os.path.abspath(TOOL)))  # this checkout's probmoe, not an installed one
    run = subprocess.run(
        [sys.executable, TOOL, "--samples", "200", "--seeds", "2", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert run.returncode == 0, run.stderr
    assert "| gumbel-st (own objective) |" in run.stdout
    data = json.loads(path.read_text())
    assert list(data) == ["probmoe", "probmoe-exact", "densemixer", "defaultmoe", "sparsemixer", "remoe", "gumbel-st"]
    for row in data.values():
        assert list(row) == ["bias", "variance", "error"]
        assert all(type(v) is float and math.isfinite(v) for v in row.values())


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--k", "10"], "--k must be 1..9, got 10"),
        (["--n", "6", "--k", "0"], "--k must be 1..5, got 0"),
        (["--samples", "1"], "--samples must be >= 2, got 1"),
        (["--seeds", "1"], "--seeds must be >= 2, got 1"),
        (["--n", "17"], f"--n must be 2..{gv.MAX_N}, got 17"),
        (["--tau", "0"], "--tau must be a positive finite number, got 0.0"),
        (["--tokens", "x"], "argument --tokens: invalid int value: 'x'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as stop:
        gv.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_metrics_axes_by_hand():
    """per-token: cosines over each token's n logits, averaged; token-axis: over the T tokens of each expert."""
    exact = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)  # [T=2, n=2]
    draws = torch.tensor([[[1.0, 1.0], [0.0, 1.0]], [[1.0, -1.0], [0.0, 1.0]]], dtype=torch.float64)  # [S=2, T, n]
    tok = gv.metrics(draws, exact, "per-token")
    assert tok["bias"] == pytest.approx(0.0, abs=1e-15)  # token 0's mean is [1, 0], token 1's is exact
    assert tok["error"] == pytest.approx((1 - 2**-0.5) / 2)  # token 0 at 45 degrees, token 1 exact
    assert tok["variance"] == pytest.approx(0.0, abs=1e-15)
    axis = gv.metrics(draws, exact, "token-axis")  # expert 0: (1, 0) every draw; expert 1: (±1, 1) against (0, 1)
    assert axis["bias"] == pytest.approx(0.0, abs=1e-15)
    assert axis["error"] == pytest.approx((0 + (1 - 2**-0.5)) / 2)
    assert axis["variance"] == pytest.approx(torch.tensor([1.0, 2**-0.5, 1.0, 2**-0.5]).var().item())
    flat = gv.metrics(draws, exact)
    assert flat["error"] == pytest.approx(1 - 2 / (3**0.5 * 2**0.5))
    with pytest.raises(ValueError, match="axis must be"):
        gv.metrics(draws, exact, "rows")


def test_metrics_against_one_exact_gradient_per_draw():
    """With an exact gradient per draw the bias compares the means; a draw equal to its own exact
    gradient has no error even when the draws differ."""
    exact = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = gv.metrics(exact.clone(), exact)
    assert out["bias"] == pytest.approx(0.0, abs=1e-12) and out["error"] == pytest.approx(0.0, abs=1e-12)
    assert out["variance"] > 0


def test_batched_exact_gradients_match_the_oracle():
    problem = gv.make_problem(seed=2, n=5, tokens=3, dim=2)
    logits = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    batched = gv.exact_gradients(logits, problem.experts, problem.targets, 2)
    for s in range(4):
        one = gv.Problem(logits[s], problem.experts, problem.targets)
        torch.testing.assert_close(batched[s], gv.exact_gradient(one, 2), rtol=1e-12, atol=1e-14)


def test_sampled_densemixer_draws_subsets_from_the_distribution():
    logits = torch.randn(1, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64).repeat(20_000, 1)
    w = gv.sampled_densemixer_weights(logits, 2, torch.Generator().manual_seed(3)).detach()
    z = (w > 0).double()
    torch.testing.assert_close(w, z * torch.softmax(logits, -1), rtol=0, atol=0)
    masks = gv.subset_masks(4, 2)
    counts = (z @ masks.T == 2).double().sum(0)
    expected = gv.probmoe_probs(logits[:1], masks)[0] * len(logits)
    assert float(((counts - expected).abs() / expected.sqrt()).max()) < 5


@pytest.mark.parametrize(
    "reading, densemixer_varies",
    [
        ("ours", False),
        ("per-token", False),
        ("token-axis", False),
        ("sampled-densemixer", True),
        ("logits-per-sample", True),
    ],
)
def test_readings(reading, densemixer_varies, capsys):
    args = gv.parse_args(
        ["--samples", "64", "--seeds", "2", "--n", "5", "--k", "2", "--tokens", "3", "--dim", "2", "--reading", reading]
    )
    summary = gv.run(args)
    assert ("gumbel-st (own objective)" in summary) == (reading != "logits-per-sample")
    variance = summary["densemixer"]["variance"][0]
    assert (variance > 1e-6) if densemixer_varies else (variance < 1e-20)
    for row in summary.values():
        assert all(math.isfinite(mean) and mean >= -1e-15 for mean, _ in row.values())
    with pytest.raises(SystemExit):
        gv.parse_args(["--reading", "mine"])
    assert "invalid choice: 'mine'" in capsys.readouterr().err
