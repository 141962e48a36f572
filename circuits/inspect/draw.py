"""Pictures of a compiled circuit, drawn with matplotlib (Agg backend, no graphviz needed).

- ``draw_whole``: the pruned circuit of ``Circuit.to_networkx()`` in layers (networkx
  ``multipartite_layout`` on the "level" attribute), root at the top, literals at the bottom.
  OR nodes are circles with ⊕, AND nodes smaller circles with ⊗; an AND node's edge to its
  prime is blue, to its sub orange. Readable up to a few dozen decision nodes.
- ``draw_summary``: for any size, bars of nodes, live and padded elements per level, and
  the fan-in of each level with the groups (nodes x fan-in) it was split into.
- ``draw``: picks one of the two by size (``text.is_small``) unless told.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import networkx as nx
import numpy as np

from .text import groups_text, is_small, padded_elements, title

PRIME, SUB = "tab:blue", "tab:orange"


def _ordered_layers(G: nx.DiGraph, sweeps: int = 4) -> dict[int, list]:
    """level -> nodes, ordered to reduce edge crossings (barycentre sweeps, Sugiyama style).

    Literals stay in the variable order x0, ¬x0, x1, ... (the vtree order), ⊤ last; each
    sweep sorts the other layers top-down by their parents' mean position, then bottom-up
    by their children's.
    """
    layers: dict[int, list] = {}
    for v, d in G.nodes(data=True):
        layers.setdefault(d["level"], []).append(v)
    layers[0].sort(key=lambda v: (G.nodes[v].get("var", G.number_of_nodes()), not G.nodes[v].get("positive", True)))
    x: dict = {}

    def place(level):
        for i, v in enumerate(layers[level]):
            x[v] = i - (len(layers[level]) - 1) / 2

    def reorder(level, neighbours):
        def centre(v):
            xs = [x[u] for u in neighbours(v)]
            return sum(xs) / len(xs) if xs else x[v]

        layers[level].sort(key=centre)
        place(level)

    for level in layers:
        place(level)
    order = sorted(layers)
    for _ in range(sweeps):
        for level in reversed(order[1:-1]):
            reorder(level, G.predecessors)
        for level in order[1:-1]:
            reorder(level, G.successors)
    return dict(sorted(layers.items()))


def _edge_colors(G: nx.DiGraph, edges: list) -> list[str]:
    """Blue for an AND node's first child (prime), orange for its second (sub), grey otherwise."""
    first = {a: next(iter(G.successors(a))) for a, d in G.nodes(data=True) if d["kind"] == "and"}
    out = []
    for a, b in edges:
        if a in first:
            out.append(PRIME if first[a] == b else SUB)
        else:
            out.append("0.45")
    return out


def draw_whole(circuit, path, fmt: str | None = None) -> None:
    """Draw every node and edge of the pruned circuit into ``path`` (png or svg)."""
    G = circuit.to_networkx()
    layers = _ordered_layers(G)
    pos = nx.multipartite_layout(G, subset_key=layers, align="horizontal")
    width = max(len(v) for v in layers.values())
    fig, ax = plt.subplots(figsize=(min(max(0.62 * width, 6.0), 30.0), min(0.75 * len(layers) + 1.2, 30.0)))
    # multipartite_layout rescales to [-1, 1]; keep node sizes fixed in points instead.
    edges = list(G.edges())
    nx.draw_networkx_edges(G, pos, edgelist=edges, edge_color=_edge_colors(G, edges), width=1.0, arrows=False, ax=ax)
    kinds = {
        "or": dict(node_shape="o", node_size=420, node_color="white", edgecolors="black"),
        "and": dict(node_shape="o", node_size=200, node_color="0.92", edgecolors="0.3"),
        "literal": dict(node_shape="s", node_size=520, node_color="#fff4d6", edgecolors="0.3"),
        "true": dict(node_shape="s", node_size=520, node_color="#e6f2e6", edgecolors="0.3"),
    }
    for kind, style in kinds.items():
        nodes = [v for v, d in G.nodes(data=True) if d["kind"] == kind]
        if nodes:
            nx.draw_networkx_nodes(G, pos, nodelist=nodes, ax=ax, linewidths=1.0, **style)
    labels = {v: d["label"] for v, d in G.nodes(data=True)}
    sizes = {"or": 13, "and": 9, "literal": 9, "true": 11}
    for kind, size in sizes.items():
        sub = {v: labels[v] for v, d in G.nodes(data=True) if d["kind"] == kind}
        nx.draw_networkx_labels(G, pos, labels=sub, font_size=size, ax=ax)
    ys = sorted({round(float(p[1]), 6) for p in pos.values()})
    ax.set_yticks(ys)
    # rows alternate from the bottom: literals, then per level its AND row (⊗) below its OR row (⊕)
    ax.set_yticklabels(["literals"] + ["⊗" if i % 2 else f"level {i // 2}  ⊕" for i in range(1, len(ys))])
    ax.tick_params(left=False, bottom=False, labelleft=True, labelbottom=False)
    for side in ax.spines.values():
        side.set_visible(False)
    s = circuit.sizes()
    ax.set_title(
        f"{title(circuit)}: {s['levels']} levels, {s['nodes']} OR nodes (⊕), {s['elements']} AND nodes (⊗)", fontsize=11
    )
    ax.plot([], [], color=PRIME, label="prime")
    ax.plot([], [], color=SUB, label="sub")
    ax.legend(loc="upper right", fontsize=8, frameon=False)
    ax.margins(x=0.04, y=0.08)
    _save(fig, path, fmt)


