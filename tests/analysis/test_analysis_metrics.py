"""Routing statistics on hand-made routings with known answers, their argument checks, and a smoke
test of the figures."""

import json
import math
import subprocess
import sys
from fractions import Fraction

import pytest
import torch

from probmoe.analysis import (
    assignment_entropy,
    assignment_top_mass,
    cardinality,
    expert_load,
    experts_to_cover,
    frequency_ranked,
    frequency_vs_active,
    layer_summary,
    load_cv,
    max_vio,
    normalized_entropy,
    plot_all,
    plot_coverage,
    token_ranking,
    token_top_mass,
)

ALPHAS = (0.25, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 3, 4, 10, 64, 100])
def test_uniform_routing(n, dtype):
    """Uniform over N: ceil(αN) experts cover α, also where αN is whole (0.9 * 10, 0.5 * 4), entropy 1."""
    uniform = [torch.full((5, n), 1 / n, dtype=dtype), torch.softmax(torch.zeros(5, n, dtype=dtype), -1)]
    for probs in uniform:
        expected = torch.tensor([[math.ceil(Fraction(str(a)) * n)] * 5 for a in ALPHAS])
        assert torch.equal(experts_to_cover(probs, ALPHAS), expected)
        assert torch.allclose(token_top_mass(probs, min(4, n)), torch.full((5,), min(4, n) / n, dtype=torch.float64))
        if n > 1:
            assert torch.allclose(normalized_entropy(probs), torch.ones(5, dtype=torch.float64))


def test_one_hot_routing():
    probs = torch.eye(8)[torch.tensor([3, 0, 7])]  # [3, 8]
    assert torch.equal(experts_to_cover(probs, ALPHAS), torch.ones(len(ALPHAS), 3, dtype=torch.long))
    assert torch.equal(normalized_entropy(probs), torch.zeros(3, dtype=torch.float64))  # 0 log 0 = 0, no NaN
    assert torch.equal(token_top_mass(probs), torch.ones(3, dtype=torch.float64))
    assert torch.equal(token_top_mass(probs, 1), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_known_distribution(dtype):
    probs = torch.tensor(
        [
            [0.05, 0.3, 0.5, 0.15],  # sorted: 0.5, 0.3, 0.15, 0.05
            [0.5, 0.5, 0.0, 0.0],
        ],
        dtype=dtype,
    )
    alphas = (0.5, 0.51, 0.8, 0.9, 0.95, 0.96, 1.0)
    cover = experts_to_cover(probs, alphas)  # [A, T]
    assert cover[:, 0].tolist() == [1, 2, 2, 3, 3, 4, 4]  # 0.95 is reached by 0.5 + 0.3 + 0.15 despite rounding
    assert cover[:, 1].tolist() == [1, 2, 2, 2, 2, 2, 2]  # α = 1: the experts with non-zero probability
    assert torch.allclose(token_top_mass(probs, 2), torch.tensor([0.8, 1.0], dtype=torch.float64))
    assert torch.allclose(token_top_mass(probs, 3), torch.tensor([0.95, 1.0], dtype=torch.float64))
    h = -(0.05 * math.log(0.05) + 0.3 * math.log(0.3) + 0.5 * math.log(0.5) + 0.15 * math.log(0.15))
    assert torch.allclose(normalized_entropy(probs), torch.tensor([h / math.log(4), 0.5], dtype=torch.float64))


def test_coverage_against_a_loop():
    """Random routings (no ties near α): the smallest k whose k largest probabilities reach α."""
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(200, 16, generator=gen), -1)
    alphas = (0.5, 0.9, 0.99)
    expected = [
        [next(k for k in range(1, 17) if sum(sorted(row, reverse=True)[:k]) >= a) for row in probs.tolist()]
        for a in alphas
    ]
    assert experts_to_cover(probs, alphas).tolist() == expected


def test_load_balance():
    load = torch.tensor([1, 2, 3, 6])  # mean 3, population variance (4 + 1 + 0 + 9) / 4
    assert load_cv(load) == pytest.approx(math.sqrt(3.5) / 3, rel=1e-12)
    assert max_vio(load) == pytest.approx(1.0, rel=1e-12)
    assert load_cv(load.double() / 12) == pytest.approx(math.sqrt(3.5) / 3, rel=1e-12)  # fractions work too
    assert load_cv(torch.tensor([5, 5, 5, 5])) == 0.0
    assert max_vio(torch.tensor([5, 5, 5, 5])) == 0.0
    assert max_vio(torch.tensor([8, 0, 0, 0])) == pytest.approx(3.0)  # N - 1: one expert takes everything
    assert load_cv(torch.tensor([8, 0, 0, 0])) == pytest.approx(math.sqrt(3))


