"""Bias, variance and error of router-gradient estimators against the exact gradient (tab:ProbMoE_densemixer).

    python tools/grad_variance.py [--samples 10000] [--seeds 10] [--n 10] [--k 5] [--tokens 10]
                                  [--dim 8] [--tau 1.0] [--reading ours] [--json PATH]

A tiny fixed MoE layer per seed: T tokens, each with its own router logits r_t ~ N(0, I_n), expert
outputs f_i(x_t) ~ N(0, I_d) and a target y*_t ~ N(0, I_d), all drawn once from the seed. A subset S
of k experts gives the output y_t = Σ_{i∈S} π_i f_i(x_t), π = softmax(r_t) (unnormalised, as
OLMoE), and the loss L_t(S, r_t) = ||y_t - y*_t||². The objective is ProbMoE's expected loss

    J(r) = Σ_t E_{S ~ P(S | r_t)} [L_t(S, r_t)],    P(S | r_t) ∝ exp(Σ_{i∈S} r_{t,i}), |S| = k,

and its exact gradient [T, n] comes from enumerating all C(n, k) subsets in float64 with autograd.
Every estimator gives a single-draw gradient of the same loss, w ⊙ f summed, where the weights w
[T, n] have the forward value z ⊙ π (z the k-hot selection) and differ in how z is drawn and how
they backpropagate:

- "probmoe": ``probmoe.route(training=True, grad="paper")``, the paper's Eq. 7 with its gradient
  convention (Jacobian of the marginals Cov(z) diag(1 - p)); "probmoe-exact": ``grad="exact"``
  (Jacobian Cov(z)). Both draw S from P(S | r) with the same generator state, so the same subsets.
- "densemixer": the top-k experts of π (deterministic, so its variance is 0); weights
  (mask ⊙ π).detach() + π - π.detach() over all n experts, every expert computed.
- "defaultmoe": DefaultMoE (Panda et al.): the forward of "densemixer" (top-k of π, value
  mask ⊙ π) with its dense router gradient from default outputs: the unselected expert i stands in
  with Ê_i, the mean of f_i(x_t) over the tokens whose top-k holds i (the value the running
  average settles at when this batch is seen again and again; 0 for an expert no token selects),
  y_t + Σ_{i∉S} (π_i − stopgrad(π_i)) Ê_i. Deterministic, variance 0.
- "sparsemixer": SparseMixer v2 (``integrations.transformers.sparsemixer``), k stages of Gumbel
  sampling within a jitter band (ε = 0.01, GRIN-MoE's) with the midpoint gradient; its forward is
  its own (each stage's weight is the softmax over its band, times 1 or 0.3333).
- "remoe": ReMoE (Wang et al.), the ReLU gates R = ReLU(r) of every expert as the weights (no
  top-k, no softmax; its L1 penalty is a term of its own, left out of this loss). It draws nothing
  and is no k-subset: its gradient is the exact gradient of its own loss, so its bias and error say
  how far that direction lies from ∇J's, not how good an estimate of ∇J it is; variance 0.
- "gumbel-st": the top-k of r + g, g ~ Gumbel(0, 1) (S drawn from the Gumbel-top-k / Plackett-Luce
  distribution, not from P(S | r)); z ≈ softmax((r + g) / τ) in the backward:
  w = (z + s - stopgrad(s)) ⊙ π with s = softmax((r + g) / τ).

Per seed and estimator, over ``--samples`` draws of the whole [T, n] gradient, flattened to T·n:
bias = 1 - cos(mean draw, exact); variance = the variance over draws of cos(draw, mean draw);
error = the mean over draws of 1 - cos(draw, exact) (the definitions of the SIMPLE paper's
synthetic experiment); also mse = the mean over draws of ||draw - mean draw||² / ||exact||². Each
is averaged over ``--seeds`` seeds (0, 1, ...) with its standard deviation over seeds. Gumbel-ST is
also scored against the gradient of its own objective, the same loss with S from the Gumbel-top-k
distribution (enumerated exactly too). docs/reports/results-tiny-models-epyc-2026-11.md says why each choice was made.

``--reading`` chooses another reading of the paper's protocol (``tab:ProbMoE_densemixer``), to
see which, if any, reproduces its numbers (docs/reports/results-tiny-models-epyc-2026-11.md reports each):

- "ours": as above.
- "per-token": the cosines taken per token over its n logits, each metric averaged over the T tokens.
- "token-axis": the SIMPLE notebook's ``F.cosine_similarity`` calls applied as written to the
  [samples, T, n] stacks: their default ``dim`` (1 for variance and error, 0 for the bias on the
  mean [T, n]) is the token axis, so each cosine is over the T tokens of one expert; averaged.
- "sampled-densemixer": DenseMixer's forward on the subset ProbMoE draws (S ~ P(S | r)) instead
  of the top-k, so its draws vary; its backward as before.
- "logits-per-sample": every sample draws new router logits r ~ N(0, I) [T, n] (experts and
  targets stay the seed's); each draw is compared with the exact gradient at its own logits, the
  bias is 1 - cos(mean draw, mean exact gradient) (the notebook's form). DenseMixer varies with
  the logits. The Gumbel-ST own-objective row is left out (C(n, k) · 2^k terms per token and sample).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import table

import probmoe

DTYPE = torch.float64
MAX_N = 16  # the Gumbel-top-k objective sums C(n, k) · 2^k terms per token: 3.3 million at n = 16, k = 8
DRAW_SEED = 1_000_000  # the draws of seed s start from a generator seeded with DRAW_SEED + s
ROWS = (
    "probmoe",
    "probmoe-exact",
    "densemixer",
    "defaultmoe",
    "sparsemixer",
    "remoe",
    "gumbel-st",
)  # the estimators, in the table's order
READINGS = ("ours", "per-token", "token-axis", "sampled-densemixer", "logits-per-sample")
EXACT_CHUNK = 4096  # tokens per enumeration batch of the per-sample exact gradients
METRICS = ("bias", "variance", "error", "mse")
Estimator = Callable[..., Tensor | tuple[Tensor, Tensor]]  # (logits [B, n] leaf, k, generator, experts [T, n, d])
# -> weights [B, n], or (weights [B, n], an output added to Σ_i w_i f_i [B, d])


@dataclass(frozen=True)
class Problem:
    """One seed's tiny MoE layer: logits [T, n], experts [T, n, d] (f_i(x_t)), targets [T, d]; float64."""

    logits: Tensor
    experts: Tensor
    targets: Tensor


