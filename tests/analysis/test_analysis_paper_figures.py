"""The paper's routing analyses (Figs. 3-6) as its captions define them, on routings built by hand,
each number worked out independently of ``probmoe.analysis`` (plain Python, ``math``)."""

import math

import pytest
import torch

from probmoe.analysis import (
    assignment_entropy,
    assignment_top_mass,
    expert_load,
    experts_to_cover,
    layer_summary,
    normalized_entropy,
    token_top_mass,
)


def _selected(rows: list[list[int]], n: int) -> torch.Tensor:
    """[T, n] bool from each token's list of experts."""
    out = torch.zeros(len(rows), n, dtype=torch.bool)
    for t, experts in enumerate(rows):
        out[t, experts] = True
    return out


def _entropy(counts: list[int]) -> float:
    total = sum(counts)
    return -sum(c / total * math.log(c / total) for c in counts if c) / math.log(len(counts))


def test_fig4_top4_assignment_mass_and_entropy_by_hand():
    """fig:expert_utilization: "the fraction of assignments captured by the four most frequently used
    experts per layer" and "the normalized entropy of the expert assignment distribution"."""
    assignments = [[0, 1], [0, 2], [0, 1], [3, 0], [1, 5], [0, 7], [6, 0], [1, 2], [4, 0], [0, 1]]  # 10 tokens, top-2
    counts = [sum(e in row for row in assignments) for e in range(8)]  # assignments per expert
    assert counts == [8, 5, 2, 1, 1, 1, 1, 1] and sum(counts) == 20
    load = expert_load(_selected(assignments, 8))
    assert load.tolist() == counts
    assert assignment_top_mass(load) == pytest.approx((8 + 5 + 2 + 1) / 20)  # 0.8
    assert assignment_top_mass(load, 1) == pytest.approx(8 / 20)
    assert assignment_entropy(load) == pytest.approx(_entropy(counts), rel=1e-12)
    assert assignment_top_mass(torch.full((8,), 3)) == pytest.approx(4 / 8)  # balanced: m / N, entropy 1
    assert assignment_entropy(torch.full((8,), 3)) == pytest.approx(1.0)
    assert assignment_entropy(torch.tensor([0, 6, 0, 0])) == 0.0  # one expert takes everything
    assert assignment_top_mass(torch.tensor([0, 6, 0, 0])) == 1.0


def test_fig4_counts_assignments_not_token_sharpness():
    """Sharp routers spread evenly over the experts: the per-token measures say 'concentrated', the
    paper's layer measures 'balanced'; flat routers always sent to the same experts: the reverse."""
    sharp = torch.eye(8).repeat(2, 1)  # 16 tokens, each one-hot on its own expert, every expert twice
    chosen = sharp.bool()
    summary = layer_summary(sharp, chosen)
    assert token_top_mass(sharp).tolist() == [1.0] * 16 and summary["token_top_mass"] == 1.0
    assert summary["token_entropy"] == 0.0
    assert summary["assignment_top_mass"] == pytest.approx(0.5) and summary["assignment_entropy"] == pytest.approx(1)
    flat = torch.full((16, 8), 1 / 8)
    same = _selected([[2, 5]] * 16, 8)  # every token to experts 2 and 5
    summary = layer_summary(flat, same)
    assert summary["token_top_mass"] == pytest.approx(0.5) and summary["token_entropy"] == pytest.approx(1.0)
    assert summary["assignment_top_mass"] == 1.0
    assert summary["assignment_entropy"] == pytest.approx(_entropy([0, 0, 16, 0, 0, 16, 0, 0]))  # log 2 / log 8
    assert float(normalized_entropy(flat).mean()) == pytest.approx(1.0)