def test_load_and_cardinality():
    selected = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1], [0, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    assert expert_load(selected).tolist() == [1, 3, 1, 2]
    assert cardinality(selected).tolist() == [2, 2, 3, 0]


def test_frequency_vs_active():
    ids, counts, mean = frequency_vs_active(torch.tensor([5, 3, 5, 7, 5, 3]), torch.tensor([2, 1, 4, 3, 3, 1]))
    assert ids.tolist() == [3, 5, 7]
    assert counts.tolist() == [2, 3, 1]
    assert mean.tolist() == [1.0, 3.0, 3.0]


def test_token_ranking():
    ids = torch.tensor([5, 3, 5, 7, 5, 3, 9, 9])
    experts = torch.tensor(
        [
            [2, 1, 4, 3, 3, 1, 2, 2],  # layer 0
            [4, 3, 2, 3, 3, 1, 2, 2],
        ]
    )  # layer 1: 5 -> (2+4+4+2+3+3)/6 = 3, 3 -> 1.5, 7 -> 3, 9 -> 2
    ranked, counts, mean = token_ranking(ids, experts)
    assert ranked.tolist() == [5, 7, 9, 3]  # 5 and 7 tie at 3 experts: the more frequent first
    assert counts.tolist() == [3, 1, 2, 2] and mean.tolist() == [3.0, 3.0, 2.0, 1.5]
    ranked, counts, mean = token_ranking(ids, experts, min_count=2)
    assert ranked.tolist() == [5, 9, 3] and counts.tolist() == [3, 2, 2]
    ranked, _, _ = token_ranking(torch.tensor([4, 2]), torch.tensor([[1, 1]]))
    assert ranked.tolist() == [2, 4]  # full tie: the smaller id first
    assert token_ranking(ids, experts, min_count=4)[0].numel() == 0


def test_frequency_ranked():
    """Ranks by increasing count (ties by id), groups of consecutive ranks, occurrence-weighted means."""
    counts, active = torch.tensor([30, 1, 100, 2]), torch.tensor([2.0, 1.0, 5.0, 3.0])  # ranks: 1, 2, 30, 100
    ranked = frequency_ranked(counts, active, num_bins=2)
    assert ranked["rank_low"].tolist() == [1, 3] and ranked["rank_high"].tolist() == [2, 4]
    assert torch.allclose(ranked["frequency"], torch.tensor([1.5, 65.0], dtype=torch.float64))
    assert ranked["occurrences"].tolist() == [3, 130]
    assert torch.allclose(ranked["mean_active"], torch.tensor([7 / 3, 560 / 130], dtype=torch.float64))
    ranked = frequency_ranked(counts, active)  # U = 4 <= 40 groups: each token its own
    assert ranked["rank_low"].tolist() == ranked["rank_high"].tolist() == [1, 2, 3, 4]
    assert ranked["frequency"].tolist() == [1.0, 2.0, 30.0, 100.0]
    assert ranked["mean_active"].tolist() == [1.0, 3.0, 2.0, 5.0]
    ranked = frequency_ranked(torch.tensor([4, 1, 4, 1, 4]), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), num_bins=3)
    assert ranked["rank_high"].tolist() == [2, 4, 5]  # 5 ranks in 3 groups: floor(r * 3 / 5), sizes 2, 2, 1
    assert ranked["mean_active"].tolist() == [3.0, 2.0, 5.0]  # ties by id: (ids 1, 3), (ids 0, 2), (id 4)
    assert sum(ranked["occurrences"].tolist()) == 14