def make_problem(seed: int, n: int, tokens: int, dim: int) -> Problem:
    """Logits, expert outputs and targets, all standard normal, drawn from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return Problem(
        *(torch.randn(*shape, generator=g, dtype=DTYPE) for shape in ((tokens, n), (tokens, n, dim), (tokens, dim)))
    )


def token_losses(weights: Tensor, experts: Tensor, targets: Tensor, extra: Tensor | None = None) -> Tensor:
    """||Σ_i w_i f_i(x_t) (+ extra_t) - y*_t||²: weights [..., T, n], experts [T, n, d], targets [T, d],
    extra [..., T, d] -> [..., T]."""
    y = torch.einsum("...tn,tnd->...td", weights, experts)
    if extra is not None:
        y = y + extra
    return (y - targets).square().sum(dim=-1)


def subset_masks(n: int, k: int) -> Tensor:
    """All k-subsets of n experts as masks: [C(n, k), n] float64."""
    rows = torch.tensor(list(itertools.combinations(range(n), k)))
    return torch.zeros(len(rows), n, dtype=DTYPE).scatter_(1, rows, 1.0)


def probmoe_probs(logits: Tensor, masks: Tensor) -> Tensor:
    """P(S | r) ∝ exp(Σ_{i∈S} r_i) of each subset: logits [T, n], masks [C, n] -> [T, C]."""
    return torch.softmax(logits @ masks.T, dim=-1)


def gumbel_topk_probs(logits: Tensor, masks: Tensor) -> Tensor:
    """P(top-k of r + Gumbel noise = S): logits [T, n], masks [C, n] -> [T, C].

    With π = softmax(r), the Gumbel-top-k set is the first k arrivals of exponential clocks with
    rates π, so P(S) = P(max_{i∈S} E_i < min_{j∉S} E_j) = Σ_{A⊆S} (-1)^{|A|} π(S^c) / (π(S^c) + π(A)).
    """
    k = int(masks[0].sum())
    members = masks.nonzero()[:, 1].view(len(masks), k)  # [C, k]
    patterns = torch.tensor(list(itertools.product((0.0, 1.0), repeat=k)), dtype=DTYPE)  # [2^k, k]: A ⊆ S
    signs = 1.0 - 2.0 * (patterns.sum(dim=1) % 2)  # (-1)^{|A|}
    pi = torch.softmax(logits, dim=-1)
    rest = (pi @ (1.0 - masks).T).unsqueeze(-1)  # π(S^c): [T, C, 1]
    inside = pi[:, members] @ patterns.T  # π(A): [T, C, 2^k]
    return (signs * rest / (rest + inside)).sum(dim=-1)


def expected_loss(logits: Tensor, experts: Tensor, targets: Tensor, masks: Tensor, subset_probs) -> Tensor:
    """Σ_t Σ_S P_t(S) L_t(S, r_t): logits [T, n], experts [T, n, d], targets [T, d], masks [C, n] -> []."""
    weights = masks * torch.softmax(logits, dim=-1).unsqueeze(1)  # [T, C, n]
    losses = token_losses(weights.transpose(0, 1), experts, targets)  # [C, T]
    return (subset_probs(logits, masks) * losses.T).sum()


def exact_gradient(problem: Problem, k: int, subset_probs=probmoe_probs) -> Tensor:
    """∇_r of the expected loss under ``subset_probs`` by enumeration, token by token: [T, n] float64."""
    masks = subset_masks(problem.logits.shape[-1], k)
    rows = []
    for t in range(len(problem.logits)):
        r = problem.logits[t : t + 1].clone().requires_grad_()
        loss = expected_loss(r, problem.experts[t : t + 1], problem.targets[t : t + 1], masks, subset_probs)
        rows.append(torch.autograd.grad(loss, r)[0])
    return torch.cat(rows)


def exact_gradients(logits: Tensor, experts: Tensor, targets: Tensor, k: int) -> Tensor:
    """∇_r of the ProbMoE expected loss at many logits at once: logits [S, T, n] -> [S, T, n] float64.

    Each token's gradient depends only on its own row, so one backward per chunk of rows gives them all.
    """
    samples, tokens, n = logits.shape
    masks = subset_masks(n, k)
    flat = logits.reshape(-1, n)
    rows = []
    for start in range(0, len(flat), EXACT_CHUNK):
        r = flat[start : start + EXACT_CHUNK].clone().requires_grad_()
        t = torch.arange(start, start + len(r)) % tokens  # the token each row is
        loss = expected_loss(r, experts[t], targets[t], masks, probmoe_probs)
        rows.append(torch.autograd.grad(loss, r)[0])
    return torch.cat(rows).view(samples, tokens, n)


def probmoe_weights(logits: Tensor, k: int, generator: torch.Generator, grad: str) -> Tensor:
    """ProbMoE's Eq. 7 through ``probmoe.route`` (dp backend), scattered onto the experts: [B, n]."""
    out = probmoe.route(logits, k=k, training=True, grad=grad, algorithm="dp", generator=generator)
    return torch.zeros_like(logits).scatter(1, out.indices, out.weights)


