"""Routing statistics of the ProbMoE paper's analyses, one MoE layer at a time, as plain torch functions.

    probs [T, N]          a routing distribution per token (the softmax of the router logits)
        -> experts_to_cover (Fig. 3: per token, then averaged over the tokens)
        -> token_top_mass, normalized_entropy (per token: how sharp each token's router is)
    selected [T, N] bool  the experts each token was sent to
        -> expert_load -> assignment_top_mass, assignment_entropy (Fig. 4: how evenly the layer's
           assignments spread over its experts); load_cv, max_vio (load balance)
        -> cardinality (Fig. 5: its mean per layer)
    token_ids [T], cardinality [T]
        -> frequency_vs_active -> frequency_ranked (Fig. 6)
    token_ids [T], cardinality of every layer [L, T]
        -> token_ranking (the tokens with the most and fewest experts, tab:dynamic_expert_number)
    layer_summary: all of the above for one layer, as JSON-able numbers (what ``plots`` draws)

T is the number of tokens (T >= 1), N the number of experts. Statistics are computed in float64.
Every function checks its input and raises ValueError naming the argument.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Sequence

import torch
from torch import Tensor

from .. import _validate

ROW_SUM_TOL = 1e-3  # how far a row of ``probs`` may sum from 1 (a float32 softmax is within ~1e-6)


# ---------------------------------------------------------------------------------------------
# Argument checks


def _probs(probs) -> Tensor:
    """``probs`` [T, N] checked (finite, >= 0, rows summing to 1) and as float64."""
    if not isinstance(probs, Tensor) or not probs.is_floating_point():
        raise ValueError(f"probs must be a floating-point torch.Tensor [tokens, experts], got {_describe(probs)}")
    if probs.dim() != 2 or probs.shape[0] == 0 or probs.shape[1] == 0:
        raise ValueError(f"probs must have shape [T, N] with T >= 1 tokens and N >= 1 experts, got {list(probs.shape)}")
    p = probs.double()
    if not bool(torch.isfinite(p).all()) or bool((p < 0).any()):
        raise ValueError("probs must be finite and >= 0")
    worst = float((p.sum(-1) - 1).abs().max())
    if worst > ROW_SUM_TOL:
        raise ValueError(
            f"probs rows must sum to 1 (within {ROW_SUM_TOL:g}; take the softmax in float32), "
            f"got a row off by {worst:.3g}"
        )
    return p


def _selected(selected) -> Tensor:
    """``selected`` [T, N] checked: a bool tensor with T >= 1 and N >= 1."""
    if not isinstance(selected, Tensor) or selected.dtype != torch.bool:
        raise ValueError(f"selected must be a bool torch.Tensor [tokens, experts], got {_describe(selected)}")
    if selected.dim() != 2 or selected.shape[0] == 0 or selected.shape[1] == 0:
        raise ValueError(
            f"selected must have shape [T, N] with T >= 1 tokens and N >= 1 experts, got {list(selected.shape)}"
        )
    return selected


def _counts(name: str, values, dim_name: str) -> Tensor:
    """``values``: a non-empty 1-D real tensor, finite and >= 0, as float64."""
    if not isinstance(values, Tensor) or values.dtype == torch.bool or values.is_complex():
        raise ValueError(f"{name} must be a real torch.Tensor [{dim_name}], got {_describe(values)}")
    if values.dim() != 1 or values.shape[0] == 0:
        raise ValueError(f"{name} must have shape [{dim_name}] with at least one entry, got {list(values.shape)}")
    v = values.double()
    if not bool(torch.isfinite(v).all()) or bool((v < 0).any()):
        raise ValueError(f"{name} must be finite and >= 0")
    return v


def _load(load) -> Tensor:
    """``load`` [N] checked (finite, >= 0, a positive total) and as float64."""
    v = _counts("load", load, "N")
    if float(v.sum()) <= 0:
        raise ValueError("load must have a positive total (no expert received a token)")
    return v


def _alphas(alphas) -> Tensor:
    """``alphas`` as a float64 tensor [A]: a non-empty sequence of numbers in (0, 1]."""
    if isinstance(alphas, (str, bytes)) or not isinstance(alphas, Sequence) or len(alphas) == 0:
        raise ValueError(f"alphas must be a non-empty sequence of numbers in (0, 1], got {alphas!r}")
    for a in alphas:
        if isinstance(a, bool) or not isinstance(a, numbers.Real) or not 0 < a <= 1:
            raise ValueError(f"alphas must be numbers in (0, 1], got {a!r} in {alphas!r}")
    return torch.tensor([float(a) for a in alphas], dtype=torch.float64)


def _describe(value) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return type(value).__name__


# ---------------------------------------------------------------------------------------------
# Concentration of the routing distribution (Figs. 3 and 4)


def experts_to_cover(probs: Tensor, alphas: Sequence[float] = (0.5, 0.9, 0.99)) -> Tensor:
    """The fewest experts whose largest probabilities hold a fraction α of each token's mass (Fig. 3).

    Args:
        probs: [T, N] routing probabilities, rows summing to 1.
        alphas: A fractions in (0, 1].

    Returns:
        [A, T] long, each in [1, N]: for α and token t the smallest k with
        ``sum of the k largest probs[t] >= α * probs[t].sum()``, where a prefix within the rounding
        of the input and of N float64 additions, ``eps(probs.dtype) + N * eps(float64)``, of the
        target counts as reaching it. So uniform probabilities over N give ceil(αN) even where αN
        is whole (0.9 * 10), [0.5, 0.3, 0.15, 0.05] in float32 needs 3 experts for α = 0.95, and
        α = 1 gives the number of experts with non-zero probability, never more than N.
    """
    p = _probs(probs)
    alpha = _alphas(alphas).to(p.device)
    mass = p.sort(dim=-1, descending=True).values.cumsum(dim=-1)  # [T, N], non-decreasing
    tol = torch.finfo(probs.dtype).eps + p.shape[1] * torch.finfo(torch.float64).eps
    target = alpha[None, :] * mass[:, -1:] - tol  # [T, 1] * [1, A] -> [T, A], below the total mass[:, -1]
    short = torch.searchsorted(mass, target)  # [T, A]: prefixes k = 1..N whose mass is still below the target
    return (short + 1).T.contiguous()  # [A, T]


def token_top_mass(probs: Tensor, m: int = 4) -> Tensor:
    """The mass of the ``m`` largest routing probabilities of each token: a per-token measure of how
    sharp the router is (not the paper's Fig. 4, which counts assignments: ``assignment_top_mass``).

    Args:
        probs: [T, N] routing probabilities, rows summing to 1.
        m: 1 <= m <= N.

    Returns:
        [T] float64.
    """
    p = _probs(probs)
    m = _validate.int_in("m", m, 1, p.shape[1], f" (N = {p.shape[1]} experts)")
    return p.topk(m, dim=-1).values.sum(-1)  # [T, m] -> [T]


def normalized_entropy(probs: Tensor) -> Tensor:
    """The entropy of each row's distribution over that of the uniform one, H(p) / log N.

    On the routing probabilities [T, N] it is a per-token measure of the router's sharpness; on a
    layer's assignment shares [1, N] it is the paper's Fig. 4 entropy (``assignment_entropy``).
    0 · log 0 = 0, so a one-hot row gives 0 and a uniform row 1.

    Args:
        probs: [T, N] distributions, rows summing to 1, N >= 2.

    Returns:
        [T] float64 in [0, 1] (up to the rows' rounding).
    """
    p = _probs(probs)
    if p.shape[1] < 2:
        raise ValueError(f"probs must have N >= 2 experts for a normalised entropy, got N = {p.shape[1]}")
    return -torch.xlogy(p, p).sum(-1) / math.log(p.shape[1])  # [T, N] -> [T]


# ---------------------------------------------------------------------------------------------
# Which experts were chosen: load balance and cardinality (Fig. 5)


def expert_load(selected: Tensor) -> Tensor:
    """The number of tokens sent to each expert.

    Args:
        selected: [T, N] bool, True where token t was sent to expert i.

    Returns:
        [N] long.
    """
    return _selected(selected).sum(0)  # [T, N] -> [N]


def load_cv(load: Tensor) -> float:
    """The coefficient of variation of the expert load, std / mean, with the population std (divided by N).

    0 for a perfectly balanced load.

    Args:
        load: [N] tokens per expert (counts or fractions), >= 0 with a positive total.
    """
    v = _load(load)
    return float(v.std(correction=0) / v.mean())


def max_vio(load: Tensor) -> float:
    """MaxVio, (max load - mean load) / mean load (Wang et al. 2024, "Auxiliary-loss-free load balancing").

    0 for a perfectly balanced load; N - 1 when one expert takes every token.

    Args:
        load: [N] tokens per expert (counts or fractions), >= 0 with a positive total.
    """
    v = _load(load)
    return float((v.max() - v.mean()) / v.mean())


def cardinality(selected: Tensor) -> Tensor:
    """The number of experts each token was sent to (Fig. 5; its mean is ``cardinality(s).double().mean()``).

    Args:
        selected: [T, N] bool.

    Returns:
        [T] long in [0, N].
    """
    return _selected(selected).sum(-1)  # [T, N] -> [T]


def assignment_top_mass(load: Tensor, m: int = 4) -> float:
    """The fraction of a layer's expert assignments taken by its ``m`` most used experts (Fig. 4, left).

    An assignment is one (token, expert) pair routed; with ``load = expert_load(selected)`` this is
    the sum of the ``m`` largest loads over the sum of all loads: m / N for a perfectly balanced
    layer, 1 when ``m`` experts take every token.

    Args:
        load: [N] assignments per expert (counts or fractions), >= 0 with a positive total.
        m: 1 <= m <= N.
    """
    v = _load(load)
    m = _validate.int_in("m", m, 1, v.shape[0], f" (N = {v.shape[0]} experts)")
    return float(v.topk(m).values.sum() / v.sum())


def assignment_entropy(load: Tensor) -> float:
    """The normalised entropy of a layer's assignment distribution, H(load / total) / log N (Fig. 4, right).

    1 for a perfectly balanced layer, 0 when one expert takes every assignment.

    Args:
        load: [N] assignments per expert (counts or fractions), >= 0 with a positive total, N >= 2.
    """
    v = _load(load)
    if v.shape[0] < 2:
        raise ValueError(f"load must have N >= 2 experts for a normalised entropy, got N = {v.shape[0]}")
    return float(normalized_entropy((v / v.sum())[None, :])[0])  # [1, N] -> [1]


# ---------------------------------------------------------------------------------------------
# Token frequency against the number of active experts (Fig. 6)


def frequency_vs_active(token_ids: Tensor, experts_per_token: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """How often each token id occurs, and how many experts it activates on average (Fig. 6).

    Args:
        token_ids: [T] integer token ids.
        experts_per_token: [T] experts active at each position (``cardinality``), >= 0.

    Returns:
        (ids [U] long, sorted; counts [U] long, occurrences of each id; mean_active [U] float64,
        the mean of ``experts_per_token`` over the occurrences of each id).
    """
    if (
        not isinstance(token_ids, Tensor)
        or token_ids.dtype == torch.bool
        or token_ids.is_floating_point()
        or token_ids.is_complex()
    ):
        raise ValueError(f"token_ids must be an integer torch.Tensor [T], got {_describe(token_ids)}")
    if token_ids.dim() != 1 or token_ids.shape[0] == 0:
        raise ValueError(f"token_ids must have shape [T] with T >= 1, got {list(token_ids.shape)}")
    active = _counts("experts_per_token", experts_per_token, "T")
    if active.shape != token_ids.shape or active.device != token_ids.device:
        raise ValueError(
            f"experts_per_token must match token_ids (shape {list(token_ids.shape)} on "
            f"{token_ids.device}), got shape {list(active.shape)} on {active.device}"
        )
    ids, inverse, counts = torch.unique(token_ids, return_inverse=True, return_counts=True)  # [U], [T], [U]
    total = torch.zeros(ids.shape[0], dtype=torch.float64, device=ids.device).index_add_(0, inverse, active)
    return ids, counts, total / counts


def frequency_ranked(counts: Tensor, mean_active: Tensor, num_bins: int = 40) -> dict[str, Tensor]:
    """``frequency_vs_active`` with the tokens ordered by increasing frequency, in at most ``num_bins``
    groups of consecutive ranks (Fig. 6: its x axis; each token its own group when U <= num_bins).

    The U distinct ids are ranked 1..U by increasing count (equal counts by increasing id) and cut
    into B = min(num_bins, U) groups of floor(U / B) or ceil(U / B) consecutive ranks. Within a
    group, every occurrence weighs the same: a frequent id counts more than a rare one.

    Args:
        counts: [U] occurrences of each id, >= 1 (ids in increasing order, as ``frequency_vs_active``).
        mean_active: [U] mean active experts of each id, >= 0.
        num_bins: 1 <= num_bins <= 1000.

    Returns:
        {"rank_low", "rank_high": [B] long, the first and last rank (1-based) of each group;
        "frequency": [B] float64, the mean count of the group's ids; "occurrences": [B] long, their
        total count; "mean_active": [B] float64, the mean active experts over those occurrences},
        by increasing frequency.
    """
    c = _counts("counts", counts, "U")
    if float(c.min()) < 1 or bool((c != c.round()).any()):
        raise ValueError(f"counts must be whole numbers >= 1 (occurrences of each id), got {c.tolist()[:8]}")
    active = _counts("mean_active", mean_active, "U")
    if active.shape != c.shape:
        raise ValueError(f"mean_active must have the shape of counts, {list(c.shape)}, got {list(active.shape)}")
    num_bins = _validate.int_in("num_bins", num_bins, 1, 1000)
    order = torch.argsort(c, stable=True)  # [U], by increasing count, ids in order within a count
    c, active = c[order], active[order]
    groups = min(num_bins, c.shape[0])
    u = c.shape[0]
    group_of = torch.arange(u, device=c.device) * groups // u  # [U]: rank r in group floor(r * B / U)

    def per_group(values: Tensor) -> Tensor:  # [U] -> [B], summed within each group
        return torch.zeros(groups, dtype=values.dtype, device=values.device).index_add_(0, group_of, values)

    ids = per_group(torch.ones_like(c))  # [B], every group non-empty as B <= U
    high = ids.cumsum(0).long()  # [B], 1-based last rank
    occurrences = per_group(c)
    return {
        "rank_low": high - ids.long() + 1,
        "rank_high": high,
        "frequency": occurrences / ids,
        "occurrences": occurrences.round().long(),
        "mean_active": per_group(c * active) / occurrences,
    }


def token_ranking(token_ids: Tensor, experts_per_token: Tensor, min_count: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Token ids ranked by the mean number of experts they activate, over layers and occurrences
    (the paper's ``tab:dynamic_expert_number``).

    Args:
        token_ids: [T] integer token ids.
        experts_per_token: [L, T] experts active at each position in each of L layers (``cardinality``), >= 0.
        min_count: rank only ids occurring at least this often (a token seen once has a noisy mean), >= 1.

    Returns:
        (ids [U'] long, counts [U'] long, mean_active [U'] float64, the mean over the L layers and the
        occurrences) for the U' ids with ``counts >= min_count``, most experts first; ties go to the
        more frequent id, then to the smaller id.
    """
    if not isinstance(experts_per_token, Tensor) or experts_per_token.dim() != 2 or experts_per_token.shape[0] == 0:
        raise ValueError(
            f"experts_per_token must be a tensor [L, T] with L >= 1 layers, got {_describe(experts_per_token)}"
        )
    min_count = _validate.int_in("min_count", min_count, 1, sys.maxsize)
    ids, counts, mean_active = frequency_vs_active(token_ids, experts_per_token.double().mean(dim=0))
    kept = counts >= min_count
    ids, counts, mean_active = ids[kept], counts[kept], mean_active[kept]
    order = torch.argsort(counts, descending=True, stable=True)  # ids ascending within equal counts
    order = order[torch.argsort(mean_active[order], descending=True, stable=True)]
    return ids[order], counts[order], mean_active[order]


# ---------------------------------------------------------------------------------------------
# Everything for one layer


def layer_summary(
    probs: Tensor,
    selected: Tensor,
    token_ids: Tensor | None = None,
    *,
    alphas: Sequence[float] = (0.5, 0.9, 0.99),
    m: int = 4,
    num_bins: int = 40,
) -> dict:
    """The statistics of one MoE layer over T tokens, as JSON-able numbers.

    Args:
        probs: [T, N] routing probabilities (softmax of the router logits), N >= 2.
        selected: [T, N] bool, the experts each token was sent to; at least one True.
        token_ids: [T] integer token ids, or None to leave out the frequency statistics.
        alphas, m, num_bins: as for ``experts_to_cover``, the top-m masses and ``frequency_ranked``.

    Returns:
        A dict: ``tokens`` (T), ``experts`` (N); ``coverage``, {f"{α:g}": mean over tokens of the
        experts to cover α} (Fig. 3); ``top_m`` (m); ``assignment_top_mass`` and
        ``assignment_entropy`` of the layer's load (Fig. 4); ``token_top_mass`` and ``token_entropy``
        (means over tokens of ``token_top_mass`` and ``normalized_entropy`` of softmax(r));
        ``load`` (tokens per expert, N ints), ``load_cv``, ``max_vio``; ``cardinality_mean`` (Fig. 5)
        and ``cardinality_hist`` (tokens sent to 0, 1, ..., N experts: N + 1 ints); with
        ``token_ids``, ``frequency``: the lists of ``frequency_ranked`` (Fig. 6).
    """
    cover = experts_to_cover(probs, alphas).double().mean(-1)  # [A, T] -> [A]; checks probs
    chosen = _selected(selected)
    if chosen.shape != probs.shape:
        raise ValueError(f"selected must have the shape of probs, {list(probs.shape)}, got {list(chosen.shape)}")
    if not bool(chosen.any()):
        raise ValueError("selected must send at least one token to an expert")
    load = expert_load(chosen)  # [N]
    per_token = cardinality(chosen)  # [T]
    summary = {
        "tokens": probs.shape[0],
        "experts": probs.shape[1],
        "coverage": {f"{float(a):g}": float(c) for a, c in zip(alphas, cover)},
        "top_m": m,
        "assignment_top_mass": assignment_top_mass(load, m),
        "assignment_entropy": assignment_entropy(load),
        "token_top_mass": float(token_top_mass(probs, m).mean()),
        "token_entropy": float(normalized_entropy(probs).mean()),
        "load": load.tolist(),
        "load_cv": load_cv(load),
        "max_vio": max_vio(load),
        "cardinality_mean": float(per_token.double().mean()),
        "cardinality_hist": torch.bincount(per_token, minlength=probs.shape[1] + 1).tolist(),
    }
    if token_ids is not None:
        _, counts, mean_active = frequency_vs_active(token_ids, per_token.to(token_ids.device))
        ranked = frequency_ranked(counts, mean_active, num_bins)
        summary["frequency"] = {key: values.tolist() for key, values in ranked.items()}
    return summary