def test_layer_summary():
    probs = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.5, 0.5]])
    selected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1]], dtype=torch.bool)
    summary = layer_summary(probs, selected, torch.tensor([9, 4, 9]), alphas=(0.5, 0.9), m=2)
    json.dumps(summary, allow_nan=False)
    assert summary["tokens"] == 3 and summary["experts"] == 4 and summary["top_m"] == 2
    assert summary["coverage"] == {"0.5": pytest.approx(4 / 3), "0.9": pytest.approx(3.0)}  # (1, 2, 1), (3, 4, 2)
    assert summary["token_top_mass"] == pytest.approx((0.8 + 0.5 + 1.0) / 3)
    assert summary["token_entropy"] == pytest.approx(float(normalized_entropy(probs).mean()))
    assert summary["assignment_top_mass"] == pytest.approx(3 / 5)  # loads 2, 1, 1, 1: the top 2 take 3 of 5
    h = -(0.4 * math.log(0.4) + 3 * 0.2 * math.log(0.2))
    assert summary["assignment_entropy"] == pytest.approx(h / math.log(4))
    assert summary["load"] == [2, 1, 1, 1]
    assert summary["load_cv"] == pytest.approx(load_cv(torch.tensor([2, 1, 1, 1])))
    assert summary["max_vio"] == pytest.approx(0.6)  # (2 - 1.25) / 1.25
    assert summary["cardinality_mean"] == pytest.approx(5 / 3)
    assert summary["cardinality_hist"] == [0, 1, 2, 0, 0]
    assert summary["frequency"] == {
        "rank_low": [1, 2],
        "rank_high": [1, 2],
        "frequency": [1.0, 2.0],
        "occurrences": [1, 2],
        "mean_active": [2.0, 1.5],
    }  # id 4 once, id 9 twice
    assert "frequency" not in layer_summary(probs, selected)


def test_core_modules_import_neither_transformers_nor_matplotlib():
    code = (
        "import sys, probmoe.analysis, probmoe.eval; "
        "print(sorted(m for m in ('transformers', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


P = torch.full((2, 4), 0.25)
S = torch.ones(2, 4, dtype=torch.bool)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: experts_to_cover([[0.5, 0.5]]), "probs must be a floating-point torch.Tensor"),
        (lambda: experts_to_cover(torch.ones(2, 2, dtype=torch.long)), "probs must be a floating-point"),
        (lambda: experts_to_cover(torch.full((4,), 0.25)), r"probs must have shape \[T, N\]"),
        (lambda: experts_to_cover(torch.zeros(0, 4)), "T >= 1 tokens"),
        (lambda: experts_to_cover(torch.tensor([[1.5, -0.5]])), "probs must be finite and >= 0"),
        (lambda: experts_to_cover(torch.tensor([[math.nan, 1.0]])), "probs must be finite"),
        (lambda: experts_to_cover(torch.tensor([[0.5, 0.4]])), "probs rows must sum to 1"),
        (lambda: experts_to_cover(P, ()), r"alphas must be a non-empty sequence of numbers in \(0, 1\]"),
        (lambda: experts_to_cover(P, (0.5, 0.0)), r"alphas must be numbers in \(0, 1\]"),
        (lambda: experts_to_cover(P, (1.5,)), r"alphas must be numbers in \(0, 1\]"),
        (lambda: experts_to_cover(P, 0.5), "alphas must be a non-empty sequence"),
        (lambda: experts_to_cover(P, (True,)), "alphas must be numbers"),
        (lambda: token_top_mass(P, 0), r"m must be in \[1, 4\] \(N = 4 experts\)"),
        (lambda: token_top_mass(P, 5), r"m must be in \[1, 4\]"),
        (lambda: token_top_mass(P, 2.0), "m must be an integer"),
        (lambda: normalized_entropy(torch.ones(3, 1)), "N >= 2 experts"),
        (lambda: expert_load(torch.ones(2, 4)), "selected must be a bool torch.Tensor"),
        (lambda: cardinality(torch.ones(4, dtype=torch.bool)), r"selected must have shape \[T, N\]"),
        (lambda: load_cv(torch.zeros(4)), "load must have a positive total"),
        (lambda: load_cv(torch.tensor([1.0, -1.0, 2.0])), "load must be finite and >= 0"),
        (lambda: max_vio(torch.tensor([])), "load must have shape"),
        (lambda: max_vio(torch.ones(2, 2)), r"load must have shape \[N\]"),
        (lambda: max_vio([1, 2]), "load must be a real torch.Tensor"),
        (lambda: load_cv(torch.ones(3, dtype=torch.bool)), "load must be a real torch.Tensor"),
        (lambda: frequency_vs_active(torch.tensor([1.0, 2.0]), torch.tensor([1, 2])), "token_ids must be an integer"),
        (lambda: frequency_vs_active(torch.tensor([1, 2]), torch.tensor([1, 2, 3])), "experts_per_token must match"),
        (lambda: frequency_vs_active(torch.tensor([1, 2]), torch.tensor([1, -2])), "experts_per_token must be finite"),
        (
            lambda: frequency_vs_active(torch.tensor([], dtype=torch.long), torch.tensor([])),
            "token_ids must have shape",
        ),
        (lambda: frequency_ranked(torch.tensor([0, 2]), torch.tensor([1.0, 1.0])), "counts must be whole numbers >= 1"),
        (lambda: frequency_ranked(torch.tensor([1.5, 2]), torch.tensor([1.0, 1.0])), "counts must be whole numbers"),
        (
            lambda: frequency_ranked(torch.tensor([1, 2]), torch.tensor([1.0])),
            "mean_active must have the shape of counts",
        ),
        (
            lambda: frequency_ranked(torch.tensor([1, 2]), torch.tensor([1.0, 1.0]), 0),
            r"num_bins must be in \[1, 1000\]",
        ),
        (lambda: assignment_top_mass(torch.tensor([1, 2]), 3), r"m must be in \[1, 2\] \(N = 2 experts\)"),
        (lambda: assignment_top_mass(torch.zeros(3)), "load must have a positive total"),
        (lambda: assignment_entropy(torch.tensor([4])), "N >= 2 experts"),
        (lambda: assignment_entropy(torch.tensor([1.0, -1.0])), "load must be finite and >= 0"),
        (
            lambda: token_ranking(torch.tensor([1, 2]), torch.tensor([1, 2])),
            r"experts_per_token must be a tensor \[L, T\]",
        ),
        (lambda: token_ranking(torch.tensor([1, 2]), torch.ones(2, 3)), "experts_per_token must match"),
        (lambda: token_ranking(torch.tensor([1, 2]), torch.ones(1, 2), 0), "min_count must be in"),
        (lambda: layer_summary(P, S[:1]), "selected must have the shape of probs"),
        (lambda: layer_summary(P, torch.zeros(2, 4, dtype=torch.bool)), "selected must send at least one token"),
        (lambda: layer_summary(P, S, torch.tensor([1, 2, 3])), "experts_per_token must match"),
    ],
)
def test_bad_inputs_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _routing_summaries(seed: int, layers: int, scale: float, k: int) -> list[dict]:
    """Layer summaries of a random routing: softmax(scale * noise) with top-k, or top-(k-1..k+1) at random."""
    gen = torch.Generator().manual_seed(seed)
    tokens = (torch.rand(4000, generator=gen) ** 4 * 500).long()  # a skewed vocabulary
    out = []
    for _ in range(layers):
        probs = torch.softmax(scale * torch.randn(4000, 16, generator=gen), -1)
        sizes = torch.randint(k - 1, k + 2, (4000, 1), generator=gen)
        selected = torch.arange(16) < sizes  # [T, N]: the first `size` ranks
        selected = torch.zeros_like(selected).scatter(1, probs.argsort(-1, descending=True), selected)
        out.append(layer_summary(probs, selected, tokens))
    return out


