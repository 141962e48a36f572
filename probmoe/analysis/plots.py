"""Figures of the routing analyses: several runs side by side, one point per MoE layer.

Every function takes ``summaries``, ``{run name: [metrics.layer_summary of layer 0, 1, ...]}``,
and a PNG path, draws with matplotlib's object API on an Agg canvas (no display, no pyplot state;
matplotlib is imported only when a figure is drawn) and returns the path written:

    plot_coverage       experts needed to cover α of the routing mass, per layer (paper Fig. 3)
    plot_concentration  top-m mass and normalised entropy per layer (Fig. 4)
    plot_cardinality    mean experts per token per layer, and the distribution over all layers (Fig. 5)
    plot_frequency      token frequency against mean active experts, log x (Fig. 6)
    plot_load           load imbalance per layer: coefficient of variation and MaxVio
    plot_all            all of them into one folder
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

DPI = 150
_PANEL = (4.6, 3.4)  # inches per panel


def _check(summaries, keys: Sequence[str]) -> dict[str, list[dict]]:
    """``summaries`` as {run: [layer dicts]}, each layer dict holding ``keys``; ValueError otherwise."""
    if not isinstance(summaries, Mapping) or not summaries:
        raise ValueError(f"summaries must be a non-empty mapping {{run name: [layer_summary per layer]}}, "
                         f"got {type(summaries).__name__}")
    for run, layers in summaries.items():
        if not isinstance(run, str) or isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
            raise ValueError(f"summaries must map run names (str) to lists of layer summaries, got {run!r}")
        if not layers:
            raise ValueError(f"summaries[{run!r}] must hold at least one layer summary")
        for i, layer in enumerate(layers):
            missing = [k for k in keys if not isinstance(layer, Mapping) or k not in layer]
            if missing:
                raise ValueError(f"summaries[{run!r}][{i}] must be a layer_summary with {missing}")
    return {run: list(layers) for run, layers in summaries.items()}


def _figure(ncols: int, title: str):
    """A figure with ``ncols`` panels side by side on an Agg canvas, and its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(_PANEL[0] * ncols, _PANEL[1]), layout="constrained")  # tight, legend included
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    fig.suptitle(title)
    return fig, axes


def _per_layer(ax, runs: dict[str, list[dict]], value, ylabel: str, title: str) -> None:
    """One line per run: ``value(layer summary)`` against the layer index."""
    from matplotlib.ticker import MaxNLocator

    for i, (run, layers) in enumerate(runs.items()):
        ax.plot(range(len(layers)), [value(layer) for layer in layers], marker="o", markersize=4, color=f"C{i}",
                label=run)
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def _save(fig, path) -> Path:
    """Write ``fig`` to ``path`` as PNG, with one legend of the runs below the panels."""
    handles, labels = fig.axes[0].get_legend_handles_labels()
    per_row = max(1, round(fig.get_figwidth() / 2.3))  # about 2.3 inches per legend entry: never clipped
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), per_row), frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def plot_coverage(summaries: Mapping[str, Sequence[dict]], path) -> Path:
    """Mean number of experts whose largest probabilities cover α of the routing mass, one panel per α."""
    runs = _check(summaries, ["coverage", "experts"])
    alphas = list(next(iter(runs.values()))[0]["coverage"])
    if any(list(layer["coverage"]) != alphas for layers in runs.values() for layer in layers):
        raise ValueError(f"summaries must all hold coverage for the same alphas, {alphas}")
    fig, axes = _figure(len(alphas), "Experts needed to cover a fraction α of the routing probability")
    for ax, alpha in zip(axes, alphas):
        _per_layer(ax, runs, lambda layer: layer["coverage"][alpha], "mean experts per token", f"α = {alpha}")
        ax.set_ylim(bottom=0)
    return _save(fig, path)


def plot_concentration(summaries: Mapping[str, Sequence[dict]], path) -> Path:
    """Mean top-m probability mass and mean normalised entropy per layer."""
    runs = _check(summaries, ["top_m", "top_mass", "entropy"])
    fig, axes = _figure(2, "Concentration of the routing distribution")
    top_ms = sorted({layer["top_m"] for layers in runs.values() for layer in layers})
    m = top_ms[0] if len(top_ms) == 1 else "m"
    _per_layer(axes[0], runs, lambda layer: layer["top_mass"], f"mean top-{m} mass", f"Mass of the top {m} experts")
    _per_layer(axes[1], runs, lambda layer: layer["entropy"], "mean H(p) / log N", "Normalised entropy")
    for ax in axes:
        ax.set_ylim(0, 1.02)
    return _save(fig, path)


