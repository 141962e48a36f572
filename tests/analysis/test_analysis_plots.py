"""The figures as a reader sees them: runs with equal values stay visible, whole-number axes, headroom, labels inside."""

import pytest
import torch

pytest.importorskip("matplotlib")

from probmoe.analysis import layer_summary, plots


def _top2(seed: int, n: int = 8) -> list[dict]:
    """Two layers routed top-2 (every token exactly 2 experts) from softmax(noise)."""
    g = torch.Generator().manual_seed(seed)
    tokens = (torch.rand(500, generator=g) ** 3 * 100).long()
    out = []
    for _ in range(2):
        probs = torch.softmax(torch.randn(500, n, generator=g), -1)
        chosen = torch.zeros(500, n, dtype=torch.bool).scatter(1, probs.topk(2, -1).indices, True)
        out.append(layer_summary(probs, chosen, tokens))
    return out


@pytest.fixture
def figures(monkeypatch):
    """Every figure the plot functions save, kept (as drawn) for inspection."""
    kept = []
    original = plots._save

    def keep(fig, path):
        kept.append(fig)
        return original(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return kept


def _lines(ax):
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_identical_runs_stay_visible(tmp_path, figures):
    same = _top2(0)
    runs = {"conventional": same, "frozen": same, "probmoe": _top2(1)}
    plots.plot_all(runs, tmp_path)
    per_layer = [ax for fig in figures for ax in fig.axes if _lines(ax)]
    assert len(per_layer) == 3 + 2 + 1 + 2 + 1  # coverage, concentration, cardinality, load, frequency
    for ax in per_layer:
        a, b, _ = _lines(ax)
        assert list(a.get_ydata()) == list(b.get_ydata())  # the same values ...
        assert all(xa != xb for xa, xb in zip(a.get_xdata(), b.get_xdata()))  # ... drawn apart
        assert (a.get_marker(), a.get_linestyle()) != (b.get_marker(), b.get_linestyle())
        assert a.get_markersize() > b.get_markersize()  # the later run leaves a ring of the earlier one
        spread = max(abs(xa - xb) / (abs(xa) + 1) for xa, xb in zip(a.get_xdata(), b.get_xdata()))
        assert spread < 0.5  # an offset, never a move to another layer or bin


def test_axes_read_as_a_user_expects(tmp_path, figures):
    runs = {f"run {i}": _top2(i) for i in range(7)}  # seven runs: a legend of several rows
    plots.plot_cardinality(runs, tmp_path / "c.png")
    histogram = figures[-1].axes[1]
    assert list(histogram.get_xticks()) == [2]  # every token has 2 experts: one whole-number tick
    low, high = histogram.get_xlim()
    assert low < 1.5 and high > 2.5
    plots.plot_coverage(runs, tmp_path / "cov.png")
    for ax in figures[-1].axes:  # nothing sits on the top edge
        top = max(y for line in _lines(ax) for y in line.get_ydata())
        assert ax.get_ylim()[1] >= 1.1 * top
    plots.plot_frequency(runs, tmp_path / "f.png")
    fig = figures[-1]
    renderer = fig.canvas.get_renderer()
    label = fig.axes[0].yaxis.label.get_window_extent(renderer)
    box = fig.bbox
    assert label.y0 >= box.y0 and label.y1 <= box.y1 and label.x0 >= box.x0  # the y label is inside the figure
    assert _lines(fig.axes[0])[0].get_ydata()[0] == 2.0 and fig.axes[0].get_ylim()[1] > 2.0
