"""A circuit as a DAG of OR-of-pairs nodes, flattened into the level ``Layout`` every evaluator takes.

The compilers that do not go through pysdd (the count trees of ``circuits.count_tree``, the
d-DNNFs of ``circuits.nnf``) add their nodes here one at a time: a node is an OR over elements
(a, b) whose value is val[a] + val[b] (an AND of two children), exactly the decision nodes of a
pruned SDD. ``Dag.layout(root)`` then places them the way ``circuits.layout.build_layout`` places an
SDD's: by height (1 + the highest child's), a group per fan-in bucket (``MAX_PADDING``), nodes in
the order they were added within a height, and the synthetic root group last.

References (``Ref``) are slots of the layout's leaf rows for FALSE, TRUE and the literals
(``FALSE_SLOT``, ``TRUE_SLOT``, ``2 + i`` for x_i, ``2 + n + i`` for its negation) and
``2 + 2n + j`` for the j-th node added.

Smoothness: every node has a scope (a set of variables, a Python int used as a bitset). An
element whose children do not mention all of its node's scope records the missing variables as
``implicit`` pairs, the layout's way of smoothing (see ``circuits.layout``); the synthetic root's
element records the variables the root does not mention.
"""

from __future__ import annotations

import numpy as np

from .layout import _buckets, FALSE_SLOT, TRUE_SLOT, Layout

Ref = int


def bits(vars_: list[int] | range) -> int:
    """The bitset (a Python int) of 0-based variables."""
    out = 0
    for v in vars_:
        out |= 1 << v
    return out


def _members(mask: int) -> list[int]:
    """The 0-based variables of a bitset, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class Dag:
    """Nodes added bottom-up (children before parents); see the module docstring."""

    def __init__(self, n: int):
        self.n = n
        self.leaves = 2 + 2 * n
        self.elems: list[list[tuple[Ref, Ref]]] = []  # per node: its elements (a, b)
        self.height: list[int] = []
        self.scope: list[int] = []  # per node: its variables (bitset)
        self.implicit: list[list[tuple[int, int]]] = []  # per node: (element index, variable)

    def literal(self, var: int, positive: bool = True) -> Ref:
        """The leaf slot of x_var (0-based) or its negation."""
        return 2 + var if positive else 2 + self.n + var

    def scope_of(self, ref: Ref) -> int:
        if ref < 2:
            return 0
        if ref < self.leaves:
            return 1 << ((ref - 2) % self.n)
        return self.scope[ref - self.leaves]

    def height_of(self, ref: Ref) -> int:
        return 0 if ref < self.leaves else self.height[ref - self.leaves]

    def add(self, elems: list[tuple[Ref, Ref]], scope: int | None = None, *,
            implicit: list[tuple[int, int]] | None = None, height: int | None = None) -> Ref:
        """A new node OR over ``elems`` (AND of each pair). ``scope`` defaults to the union of the
        children's (a smooth node); a wider scope records the missing variables as implicit
        (element index, variable) pairs. A compiler that knows them passes ``implicit`` (and the
        ``height``, 1 + the highest child's), which skips the per-element work; its nodes may then
        have no scope (None), and ``layout`` is told the root's."""
        if not elems:
            raise ValueError("a node needs at least one element")
        if implicit is None:
            under = [self.scope_of(a) | self.scope_of(b) for a, b in elems]
            if scope is None:
                scope = 0
                for s in under:
                    scope |= s
            implicit = [(e, v) for e, s in enumerate(under) if s != scope for v in _members(scope & ~s)]
        if height is None:
            height = 1 + max(max(self.height_of(a), self.height_of(b)) for a, b in elems)
        self.elems.append(elems)
        self.height.append(height)
        self.scope.append(scope)
        self.implicit.append(implicit)
        return self.leaves + len(self.elems) - 1

    def __len__(self) -> int:
        return len(self.elems)

    def layout(self, root: Ref, root_scope: int | None = None) -> Layout:
        """The Layout of the circuit under ``root`` (nodes not reachable from it are left out);
        raises ValueError for a FALSE root. ``root_scope``: the root's variables, for a compiler
        that added its nodes without scopes (given ``implicit``)."""
        if root == FALSE_SLOT:
            raise ValueError("the constraint is unsatisfiable: its circuit is FALSE")
        n, base = self.n, self.leaves
        live = [False] * len(self.elems)
        if root >= base:
            live[root - base] = True
        for j in range(len(self.elems) - 1, -1, -1):  # parents come after their children
            if live[j]:
                for a, b in self.elems[j]:
                    for c in (a, b):
                        if c >= base:
                            live[c - base] = True
        by_height: dict[int, list[int]] = {}
        for j, h in enumerate(self.height):
            if live[j]:
                by_height.setdefault(h, []).append(j)
        order: list[list[int]] = []  # groups: node indices in slot order
        heights: list[int] = []
        for h in sorted(by_height):
            ids = by_height[h]
            for bucket in _buckets([len(self.elems[j]) for j in ids]):
                order.append([ids[b] for b in bucket])
                heights.append(h)
        slot_of = np.arange(base + len(self.elems), dtype=np.int64)  # ref -> slot (leaves map to themselves)
        nxt = base
        for members in order:
            slot_of[[base + j for j in members]] = np.arange(nxt, nxt + len(members))
            nxt += len(members)
        groups, blocks, implicit, row = [], [], [], 0
        start = base
        for members, h in zip(order, heights):
            lengths = np.array([len(self.elems[j]) for j in members], dtype=np.int64)
            fanin, total = int(lengths.max()), int(lengths.sum())
            block = np.empty((len(members) * fanin, 2), dtype=np.int64)
            block[:, 0], block[:, 1] = FALSE_SLOT, TRUE_SLOT
            starts = np.cumsum(lengths) - lengths  # each member's first element in the flat list
            within = np.arange(total) - np.repeat(starts, lengths)  # [total] element index in its node
            rows = np.repeat(np.arange(len(members)) * fanin, lengths) + within
            block[rows] = np.array([e for j in members for e in self.elems[j]], dtype=np.int64).reshape(-1, 2)
            for i, j in enumerate(members):
                if self.implicit[j]:
                    implicit.extend((row + i * fanin + k, v) for k, v in self.implicit[j])
            groups.append((start, len(members), fanin, row, h))
            blocks.append(block)
            start += len(members)
            row += len(members) * fanin
        missing = ((1 << n) - 1) & ~(self.scope_of(root) if root_scope is None else root_scope)
        groups.append((start, 1, 1, row, max(heights, default=0) + 1))
        blocks.append(np.array([[root, TRUE_SLOT]], dtype=np.int64))
        implicit.extend((row, v) for v in _members(missing))
        children = slot_of[np.concatenate(blocks)]
        layout = Layout(
            n=n,
            groups=np.asarray(groups, dtype=np.int64).reshape(-1, 5),
            children=children.reshape(-1, 2),
            implicit=np.asarray(implicit, dtype=np.int64).reshape(-1, 2),
        )
        layout.validate()
        return layout
