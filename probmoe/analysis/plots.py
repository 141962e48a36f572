"""Figures of the routing analyses: several runs side by side, one point per MoE layer.

Every function takes ``summaries``, ``{run name: [metrics.layer_summary of layer 0, 1, ...]}``,
and a PNG path, draws with matplotlib's object API on an Agg canvas (no display, no pyplot state;
matplotlib is imported only when a figure is drawn) and returns the path written:

    plot_coverage       experts needed to cover α of the routing mass, per layer (paper Fig. 3)
    plot_concentration  top-m assignment mass and normalised assignment entropy per layer (Fig. 4)
    plot_cardinality    mean experts per token per layer, and the distribution over all layers (Fig. 5)
    plot_frequency      tokens by increasing frequency: mean active experts, the frequency histogram
                        (right axis, log) and the uniform expectation (Fig. 6)
    plot_load           load imbalance per layer: coefficient of variation and MaxVio
    plot_all            all of them into one folder

Runs with the same values stay visible: each run has its own colour, marker and line style, runs
are offset slightly along x (a fraction of a layer; a few hundredths of a decade on the frequency
axis), and markers shrink from the first run to the last, so a later run drawn over an earlier one
leaves a ring. Axes that start at 0 end above the largest value (``_HEADROOM``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

DPI = 150
_PANEL = (4.6, 3.4)  # inches per panel
_LEGEND_ROW = 0.3  # inches per row of the legend below the panels
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINESTYLES = ("-", "--", "-.", ":")
_HEADROOM = 1.12  # top of a y axis from 0, over the largest value drawn
_SPREAD = 0.3  # the runs' x offsets span at most this much of a layer


def _style(i: int, runs: int) -> dict:
    """Line style of run ``i`` of ``runs``: colour, marker, line style, a marker size shrinking from 7 to 3."""
    size = 7 - 4 * i / max(runs - 1, 1)
    return dict(
        color=f"C{i % 10}",
        marker=_MARKERS[i % len(_MARKERS)],
        linestyle=_LINESTYLES[i % len(_LINESTYLES)],
        markersize=size,
        linewidth=1.4,
    )


def _offset(i: int, runs: int) -> float:
    """Run ``i``'s offset in [-_SPREAD / 2, _SPREAD / 2], 0 for a single run."""
    return 0.0 if runs == 1 else _SPREAD * (i / (runs - 1) - 0.5)


def _headroom(ax, values) -> None:
    """y from 0 to _HEADROOM times the largest of ``values`` (1 when all are 0)."""
    top = max([v for v in values if v == v] or [0.0])
    ax.set_ylim(0, top * _HEADROOM if top > 0 else 1.0)


def _check(summaries, keys: Sequence[str]) -> dict[str, list[dict]]:
    """``summaries`` as {run: [layer dicts]}, each layer dict holding ``keys``; ValueError otherwise."""
    if not isinstance(summaries, Mapping) or not summaries:
        raise ValueError(
            f"summaries must be a non-empty mapping {{run name: [layer_summary per layer]}}, "
            f"got {type(summaries).__name__}"
        )
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


def _legend_columns(width: float, runs: int) -> int:
    return min(runs, max(1, round(width / 2.3)))  # about 2.3 inches per legend entry: never clipped