def plot_cardinality(summaries: Mapping[str, Sequence[dict]], path) -> Path:
    """Mean experts per token per layer, and the share of tokens sent to c experts over all layers."""
    from matplotlib.ticker import MaxNLocator

    runs = _check(summaries, ["cardinality_mean", "cardinality_hist"])
    fig, axes = _figure(2, "Experts activated per token")
    _per_layer(axes[0], runs, lambda layer: layer["cardinality_mean"], "mean experts per token", "Mean per layer")
    axes[0].set_ylim(bottom=0)
    shares = {}
    for run, layers in runs.items():
        hist = [0] * max(len(layer["cardinality_hist"]) for layer in layers)  # tokens with 0, 1, ... experts
        for layer in layers:
            for c, tokens in enumerate(layer["cardinality_hist"]):
                hist[c] += tokens
        shares[run] = [tokens / sum(hist) for tokens in hist]
    used = [c for share in shares.values() for c, s in enumerate(share) if s > 0]
    xs = range(min(used), max(used) + 1)
    width = 0.8 / len(shares)
    for i, (run, share) in enumerate(shares.items()):
        axes[1].bar([c - 0.4 + width * (i + 0.5) for c in xs], [share[c] if c < len(share) else 0 for c in xs],
                    width=width, color=f"C{i}", label=run)
    axes[1].set_xlabel("experts per token")
    axes[1].set_ylabel("share of tokens (all layers)")
    axes[1].set_title("Distribution over all layers", fontsize="medium")
    axes[1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].grid(alpha=0.3, axis="y")
    return _save(fig, path)


def plot_frequency(summaries: Mapping[str, Sequence[dict]], path) -> Path:
    """Token frequency (log scale) against the mean number of active experts, averaged over layers.

    The layers' ``frequency`` bins are averaged bin by bin (the bins agree when every layer saw the
    same tokens); one line per run.
    """
    runs = _check(summaries, ["frequency"])
    fig, axes = _figure(1, "Token frequency and active experts")
    ax = axes[0]
    for i, (run, layers) in enumerate(runs.items()):
        bins: dict[float, list[float]] = {}
        for layer in layers:
            for f, a in zip(layer["frequency"]["frequency"], layer["frequency"]["mean_active"]):
                bins.setdefault(f, []).append(a)
        xs = sorted(bins)
        ax.plot(xs, [sum(bins[f]) / len(bins[f]) for f in xs], marker="o", markersize=4, color=f"C{i}", label=run)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("token frequency (occurrences)")
    ax.set_ylabel("mean active experts (over layers)")
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_load(summaries: Mapping[str, Sequence[dict]], path) -> Path:
    """Load imbalance per layer: the coefficient of variation of the expert load, and MaxVio."""
    runs = _check(summaries, ["load_cv", "max_vio"])
    fig, axes = _figure(2, "Expert load balance (0 = perfectly balanced)")
    _per_layer(axes[0], runs, lambda layer: layer["load_cv"], "std / mean of the load", "Coefficient of variation")
    _per_layer(axes[1], runs, lambda layer: layer["max_vio"], "(max − mean) / mean load", "MaxVio")
    for ax in axes:
        ax.set_ylim(bottom=0)
    return _save(fig, path)


def plot_all(summaries: Mapping[str, Sequence[dict]], folder) -> list[Path]:
    """Every figure above into ``folder`` (coverage.png, concentration.png, cardinality.png, load.png,
    and frequency.png when every layer summary has token frequencies); the paths written."""
    runs = _check(summaries, [])
    folder = Path(folder)
    paths = [plot_coverage(runs, folder / "coverage.png"),
             plot_concentration(runs, folder / "concentration.png"),
             plot_cardinality(runs, folder / "cardinality.png"),
             plot_load(runs, folder / "load.png")]
    if all("frequency" in layer for layers in runs.values() for layer in layers):
        paths.append(plot_frequency(runs, folder / "frequency.png"))
    return paths
