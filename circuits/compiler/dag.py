"""A circuit as a DAG of OR-of-pairs nodes, flattened into the level ``Layout`` every evaluator takes.

The compilers that do not go through pysdd build such nodes: a node is an OR over elements (a, b)
whose value is val[a] + val[b] (an AND of two children), exactly the decision nodes of a pruned
SDD. The count trees of ``circuits.compiler.count_tree`` add them to a ``Dag`` one at a time; the d-DNNFs
of ``circuits.compiler.nnf`` make them as arrays, in batches. ``place`` (``Dag.layout`` calls it) lays them
out the way ``circuits.layout.build_layout`` places an SDD's: by height (1 + the highest child's),
a group per fan-in bucket (``MAX_PADDING``), nodes in the order they were added within a height,
and the synthetic root group last (numpy over all nodes at once, but the bucket split).

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

from ..layout import FALSE_SLOT, TRUE_SLOT, Layout, _buckets

Ref = int


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

    def add(
        self,
        elems: list[tuple[Ref, Ref]],
        scope: int | None = None,
        *,
        implicit: list[tuple[int, int]] | None = None,
        height: int | None = None,
    ) -> Ref:
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
        lengths = np.fromiter(map(len, self.elems), dtype=np.int64, count=len(self.elems))
        ptr = np.concatenate(([0], np.cumsum(lengths)))
        elems = np.array([e for node in self.elems for e in node], dtype=np.int64).reshape(-1, 2)
        implicit = np.array(
            [(ptr[j] + k, v) for j, imp in enumerate(self.implicit) if imp for k, v in imp], dtype=np.int64
        ).reshape(-1, 2)
        missing = ((1 << self.n) - 1) & ~(self.scope_of(root) if root_scope is None else root_scope)
        return place(
            self.n,
            ptr,
            elems,
            np.asarray(self.height, dtype=np.int64),
            implicit,
            root,
            np.asarray(_members(missing), dtype=np.int64),
        )


def place(
    n: int, ptr: np.ndarray, elems: np.ndarray, height: np.ndarray, implicit: np.ndarray, root: Ref, missing: np.ndarray
) -> Layout:
    """The Layout of nodes given as arrays (see the module docstring for the placement).

    ptr: int64 [K + 1], node j's elements are elems[ptr[j]:ptr[j+1]]; elems: int64 [M, 2] refs;
    height: int64 [K]; implicit: int64 [P, 2] (element index into elems, variable), each node's
    in the order it lists them; root: the root's ref; missing: int64 [V], the variables the root
    does not mention. Nodes not reachable from the root are left out; ValueError for a FALSE root."""
    if root == FALSE_SLOT:
        raise ValueError("the constraint is unsatisfiable: its circuit is FALSE")
    base, nodes = 2 + 2 * n, len(height)
    live = np.zeros(nodes, dtype=bool)
    frontier = np.array([root - base] if root >= base else [], dtype=np.int64)
    live[frontier] = True
    while frontier.size:
        kids = elems[ranges(ptr[frontier], ptr[frontier + 1])].ravel()
        kids = np.unique(kids[kids >= base]) - base
        frontier = kids[~live[kids]]
        live[frontier] = True
    ids = np.flatnonzero(live)
    ids = ids[np.argsort(height[ids], kind="stable")]  # by height, in the order added within one
    lengths = ptr[ids + 1] - ptr[ids]
    cuts = np.flatnonzero(np.diff(height[ids])) + 1
    order, fanins = [], []
    for lo, hi in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [ids.size])).tolist()):
        for bucket in _buckets(lengths[lo:hi].tolist()):
            order.append(lo + np.asarray(bucket, dtype=np.int64))
            fanins.append(int(lengths[lo + bucket[0]]))  # a bucket's first node is its widest
    sizes = np.array([len(o) for o in order], dtype=np.int64)
    fanin = np.array(fanins, dtype=np.int64)
    member = ids[np.concatenate(order)] if order else ids  # node per slot, in slot order
    group_of = np.repeat(np.arange(len(order)), sizes)
    group_rows = np.concatenate(([0], np.cumsum(sizes * fanin)))
    position = np.arange(member.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # within its group
    node_row = group_rows[group_of] + position * fanin[group_of]
    rows = group_rows[-1]
    slot_of = np.arange(base + nodes, dtype=np.int64)  # ref -> slot (leaves map to themselves)
    slot_of[base + member] = base + np.arange(member.size)
    row_of_node = np.full(nodes, -1, dtype=np.int64)
    row_of_node[member] = node_row
    children = np.empty((rows + 1, 2), dtype=np.int64)
    children[:, 0], children[:, 1] = FALSE_SLOT, TRUE_SLOT
    node_lengths = np.diff(ptr)
    elem_node = np.repeat(np.arange(nodes), node_lengths)
    elem_row = row_of_node[elem_node] + np.arange(elems.shape[0]) - ptr[elem_node]
    kept = row_of_node[elem_node] >= 0
    children[elem_row[kept]] = elems[kept]
    children[rows] = (root, TRUE_SLOT)
    imp_row = elem_row[implicit[:, 0]]
    keep = row_of_node[elem_node[implicit[:, 0]]] >= 0
    imp = np.stack([imp_row[keep], implicit[keep, 1]], axis=1)
    imp = imp[np.argsort(row_of_node[elem_node[implicit[keep, 0]]], kind="stable")]
    group_heights = height[member[np.cumsum(sizes) - sizes]] if sizes.size else np.zeros(0, dtype=np.int64)
    starts = base + np.cumsum(sizes) - sizes
    groups = np.stack([starts, sizes, fanin, group_rows[:-1], group_heights], axis=1).reshape(-1, 5)
    top = int(group_heights.max()) + 1 if sizes.size else 1
    groups = np.concatenate([groups, [[base + member.size, 1, 1, rows, top]]]).astype(np.int64)
    implicit_all = np.concatenate([imp, np.stack([np.full(missing.size, rows), missing], axis=1)]).astype(np.int64)
    layout = Layout(n=n, groups=groups, children=slot_of[children], implicit=implicit_all.reshape(-1, 2))
    layout.validate()
    return layout


def ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The indices start..end-1 of every range, concatenated: int64 [sum(ends - starts)]."""
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(total)
