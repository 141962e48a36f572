"""Text views of a compiled circuit: the per-level table, the node listing, and DOT.

Names follow ``Circuit.to_networkx``: decision nodes are ``or<slot>``, literals ``x<i>`` /
``¬x<i>`` with i the 0-based logit column, ``⊤`` is TRUE. The last level is always the
synthetic root (one node, one element (SDD root, ⊤)), see ``circuits.layout``.
"""

from __future__ import annotations

import numpy as np

from ..layout import FALSE_SLOT, TRUE_SLOT, Layout

SMALL_N, SMALL_NODES = 8, 60


def is_small(layout: Layout) -> bool:
    """Small enough to list (and draw) node by node: n <= 8 or at most 60 decision nodes."""
    return layout.n <= SMALL_N or int(layout.groups[:, 1].sum()) <= SMALL_NODES


def title(circuit) -> str:
    """The spec's description, or the one stored in a cache manifest."""
    if circuit.spec is not None:
        return circuit.spec.describe()
    return circuit.info.get("describe", f"circuit over {circuit.n} variables")


def slot_name(layout: Layout, slot: int) -> str:
    """``⊥``, ``⊤``, ``x<i>``, ``¬x<i>`` or ``or<slot>`` for a slot of the layout."""
    n = layout.n
    if slot == FALSE_SLOT:
        return "⊥"
    if slot == TRUE_SLOT:
        return "⊤"
    if slot < 2 + n:
        return f"x{slot - 2}"
    if slot < 2 + 2 * n:
        return f"¬x{slot - 2 - n}"
    return f"or{slot}"


def summary_line(circuit) -> str:
    """One line: spec, levels, nodes, live and padded elements, padding, smoothness."""
    s = circuit.sizes()
    smooth = "smooth" if s["implicit_pairs"] == 0 else f"not smooth ({s['implicit_pairs']:,} implicit variables)"
    return (
        f"{title(circuit)}: {s['variables']:,} variables, {s['levels']} levels ({s['groups']} groups), "
        f"{s['nodes']:,} nodes, {s['elements']:,} elements, {s['padded_elements']:,} padded "
        f"(padding {s['padding']:.2f}x), {smooth}"
    )


def groups_text(buckets: list[list[int]], limit: int = 4, sep: str = " + ") -> str:
    """``"28x9 + 8x2"``: a level's groups as nodes x fan-in, the first ``limit`` then a count."""
    if len(buckets) <= limit + 1:  # "1 more" would be no shorter than the group itself
        limit = len(buckets)
    shown = [f"{a}x{b}" for a, b in buckets[:limit]]
    if len(buckets) > limit:
        shown.append(f"{len(buckets) - limit} more")
    return sep.join(shown)


def level_table(levels: list[dict]) -> str:
    """One row per level of ``Layout.levels()``: nodes, elements, fan-in, groups, padding.

    Each row names at most four of the level's groups (the widest first), then how many more.
    """
    head = ("level", "nodes", "elements", "max fan-in", "groups (nodes x fan-in)", "padded", "padding")
    rows = []
    for i, (lv, padded) in enumerate(zip(levels, padded_elements(levels).tolist())):
        groups = groups_text(lv["buckets"])
        note = "(root)" if i == len(levels) - 1 else ""
        rows.append(
            (
                str(lv["level"]),
                f"{lv['nodes']:,}",
                f"{lv['elements']:,}",
                str(lv["max_fanin"]),
                groups,
                f"{padded:,}",
                f"{lv['padding']:.2f}x",
                note,
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)] + [0]
    left = {4, 7}  # groups and the root note read better left-aligned

    def fmt(row):
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(cells).rstrip()

    return "\n".join([fmt((*head, "")), *(fmt(r) for r in rows)])


def node_listing(layout: Layout) -> str:
    """Every decision node with its elements as ``(prime, sub)``, level by level.

    Padding elements are skipped; variables an element leaves implicit are shown as ``free``.
    """
    free: dict[int, list[int]] = {}
    for row, var in layout.implicit.tolist():
        free.setdefault(row, []).append(var)
    out, last_height = [], None
    for start, nodes, fanin, off, height in layout.groups.tolist():
        if height != last_height:
            out.append(f"level {height}")
            last_height = height
        for j in range(nodes):
            elems = []
            for row in range(off + j * fanin, off + (j + 1) * fanin):
                p, s = layout.children[row].tolist()
                if p == FALSE_SLOT:
                    continue
                text = f"({slot_name(layout, p)}, {slot_name(layout, s)})"
                if row in free:
                    text += " [free " + " ".join(f"x{v}" for v in sorted(free[row])) + "]"
                elems.append(text)
            out.append(f"  {slot_name(layout, start + j)}: " + "  ".join(elems))
    return "\n".join(out)


def render_text(circuit, nodes: bool | None = None) -> str:
    """The default ``probmoe-inspect`` view: summary, level table, and each node's elements.

    nodes: list the nodes; None lists them for small circuits only (``is_small``).
    """
    layout = circuit.layout
    parts = [summary_line(circuit), "", level_table(layout.levels())]
    if nodes or (nodes is None and is_small(layout)):
        parts += ["", "nodes: name: (prime, sub) per element; x<i> is logit column i, ⊤ is TRUE", node_listing(layout)]
    return "\n".join(parts) + "\n"


def _quote(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(circuit) -> str:
    """The pruned circuit of ``circuit.to_networkx()`` as Graphviz DOT, one rank per level.

    OR nodes are circles labelled ⊕, AND nodes small circles labelled ⊗, leaves boxes.
    """
    G = circuit.to_networkx()
    style = {
        "or": 'shape=circle, label="⊕"',
        "and": 'shape=circle, width=0.3, fixedsize=true, label="⊗"',
        "literal": "shape=box",
        "true": 'shape=box, label="⊤"',
    }
    lines = [
        "digraph circuit {",
        f"  label={_quote(title(circuit))}; labelloc=t; rankdir=TB;",
        '  node [fontname="DejaVu Sans"];',
    ]
    for v, d in G.nodes(data=True):
        label = "" if "label=" in style[d["kind"]] else f", label={_quote(d['label'])}"
        lines.append(f'  "{v}" [{style[d["kind"]]}{label}];')
    ranks: dict[int, list[str]] = {}
    for v, d in G.nodes(data=True):
        ranks.setdefault(d["level"], []).append(v)
    for level in sorted(ranks, reverse=True):
        lines.append("  { rank=same; " + " ".join(f'"{v}";' for v in ranks[level]) + " }")
    lines += [f'  "{a}" -> "{b}";' for a, b in G.edges()]
    lines.append("}")
    return "\n".join(lines) + "\n"


def padded_elements(levels: list[dict]) -> np.ndarray:
    """Padded element count per level of ``Layout.levels()`` (nodes x fan-in summed over groups)."""
    return np.array([sum(a * b for a, b in lv["buckets"]) for lv in levels], dtype=np.int64)