def test_plots_write_png_files(tmp_path):
    summaries = {
        "conventional top-4": _routing_summaries(0, 6, 1.0, 4),
        "ProbMoE dynamic-k": _routing_summaries(1, 6, 2.5, 3),
    }
    paths = plot_all(summaries, tmp_path / "figures")
    assert sorted(p.name for p in paths) == [
        "cardinality.png",
        "concentration.png",
        "coverage.png",
        "frequency.png",
        "load.png",
    ]
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, path
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width >= 600 and height >= 400, (path, width, height)  # 150 dpi
    without_tokens = {
        run: [{k: v for k, v in layer.items() if k != "frequency"} for layer in layers]
        for run, layers in summaries.items()
    }
    assert len(plot_all(without_tokens, tmp_path / "no-tokens")) == 4


@pytest.mark.parametrize(
    "summaries, message",
    [
        ({}, "summaries must be a non-empty mapping"),
        ([], "summaries must be a non-empty mapping"),
        ({"run": []}, r"summaries\['run'\] must hold at least one layer summary"),
        ({"run": [{"experts": 4}]}, r"summaries\['run'\]\[0\] must be a layer_summary with \['coverage'\]"),
        (
            {"a": [{"experts": 4, "coverage": {"0.5": 1.0}}], "b": [{"experts": 4, "coverage": {"0.9": 2.0}}]},
            "summaries must all hold coverage for the same alphas",
        ),
    ],
)
def test_bad_summaries_raise(tmp_path, summaries, message):
    with pytest.raises(ValueError, match=message):
        plot_coverage(summaries, tmp_path / "x.png")
