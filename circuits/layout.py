"""The level layout: a pruned SDD flattened into groups of same-height nodes.

Slots (rows of the evaluator's value buffer, tokens along the other axis):

    0           FALSE  (log 0)
    1           TRUE   (log 1)
    2 + i       literal  x_i      (i = 0..n-1)
    2 + n + i   literal ¬x_i
    ...         decision nodes, one contiguous range per group, groups in height order
    S - 1       the root: a synthetic group of one node with the single element (sdd root, TRUE)

Each group holds ``nodes`` decision nodes of the same height, each with ``fanin`` elements
(prime slot, sub slot); shorter nodes are padded with (FALSE, TRUE), which has value log 0.
Elements whose sub is FALSE are pruned. A level whose padding would pass MAX_PADDING (1.1x) is split into
fan-in buckets. Every child slot of a group lies below the group's first slot.

SDDs are not smooth: a variable of an element's vtree that neither its prime nor its sub
mentions is "implicit" there. ``implicit`` lists these (element row, variable) pairs. With the
normalised leaves log sigma(r), log sigma(-r) an implicit variable contributes exactly 1 to
every sum, so log-partition, marginals and sampling need no smoothing; MAP adds
log max(p, 1-p) per implicit variable (see ``circuits.kernels.torch_passes``; the fp32 tilt there
moves the leaves and gives each implicit variable a term of its own, 0 when untilted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pysdd.sdd import SddManager, SddNode

FALSE_SLOT, TRUE_SLOT = 0, 1
MAX_PADDING = 1.1


@dataclass(frozen=True)
class Layout:
    """Flat arrays describing a circuit; see the module docstring for the slot convention.

    Attributes:
        n: number of variables.
        groups: int64 [G, 5], per group (first slot, nodes, fanin, first child row, height).
        children: int64 [R, 2], (prime slot, sub slot) per element row, R = sum nodes*fanin.
        implicit: int64 [P, 2], (element row, variable) pairs; empty for smooth circuits.
    """

    n: int
    groups: np.ndarray
    children: np.ndarray
    implicit: np.ndarray

    @property
    def num_slots(self) -> int:
        last = self.groups[-1]
        return int(last[0] + last[1])

    @property
    def root_slot(self) -> int:
        return self.num_slots - 1

    @property
    def smooth(self) -> bool:
        return len(self.implicit) == 0

    def sizes(self) -> dict:
        """Counts a user wants to see: levels, nodes, live elements, padded elements, padding."""
        real = int(np.count_nonzero(self.children[:, 0] != FALSE_SLOT))
        padded = len(self.children)
        return {
            "variables": self.n,
            "levels": int(self.groups[:, 4].max()),
            "groups": len(self.groups),
            "nodes": int(self.groups[:, 1].sum()),
            "elements": real,
            "padded_elements": padded,
            "padding": round(padded / max(real, 1), 4),
            "implicit_pairs": len(self.implicit),
            "slots": self.num_slots,
        }

    def levels(self) -> list[dict]:
        """One row per height: nodes, elements, max fan-in and the groups it was split into."""
        rows = []
        for h in range(1, int(self.groups[:, 4].max()) + 1):
            sel = self.groups[self.groups[:, 4] == h]
            real = 0
            for _s, nodes, fanin, off, _ in sel:
                block = self.children[off : off + nodes * fanin, 0]
                real += int(np.count_nonzero(block != FALSE_SLOT))
            rows.append(
                {
                    "level": h,
                    "nodes": int(sel[:, 1].sum()),
                    "elements": real,
                    "max_fanin": int(sel[:, 2].max()),
                    "buckets": [[int(a), int(b)] for a, b in sel[:, 1:3]],
                    "padding": round(float((sel[:, 1] * sel[:, 2]).sum()) / max(real, 1), 4),
                }
            )
        return rows

    def model_count(self) -> int:
        """Exact model count over all n variables, in Python integers (no 64-bit overflow).

        Each element counts count(prime) * count(sub) * 2^(its implicit variables); numpy object
        arrays keep the arithmetic in Python integers while looping in C.
        """
        count = np.zeros(self.num_slots, dtype=object)
        count[TRUE_SLOT : 2 + 2 * self.n] = 1
        extra = np.zeros(len(self.children), dtype=np.int64)
        np.add.at(extra, self.implicit[:, 0], 1)
        scale = np.array([1 << int(e) for e in extra], dtype=object) if len(self.implicit) else None
        for s, nodes, fanin, off, _ in self.groups:
            rows = slice(off, off + nodes * fanin)
            prod = count[self.children[rows, 0]] * count[self.children[rows, 1]]
            if scale is not None:
                prod = prod * scale[rows]
            count[s : s + nodes] = prod.reshape(nodes, fanin).sum(axis=1)
        return int(count[self.root_slot])

    def validate(self) -> None:
        """Structural checks: shapes, index ranges, children below their parents. Raises ValueError."""
        g, c, imp = self.groups, self.children, self.implicit
        if g.ndim != 2 or g.shape[1] != 5 or len(g) == 0 or c.ndim != 2 or c.shape[1] != 2:
            raise ValueError("layout arrays have the wrong shape")
        if imp.ndim != 2 or imp.shape[1] != 2:
            raise ValueError("layout implicit array has the wrong shape")
        slot, row = 2 + 2 * self.n, 0
        for s, nodes, fanin, off, height in g:
            if s != slot or off != row or nodes < 1 or fanin < 1 or height < 1:
                raise ValueError("layout groups are not contiguous")
            block = c[off : off + nodes * fanin]
            if len(block) != nodes * fanin or block.min() < 0 or block.max() >= s:
                raise ValueError("layout children point outside the slots below their group")
            slot, row = s + nodes, off + nodes * fanin
        if row != len(c) or g[-1][1] != 1:
            raise ValueError("layout does not end in a single root")
        if len(imp) and (imp.min() < 0 or imp[:, 0].max() >= len(c) or imp[:, 1].max() >= self.n):
            raise ValueError("layout implicit pairs are out of range")


def _vtree_vars(mgr: SddManager) -> dict[int, frozenset]:
    """vtree position -> the variables (1-based) below it."""
    out = {}

    def walk(v):
        if v.is_leaf():
            vs = frozenset([v.var()])
        else:
            vs = walk(v.left()) | walk(v.right())
        out[v.position()] = vs
        return vs

    walk(mgr.vtree())
    return out


def _buckets(fanins: list[int]) -> list[list[int]]:
    """Split node positions (sorted by fan-in, descending) so no bucket pads more than MAX_PADDING."""
    order = sorted(range(len(fanins)), key=lambda i: -fanins[i])
    out, cur, width, real = [], [], 0, 0
    for i in order:
        f = fanins[i]
        if cur and width * (len(cur) + 1) > MAX_PADDING * (real + f):
            out.append(cur)
            cur, real = [], 0
        if not cur:
            width = f
        cur.append(i)
        real += f
    if cur:
        out.append(cur)
    return out


def build_layout(mgr: SddManager, root: SddNode, progress: Callable[[int], None] | None = None) -> Layout:
    """Flatten the SDD under ``root`` into a Layout (prunes FALSE subs, records implicit vars).
    ``progress(1)`` after each decision node is walked."""
    if root.is_false():
        raise ValueError("the constraint is unsatisfiable: its SDD is FALSE")
    n = mgr.var_count()
    nodes = _walk(root, _vtree_vars(mgr), progress)
    groups, children, implicit = _Slots(nodes, n).place(root)
    layout = Layout(
        n=n,
        groups=np.asarray(groups, dtype=np.int64).reshape(-1, 5),
        children=np.asarray(children, dtype=np.int64).reshape(-1, 2),
        implicit=np.asarray(implicit, dtype=np.int64).reshape(-1, 2),
    )
    layout.validate()
    return layout


def _scope(node: SddNode, nodes: dict[int, dict]) -> frozenset:
    """The variables (1-based) a node of the walk (``_walk``'s ``nodes``) mentions."""
    if node.is_literal():
        return frozenset([abs(node.literal)])
    if node.is_decision():
        return nodes[node.id]["scope"]
    return frozenset()


def _walk(root: SddNode, vvars: dict[int, frozenset], progress) -> dict[int, dict]:
    """Post-order walk over the decision nodes under ``root`` (iterative: SDDs can be deep).

    Returns {node id: {"elems": [(prime, sub)] without FALSE ones, "implicit": per element the
    variables of the node's vtree that neither prime nor sub mentions, "scope": the vtree's
    variables, "height": 1 + the highest child's}}; raises for an SDD not normalised for its vtree.
    """
    nodes: dict[int, dict] = {}

    def height(node) -> int:
        return nodes[node.id]["height"] if node.is_decision() else 0

    stack = [(root, False)] if root.is_decision() else []
    while stack:
        node, expanded = stack.pop()
        if node.id in nodes:
            continue
        elems = [(p, s) for p, s in node.elements() if not s.is_false() and not p.is_false()]
        if not expanded:
            stack.append((node, True))
            stack.extend((c, False) for p, s in elems for c in (p, s) if c.is_decision() and c.id not in nodes)
            continue
        v = node.vtree()
        left, right = vvars[v.left().position()], vvars[v.right().position()]
        imp = []
        for p, s in elems:
            sp, ss = _scope(p, nodes), _scope(s, nodes)
            if not sp <= left or not ss <= right:
                raise ValueError("the SDD is not normalised for its vtree")
            imp.append(sorted((left - sp) | (right - ss)))
        nodes[node.id] = {
            "elems": elems,
            "implicit": imp,
            "scope": vvars[v.position()],
            "height": 1 + max(max(height(p), height(s)) for p, s in elems),
        }
        if progress is not None:
            progress(1)
    return nodes


class _Slots:
    """Slot assignment of the walked nodes, group by group in height order: the rows of the
    layout's ``groups``, ``children`` and ``implicit`` tables (see ``Layout``)."""

    def __init__(self, nodes: dict[int, dict], n: int):
        self.nodes, self.n = nodes, n
        self.slot_of: dict[int, int] = {}
        self.groups, self.children, self.implicit = [], [], []
        self.next_slot = 2 + 2 * n

    def child(self, node: SddNode) -> int:
        """The slot of a child: a decision node's own, or a literal's / constant's leaf slot."""
        if node.is_decision():
            return self.slot_of[node.id]
        if node.is_true():
            return TRUE_SLOT
        if node.is_false():
            return FALSE_SLOT
        lit = node.literal
        return 1 + lit if lit > 0 else 1 + self.n - lit

    def emit(self, height: int, members: list[tuple[list, list]]) -> None:
        """One group: ``members`` are (element slots [(prime, sub)], implicit variables per element),
        padded to the group's fan-in with FALSE elements."""
        fanin = max(len(e) for e, _ in members)
        self.groups.append((self.next_slot, len(members), fanin, len(self.children), height))
        for elems, imp in members:
            for j in range(fanin):
                if j < len(elems):
                    self.implicit.extend((len(self.children), var - 1) for var in imp[j])
                    self.children.append(elems[j])
                else:
                    self.children.append((FALSE_SLOT, TRUE_SLOT))
        self.next_slot += len(members)

    def place(self, root: SddNode) -> tuple[list, list, list]:
        """Every node in height order (bucketed by fan-in), then the root's group; the three tables."""
        by_height: dict[int, list[int]] = {}
        for nid, rec in self.nodes.items():
            by_height.setdefault(rec["height"], []).append(nid)
        for h in sorted(by_height):
            ids = sorted(by_height[h])
            for bucket in _buckets([len(self.nodes[i]["elems"]) for i in ids]):
                members = []
                for b in bucket:
                    rec = self.nodes[ids[b]]
                    self.slot_of[ids[b]] = self.next_slot + len(members)
                    members.append(([(self.child(p), self.child(s)) for p, s in rec["elems"]], rec["implicit"]))
                self.emit(h, members)
        root_imp = sorted(frozenset(range(1, self.n + 1)) - _scope(root, self.nodes))
        self.emit(max(by_height, default=0) + 1, [([(self.child(root), TRUE_SLOT)], [root_imp])])
        return self.groups, self.children, self.implicit