def _figure(ncols: int, title: str, runs: int):
    """A figure with ``ncols`` panels side by side on an Agg canvas, and its axes; taller by a
    legend row per ``_legend_columns`` runs, so the panels keep their height (and their labels fit)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width = _PANEL[0] * ncols
    rows = -(-runs // _legend_columns(width, runs))
    fig = Figure(figsize=(width, _PANEL[1] + _LEGEND_ROW * rows), layout="constrained")  # tight, legend included
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    fig.suptitle(title)
    return fig, axes


def _per_layer(ax, runs: dict[str, list[dict]], value, ylabel: str, title: str) -> list[float]:
    """One line per run: ``value(layer summary)`` against the layer index (offset per run); the values drawn."""
    from matplotlib.ticker import MaxNLocator

    drawn = []
    for i, (run, layers) in enumerate(runs.items()):
        ys = [value(layer) for layer in layers]
        ax.plot([x + _offset(i, len(runs)) for x in range(len(layers))], ys, label=run, **_style(i, len(runs)))
        drawn += ys
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    return drawn


def _save(fig, path) -> Path:
    """Write ``fig`` to ``path`` as PNG, with one legend of the runs below the panels."""
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=_legend_columns(fig.get_figwidth(), len(labels)),
        frameon=False,
    )
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
    fig, axes = _figure(len(alphas), "Experts needed to cover a fraction α of the routing probability", len(runs))
    for ax, alpha in zip(axes, alphas):
        _headroom(
            ax, _per_layer(ax, runs, lambda layer: layer["coverage"][alpha], "mean experts per token", f"α = {alpha}")
        )
    return _save(fig, path)


def plot_concentration(summaries: Mapping[str, Sequence[dict]], path) -> Path:
    """The paper's Fig. 4 per layer: the fraction of the layer's expert assignments taken by its
    m most used experts, and the normalised entropy of its assignment distribution."""
    runs = _check(summaries, ["top_m", "experts", "assignment_top_mass", "assignment_entropy"])
    fig, axes = _figure(2, "Concentration of the expert assignments", len(runs))
    top_ms = sorted({layer["top_m"] for layers in runs.values() for layer in layers})
    m = top_ms[0] if len(top_ms) == 1 else "m"
    experts = sorted({layer["experts"] for layers in runs.values() for layer in layers})
    balanced = f"; dotted: balanced, {m}/{experts[0]}" if len(top_ms) == 1 and len(experts) == 1 else ""
    _per_layer(
        axes[0],
        runs,
        lambda layer: layer["assignment_top_mass"],
        "share of assignments",
        f"Top-{m} assignment mass{balanced}",
    )
    if balanced:
        axes[0].axhline(m / experts[0], color="0.5", linestyle=":", linewidth=1.2)
    _per_layer(
        axes[1],
        runs,
        lambda layer: layer["assignment_entropy"],
        "H(load share) / log N",
        "Normalised assignment entropy",
    )
    for ax in axes:
        ax.set_ylim(0, _HEADROOM)  # both are fractions in [0, 1]
    return _save(fig, path)


def plot_cardinality(summaries: Mapping[str, Sequence[dict]], path) -> Path:
    """Mean experts per token per layer, and the share of tokens sent to c experts over all layers."""
    runs = _check(summaries, ["cardinality_mean", "cardinality_hist"])
    fig, axes = _figure(2, "Experts activated per token", len(runs))
    _headroom(
        axes[0],
        _per_layer(axes[0], runs, lambda layer: layer["cardinality_mean"], "mean experts per token", "Mean per layer"),
    )
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
        axes[1].bar(
            [c - 0.4 + width * (i + 0.5) for c in xs],
            [share[c] if c < len(share) else 0 for c in xs],
            width=width,
            color=f"C{i}",
            label=run,
        )
    axes[1].set_xlabel("experts per token")
    axes[1].set_ylabel("share of tokens (all layers)")
    axes[1].set_title("Distribution over all layers", fontsize="medium")
    axes[1].set_xlim(min(xs) - 0.7, max(xs) + 0.7)  # whole counts only, with room beside the outer bars
    axes[1].set_xticks(list(xs) if len(xs) <= 12 else list(xs)[:: -(-len(xs) // 12)])  # whole counts, at most 12
    axes[1].set_ylim(0, _HEADROOM * max(s for share in shares.values() for s in share))
    axes[1].grid(alpha=0.3, axis="y")
    return _save(fig, path)


def plot_frequency(summaries: Mapping[str, Sequence[dict]], path) -> Path:
    """The paper's Fig. 6: tokens ordered by increasing frequency (x, rank), the mean number of
    active experts per token (solid, left axis, mean over layers), the token frequency as a shaded
    histogram (right axis, log scale) and, dashed, the expectation under an assignment independent of
    the token: every token would activate the overall mean number of experts.

    The layers' ``frequency`` groups are averaged group by group (they agree when every layer saw
    the same tokens, as in ``probmoe-analyze``); the histogram is the first run's (the runs of one
    analysis route the same text); one curve and one dashed line per run.
    """
    runs = _check(summaries, ["frequency", "cardinality_mean"])
    fig, axes = _figure(1, "Token frequency and active experts\n(mean over layers)", len(runs))
    ax = axes[0]
    counts = ax.twinx()
    first = next(iter(runs.values()))[0]["frequency"]
    low, high = first["rank_low"], first["rank_high"]
    counts.bar(
        [(a + b) / 2 for a, b in zip(low, high)],
        first["frequency"],
        width=[b - a + 1 for a, b in zip(low, high)],
        color="0.6",
        alpha=0.35,
        linewidth=0,
        label="_token frequency",
    )
    counts.set_yscale("log")
    counts.set_ylabel("token frequency (occurrences; shaded)")
    ax.set_zorder(counts.get_zorder() + 1)  # the curves over the histogram
    ax.patch.set_visible(False)
    drawn = []
    for i, (run, layers) in enumerate(runs.items()):
        groups = [layer["frequency"] for layer in layers]
        ranks = [(a + b) / 2 for a, b in zip(groups[0]["rank_low"], groups[0]["rank_high"])]
        ys = [sum(g["mean_active"][j] for g in groups) / len(groups) for j in range(len(ranks))]
        style = dict(_style(i, len(runs)), linestyle="-")  # solid: dashed is the uniform expectation
        ax.plot([x + _offset(i, len(runs)) for x in ranks], ys, label=run, **style)
        uniform = sum(layer["cardinality_mean"] for layer in layers) / len(layers)
        ax.axhline(uniform, color=style["color"], linestyle="--", linewidth=1.0, label=f"_uniform expectation {run}")
        drawn += ys + [uniform]
    _headroom(ax, drawn)
    ax.set_xlabel("tokens by increasing frequency (rank)")
    ax.set_ylabel("mean active experts")
    ax.set_title("solid: per token; dashed: uniform expectation;\nshaded: token frequency", fontsize="small")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_load(summaries: Mapping[str, Sequence[dict]], path) -> Path:
    """Load imbalance per layer: the coefficient of variation of the expert load, and MaxVio."""
    runs = _check(summaries, ["load_cv", "max_vio"])
    fig, axes = _figure(2, "Expert load balance (0 = perfectly balanced)", len(runs))
    _headroom(
        axes[0],
        _per_layer(axes[0], runs, lambda layer: layer["load_cv"], "std / mean of the load", "Coefficient of variation"),
    )
    _headroom(axes[1], _per_layer(axes[1], runs, lambda layer: layer["max_vio"], "(max − mean) / mean load", "MaxVio"))
    return _save(fig, path)


def plot_all(summaries: Mapping[str, Sequence[dict]], folder) -> list[Path]:
    """Every figure above into ``folder`` (coverage.png, concentration.png, cardinality.png, load.png,
    and frequency.png when every layer summary has token frequencies); the paths written."""
    runs = _check(summaries, [])
    folder = Path(folder)
    paths = [
        plot_coverage(runs, folder / "coverage.png"),
        plot_concentration(runs, folder / "concentration.png"),
        plot_cardinality(runs, folder / "cardinality.png"),
        plot_load(runs, folder / "load.png"),
    ]
    if all("frequency" in layer for layers in runs.values() for layer in layers):
        paths.append(plot_frequency(runs, folder / "frequency.png"))
    return paths