def draw_summary(circuit, path, fmt: str | None = None) -> None:
    """Per-level bars (nodes, live and padded elements) and fan-in with groups, into ``path``."""
    levels = circuit.layout.levels()
    s = circuit.sizes()
    h = np.array([lv["level"] for lv in levels])
    nodes = np.array([lv["nodes"] for lv in levels])
    elems = np.array([lv["elements"] for lv in levels])
    padded = padded_elements(levels)
    fanin = np.array([lv["max_fanin"] for lv in levels])

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    w = 0.38
    ax.bar(h - w / 2, nodes, w, color="tab:blue", label="OR nodes")
    ax.bar(h + w / 2, padded, w, color="none", edgecolor="0.4", hatch="///", linewidth=0.8, label="padded elements")
    ax.bar(h + w / 2, elems, w, color="tab:orange", label="live elements (AND)")
    for x, e, p in zip(h, elems, padded):
        ax.annotate(f"{p / max(e, 1):.2f}x", (x + w / 2, p), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(h)
    ax.set_xticklabels([f"{v}" + ("\nroot" if i == len(h) - 1 else "") for i, v in enumerate(h)])
    ax.set_xlabel("level (height above the literals)")
    ax.set_ylabel("count")
    ax.set_title("nodes and elements per level (label: padding)", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.set_ylim(0, padded.max() * 1.15)

    bx.bar(h, fanin, 0.6, color="tab:green")
    bx.set_xticks(h)
    detail = [groups_text(lv["buckets"], 3, "\n") for lv in levels]
    xlabel = "level, groups (nodes x fan-in)"
    if len(levels) * max(len(line) for d in detail for line in d.split("\n")) > 56:  # would overlap
        detail = [f"({len(lv['buckets'])})" for lv in levels]
        xlabel = "level, (number of groups)"
    bx.set_xticklabels([f"{v}\n{d}" for v, d in zip(h, detail)], fontsize=8)
    bx.set_xlabel(xlabel)
    bx.set_ylabel("max fan-in")
    bx.set_title("fan-in per level", fontsize=10)
    bx.set_ylim(0, fanin.max() * 1.15)
    for x, f in zip(h, fanin):
        bx.annotate(str(f), (x, f), ha="center", va="bottom", fontsize=8)
    sdd = circuit.info.get("sdd_size")
    sdd_text = f"; SDD size {sdd:,} ({circuit.info.get('sdd_count', 0):,} decision nodes)" if sdd else ""
    fig.suptitle(
        f"{title(circuit)}: {s['levels']} levels, {s['nodes']:,} nodes, {s['elements']:,} elements, "
        f"padding {s['padding']:.2f}x{sdd_text}",
        fontsize=11,
    )
    fig.tight_layout()
    _save(fig, path, fmt)


def draw(circuit, path, fmt: str | None = None, whole: bool | None = None) -> str:
    """Draw the whole circuit if it is small (or ``whole=True``), else the summary; returns which."""
    if whole is None:
        whole = is_small(circuit.layout)
    (draw_whole if whole else draw_summary)(circuit, path, fmt)
    return "whole" if whole else "summary"


def _save(fig, path, fmt: str | None) -> None:
    fmt = fmt or Path(path).suffix.lstrip(".").lower() or "png"
    try:
        fig.savefig(path, format=fmt, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