def densemixer_weights(logits: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """DenseMixer: value top-k mask ⊙ π, gradient through π of every expert: [B, n] (draws nothing)."""
    pi = torch.softmax(logits, dim=-1)
    mask = torch.zeros_like(pi).scatter(1, pi.detach().topk(k, dim=-1).indices, 1.0)
    return (mask * pi).detach() + (pi - pi.detach())


def defaultmoe_weights(logits: Tensor, k: int, generator: torch.Generator, experts: Tensor) -> tuple[Tensor, Tensor]:
    """DefaultMoE: DenseMixer's value (top-k mask ⊙ π, gradient through π at the selected experts)
    and the default outputs' term Σ_{i∉S} (π_i − stopgrad π_i) Ê_i [B, d], Ê_i the mean of
    f_i(x_t) over the tokens (rows t = b mod T) whose top-k holds i. Draws nothing."""
    pi = torch.softmax(logits, dim=-1)  # [B, n]
    mask = torch.zeros_like(pi).scatter(1, pi.detach().topk(k, dim=-1).indices, 1.0)  # [B, n]
    tokens = experts.shape[0]
    rows = experts[torch.arange(len(logits)) % tokens]  # [B, n, d]: f_i(x_t) of each row's token
    seen = mask.sum(dim=0).unsqueeze(-1)  # [n, 1]
    defaults = (mask.unsqueeze(-1) * rows).sum(dim=0) / seen.clamp(min=1)  # [n, d]
    weights = (mask * pi).detach() + (mask * (pi - pi.detach()))
    extra = ((1 - mask) * (pi - pi.detach())) @ defaults  # value 0
    return weights, extra


def sparsemixer_weights(logits: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """SparseMixer v2 (float32 inside, as the transformers integration routes), scattered onto
    the experts: [B, n]."""
    from probmoe.integrations.transformers.sparsemixer import sparsemixer_weights as route

    weights, indices = route(logits, k, training=True, generator=generator)
    return torch.zeros_like(logits).scatter(1, indices, weights.to(logits.dtype))


def remoe_weights(logits: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """ReMoE: the ReLU gates of every expert, ReLU(r): [B, n] (k and the generator unused: no
    subset, no draw; ``integrations.transformers.remoe`` without its L1 penalty)."""
    return torch.relu(logits)


def sampled_densemixer_weights(logits: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """DenseMixer's backward (through π of every expert) on a subset drawn from P(S | r): [B, n]."""
    pi = torch.softmax(logits, dim=-1)
    z = probmoe.SubsetDistribution(logits.detach(), k=k, algorithm="dp").sample(generator=generator)
    return (z * pi).detach() + (pi - pi.detach())


def gumbel_st_weights(logits: Tensor, k: int, generator: torch.Generator, tau: float) -> Tensor:
    """Gumbel straight-through: value top-k(r + g) mask ⊙ π, z ≈ softmax((r + g) / τ) backward: [B, n]."""
    noisy = logits - torch.empty_like(logits).exponential_(generator=generator).log()  # r + Gumbel(0, 1)
    hard = torch.zeros_like(logits).scatter(1, noisy.detach().topk(k, dim=-1).indices, 1.0)
    soft = torch.softmax(noisy / tau, dim=-1)
    return (hard + (soft - soft.detach())) * torch.softmax(logits, dim=-1)


def estimators(tau: float, reading: str = "ours") -> dict[str, Estimator]:
    """Row label -> estimator, in the order of ``ROWS`` (DenseMixer on drawn subsets for "sampled-densemixer")."""
    densemixer = sampled_densemixer_weights if reading == "sampled-densemixer" else densemixer_weights
    return dict(
        zip(
            ROWS,
            (
                partial(probmoe_weights, grad="paper"),
                partial(probmoe_weights, grad="exact"),
                densemixer,
                defaultmoe_weights,
                sparsemixer_weights,
                remoe_weights,
                partial(gumbel_st_weights, tau=tau),
            ),
        )
    )


def draws(
    problem: Problem,
    estimator: Estimator,
    k: int,
    samples: int,
    generator: torch.Generator,
    logits: Tensor | None = None,
) -> Tensor:
    """``samples`` single-draw gradients of the loss w.r.t. the logits, in one batch: [samples, T, n].

    The batch holds ``samples`` copies of the T tokens (row s·T + t is token t of draw s), or the
    given ``logits`` [samples, T, n] (a new router per sample); each row's gradient depends only on
    that row, so one backward gives every draw's gradient.
    """
    tokens, n = problem.logits.shape
    logits = (problem.logits.repeat(samples, 1) if logits is None else logits.reshape(-1, n)).clone().requires_grad_()
    if estimator is defaultmoe_weights:
        weights, extra = estimator(logits, k, generator, problem.experts)
        extra = extra.view(samples, tokens, -1)
    else:
        weights, extra = estimator(logits, k, generator), None
    loss = token_losses(weights.view(samples, tokens, n), problem.experts, problem.targets, extra).sum()
    return torch.autograd.grad(loss, logits)[0].view(samples, tokens, n)


def metrics(grads: Tensor, exact: Tensor, axis: str = "flat") -> dict[str, float]:
    """bias, variance, error and mse (see the module docstring) of draws [S, T, n] against exact [T, n]
    (or [S, T, n], one per draw: the bias then compares the means).

    ``axis``: "flat", cosines over the whole T·n gradient; "per-token", over each token's n logits,
    averaged over tokens; "token-axis", over the T tokens of each expert, averaged over experts.
    """
    exact = exact.expand_as(grads)
    if axis == "flat":
        g, e, dim = grads.flatten(1), exact.flatten(1), -1  # [S, T·n]
    elif axis == "per-token":
        g, e, dim = grads, exact, -1  # cosines over n, [S, T]
    elif axis == "token-axis":
        g, e, dim = grads, exact, 1  # cosines over T, [S, n]
    else:
        raise ValueError(f"axis must be 'flat', 'per-token' or 'token-axis', got {axis!r}")
    mean, mean_exact = g.mean(dim=0), e.mean(dim=0)
    cos_to_mean = F.cosine_similarity(g, mean.unsqueeze(0), dim=dim)  # [S] or [S, T] or [S, n]
    bias_dim = 0 if axis == "token-axis" else -1  # the same axis of the means [T·n] or [T, n]
    return {
        "bias": (1.0 - F.cosine_similarity(mean, mean_exact, dim=bias_dim)).mean().item(),
        "variance": (cos_to_mean.var() if axis == "token-axis" else cos_to_mean.var(dim=0).mean()).item(),
        "error": (1.0 - F.cosine_similarity(g, e, dim=dim)).mean().item(),
        "mse": ((g - mean).square().flatten(1).sum(dim=1).mean() / mean_exact.square().sum()).item(),
    }


def evaluate_seed(seed: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Row label -> metrics for one seed: the four estimators, and Gumbel-ST against its own objective
    (not under "logits-per-sample")."""
    reading = getattr(args, "reading", "ours")
    axis = reading if reading in ("per-token", "token-axis") else "flat"
    problem = make_problem(seed, args.n, args.tokens, args.dim)
    logits = None
    if reading == "logits-per-sample":
        g = torch.Generator().manual_seed(DRAW_SEED // 2 + seed)
        logits = torch.randn(args.samples, args.tokens, args.n, generator=g, dtype=DTYPE)
        exact = exact_gradients(logits, problem.experts, problem.targets, args.k)
    else:
        exact = exact_gradient(problem, args.k)
    grads = {
        name: draws(problem, estimator, args.k, args.samples, torch.Generator().manual_seed(DRAW_SEED + seed), logits)
        for name, estimator in estimators(args.tau, reading).items()
    }
    rows = {name: metrics(g, exact, axis) for name, g in grads.items()}
    if logits is None:
        rows["gumbel-st (own objective)"] = metrics(
            grads["gumbel-st"], exact_gradient(problem, args.k, gumbel_topk_probs), axis
        )
    return rows


def summarize(per_seed: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, tuple[float, float]]]:
    """Row label -> metric -> (mean, standard deviation) over seeds."""
    out = {}
    for name in per_seed[0]:
        values = torch.tensor([[seed[name][m] for m in METRICS] for seed in per_seed], dtype=DTYPE)
        out[name] = {m: (values[:, j].mean().item(), values[:, j].std().item()) for j, m in enumerate(METRICS)}
    return out


def run(args: argparse.Namespace) -> dict[str, dict[str, tuple[float, float]]]:
    """Every seed (a tqdm bar over them), summarized."""
    return summarize([evaluate_seed(seed, args) for seed in tqdm(range(args.seeds), desc="seeds", unit="seed")])


def results_json(summary: dict[str, dict[str, tuple[float, float]]]) -> dict[str, dict[str, float]]:
    """The four estimators' mean bias, variance and error over seeds, the shape ``--json`` writes."""
    return {name: {m: summary[name][m][0] for m in ("bias", "variance", "error")} for name in ROWS}


def report(summary: dict[str, dict[str, tuple[float, float]]], args: argparse.Namespace, seconds: float) -> str:
    """The markdown table (mean ± std over seeds) and the run's settings and wall time."""
    rows = [
        (name, *(f"{mean:.2e} ± {std:.1e}" for mean, std in (stats[m] for m in METRICS)))
        for name, stats in summary.items()
    ]
    header = ("estimator", "bias", "variance", "error", "mse / ||exact||²")
    return (
        f"reading {args.reading}: n = {args.n}, k = {args.k}, T = {args.tokens}, d = {args.dim}, tau = {args.tau}, "
        f"{args.samples} draws x {args.seeds} seeds\n\n{table(rows, header)}\n\n"
        f"{seconds:.1f} s on {torch.get_num_threads()} threads"
    )


class _Parser(argparse.ArgumentParser):
    """Bad arguments end with one line on stderr and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv=None) -> argparse.Namespace:
    p = _Parser(prog="grad_variance.py", description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=10_000, help="single-draw gradients per seed and estimator")
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..seeds-1, each a new problem")
    p.add_argument("--n", type=int, default=10, help="experts")
    p.add_argument("--k", type=int, default=5, help="experts per token")
    p.add_argument("--tokens", type=int, default=10, help="tokens, each with its own logits")
    p.add_argument("--dim", type=int, default=8, help="width d of the expert outputs")
    p.add_argument("--tau", type=float, default=1.0, help="Gumbel-ST's softmax temperature")
    p.add_argument(
        "--reading", choices=READINGS, default="ours", help="a reading of the paper's protocol (module docstring)"
    )
    p.add_argument("--json", metavar="PATH", help="write {estimator: {bias, variance, error}} (means over seeds)")
    args = p.parse_args(argv)
    for name, low, high in (
        ("samples", 2, None),
        ("seeds", 2, None),
        ("n", 2, MAX_N),
        ("k", 1, args.n - 1),
        ("tokens", 1, None),
        ("dim", 1, None),
    ):
        value = getattr(args, name)
        if value < low or (high is not None and value > high):
            allowed = f"{low}..{high}" if high is not None else f">= {low}"
            p.error(f"--{name} must be {allowed}, got {value}")
    if not (0 < args.tau < math.inf):
        p.error(f"--tau must be a positive finite number, got {args.tau}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    summary = run(args)
    print(report(summary, args, time.perf_counter() - start))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results_json(summary), f, indent=2)


if __name__ == "__main__":
    main()