def test_fig3_routing_breadth_by_hand():
    """fig:routing_breadth: "the minimum number of experts required to cumulatively account for 99% of
    the routing probability mass per token", per layer, aggregated (averaged) over tokens."""
    probs = torch.tensor(
        [
            [0.99, 0.01, 0.0, 0.0],  # 1 expert reaches 0.99
            [0.05, 0.5, 0.15, 0.3],  # 0.5, 0.8, 0.95 < 0.99: all 4
            [0.25, 0.25, 0.25, 0.25],  # 0.75 < 0.99 <= 1.0: 4
            [0.39, 0.0, 0.6, 0.01],
        ]
    )  # 0.6 + 0.39 = 0.99: 2
    expected = []
    for row in probs.tolist():
        mass, k = 0.0, 0
        for p in sorted(row, reverse=True):
            mass, k = mass + p, k + 1
            if mass >= 0.99 - 1e-6:
                break
        expected.append(k)
    assert expected == [1, 4, 4, 2]
    assert experts_to_cover(probs, (0.99,))[0].tolist() == expected
    summary = layer_summary(probs, probs > 0.2, alphas=(0.99,))
    assert summary["coverage"]["0.99"] == pytest.approx(sum(expected) / 4)  # 2.75


def test_fig5_mean_cardinality_per_layer_and_data_set(tmp_path, monkeypatch):
    """fig:dynamic_6-8: "average routing cardinality at each layer" under Dynamic-k, per data set:
    the figure's points are the mean experts per token of each layer, one line per data set."""
    pytest.importorskip("matplotlib")
    from probmoe.analysis import plots

    layers = {
        "gsm": [[[0, 1], [2], [0, 3, 4]], [[1], [1, 2], [5]]],  # 3 tokens, 2 layers, experts per token
        "law": [[[0, 1, 2, 3], [4, 5]], [[6, 7, 0], [1, 2, 3]]],
    }
    expected = {"gsm": [(2 + 1 + 3) / 3, (1 + 2 + 1) / 3], "law": [(4 + 2) / 2, (3 + 3) / 2]}
    summaries = {}
    for data, per_layer in layers.items():
        summaries[data] = []
        for rows in per_layer:
            chosen = _selected(rows, 8)
            summaries[data].append(layer_summary(torch.full((len(rows), 8), 1 / 8), chosen))
        assert [s["cardinality_mean"] for s in summaries[data]] == pytest.approx(expected[data])
    kept = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.append(fig) or path)
    plots.plot_cardinality(summaries, tmp_path / "c.png")
    lines = [line for line in kept[0].axes[0].get_lines() if not line.get_label().startswith("_")]
    assert [line.get_label() for line in lines] == ["gsm", "law"]
    for line, data in zip(lines, layers):
        assert list(line.get_ydata()) == pytest.approx(expected[data])


def test_fig6_frequency_curve_histogram_and_uniform_line(tmp_path, monkeypatch):
    """fig:tok_freq: tokens ordered by increasing frequency; the solid curve is the mean number of
    active experts per token, the shaded histogram (right axis, log) the token frequency, the dashed
    line the expectation under a token-independent assignment (the overall mean)."""
    pytest.importorskip("matplotlib")
    from probmoe.analysis import plots

    ids = [7, 7, 7, 7, 3, 3, 9, 7, 3, 5]  # counts: 5 -> 1, 9 -> 1, 3 -> 3, 7 -> 5
    experts = [2, 2, 3, 2, 4, 5, 6, 3, 3, 8]
    counts = {t: ids.count(t) for t in set(ids)}
    order = sorted(counts, key=lambda t: (counts[t], t))  # by increasing frequency, ties by id
    assert order == [5, 9, 3, 7]
    mean = [sum(e for i, e in zip(ids, experts) if i == t) / counts[t] for t in order]  # 8, 6, 4, 2.4
    overall = sum(experts) / len(experts)
    layer = layer_summary(
        torch.full((10, 8), 1 / 8), torch.arange(8)[None, :] < torch.tensor(experts)[:, None], torch.tensor(ids)
    )
    kept = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.append(fig) or path)
    plots.plot_frequency({"dynamic": [layer, layer]}, tmp_path / "f.png")
    ax, right = kept[0].axes
    curve = next(line for line in ax.get_lines() if line.get_label() == "dynamic")
    assert list(curve.get_xdata()) == [1, 2, 3, 4] and list(curve.get_ydata()) == pytest.approx(mean)
    assert curve.get_linestyle() == "-"
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and list(dashed[0].get_ydata()) == pytest.approx([overall, overall])
    assert right.get_yscale() == "log"
    bars = right.patches
    assert [b.get_height() for b in bars] == [counts[t] for t in order]
    assert [b.get_x() + b.get_width() / 2 for b in bars] == [1, 2, 3, 4]
    assert ax.get_xlabel().startswith("tokens by increasing frequency")
