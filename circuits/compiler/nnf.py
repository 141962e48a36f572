"""d-DNNF circuits in d4's NNF text format (parsed by ``circuits.compiler.nnf_parse``): flattening into a
``Layout``, and an independent log-partition. Both work a level of the NNF at a time in numpy
(level: the longest path down to a leaf), over all of the level's nodes at once.

d4 emits a decision-DNNF: an OR's edges carry complementary decision literals (deterministic),
an AND's children share no variable (decomposable).

``to_layout`` maps it onto the layout's OR-of-pairs nodes (``circuits.compiler.dag``). An edge's literals
are first multiplied into one factor (the edge's literal product: the literal itself, or a tree of
single-element nodes); then an OR node keeps one element per edge that is not FALSE, (literal
product, child), and an AND node's factors (its edges' literal products and children) are
multiplied into two, its element. A list of more than two factors is multiplied two at a time,
lowest first: every round pairs, in each list, the factors of its lowest height (or the lowest
two, if one is alone there), until two are left. Products are memoised (one shared by two parents
is built once); TRUE factors drop out, a FALSE one makes its list FALSE, repeated ones count once.
The OR's variables an element does not mention become implicit pairs (the layout's smoothing), and
so do the variables the root does not mention (free variables).

``log_partition`` evaluates the parsed circuit directly (float64): with the normalised leaves
log sigmoid(r), log sigmoid(-r) a missing variable contributes log 1, so no smoothing is needed;
it shares nothing with the layout and checks it (``circuits.compiler.compile``, ``circuits.compiler.cache``).
"""

from __future__ import annotations

import numpy as np

from ..layout import FALSE_SLOT, TRUE_SLOT, Layout
from . import self_check
from .dag import place, ranges
from .nnf_parse import AND, FALSE, OR, TRUE, Nnf, parse  # noqa: F401 (parse: the module's reader)

_KEY = 1 << 31  # products are memoised on lo * _KEY + hi (refs below 2^31)


class _Nodes:
    """Layout nodes made in batches: heights and scopes (bitsets, uint64 words) per ref (leaves
    first), elements per node in the order made, and the memo of products."""

    def __init__(self, n: int):
        self.n, self.base = n, 2 + 2 * n
        self.height = np.zeros(self.base, dtype=np.int64)
        self.scope = np.zeros((self.base, max(1, -(-n // 64))), dtype=np.uint64)
        v = np.arange(n)
        for row in (2 + v, 2 + n + v):
            self.scope[row, v // 64] = np.left_shift(np.uint64(1), (v % 64).astype(np.uint64))
        self.count = 0
        self.elems: list[np.ndarray] = []  # [m, 2] per batch
        self.lengths: list[np.ndarray] = []  # elements per node, per batch
        self.smooth: list[np.ndarray] = []  # per batch: whether its elements may need implicit pairs
        self.memo_keys = np.zeros(0, dtype=np.int64)  # products: lo * _KEY + hi, sorted
        self.memo_refs = np.zeros(0, dtype=np.int64)

    def _grow(self, nodes: int) -> None:
        """Room for ``nodes`` more (doubling)."""
        need = self.base + self.count + nodes
        if need >= _KEY:
            raise ValueError(f"the d-DNNF needs more than {_KEY:,} layout slots")
        if need > self.height.size:
            size = max(need, 2 * self.height.size)
            self.scope = np.concatenate(
                [self.scope, np.zeros((size - self.scope.shape[0], self.scope.shape[1]), dtype=np.uint64)]
            )
            self.height = np.concatenate([self.height, np.zeros(size - self.height.size, dtype=np.int64)])

    def add(self, lengths: np.ndarray, elems: np.ndarray, smooth: bool) -> np.ndarray:
        """New nodes, node i the OR of the next lengths[i] rows of elems [m, 2]: their refs."""
        nodes = lengths.size
        self._grow(nodes)
        refs = self.base + self.count + np.arange(nodes)
        starts = np.cumsum(lengths) - lengths
        under = self.scope[elems[:, 0]] | self.scope[elems[:, 1]]
        self.scope[refs] = np.bitwise_or.reduceat(under, starts, axis=0)
        higher = np.maximum(self.height[elems[:, 0]], self.height[elems[:, 1]])
        self.height[refs] = 1 + np.maximum.reduceat(higher, starts)
        self.count += nodes
        self.elems.append(elems)
        self.lengths.append(lengths)
        self.smooth.append(np.full(elems.shape[0], smooth))
        return refs

    def product(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The single-element nodes a AND b (a != b), each built once: their refs."""
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        keys, inverse = np.unique(lo * _KEY + hi, return_inverse=True)
        at = np.minimum(np.searchsorted(self.memo_keys, keys), max(self.memo_keys.size - 1, 0))
        hit = (self.memo_keys[at] == keys) if self.memo_keys.size else np.zeros(keys.size, dtype=bool)
        out = np.empty(keys.size, dtype=np.int64)
        out[hit] = self.memo_refs[at[hit]]
        new = keys[~hit]
        if new.size:
            pairs = np.stack([new // _KEY, new % _KEY], axis=1)
            out[~hit] = self.add(np.ones(new.size, dtype=np.int64), pairs, smooth=False)
            where = np.searchsorted(self.memo_keys, new)
            self.memo_keys = np.insert(self.memo_keys, where, new)
            self.memo_refs = np.insert(self.memo_refs, where, out[~hit])
        return out[inverse]

    def reduce(self, owner: np.ndarray, refs: np.ndarray, lists: int) -> np.ndarray:
        """Each list's factors (``refs`` of list ``owner``, [F]) multiplied down to two: [lists, 2]
        refs, lowest first, TRUE-padded; FALSE_SLOT in both for a FALSE list."""
        false = np.zeros(lists, dtype=bool)
        false[owner[refs == FALSE_SLOT]] = True
        keep = (refs != TRUE_SLOT) & ~false[owner]
        owner, refs = owner[keep], refs[keep]
        out = np.full((lists, 2), TRUE_SLOT, dtype=np.int64)
        while owner.size:
            o = np.lexsort((refs, self.height[refs], owner))
            owner, refs = owner[o], refs[o]
            dup = np.concatenate(([False], (owner[1:] == owner[:-1]) & (refs[1:] == refs[:-1])))
            owner, refs = owner[~dup], refs[~dup]
            count = np.bincount(owner, minlength=lists)
            first = np.cumsum(count) - count
            rank = np.arange(owner.size) - first[owner]
            done = count[owner] <= 2
            out[owner[done], rank[done]] = refs[done]
            owner, refs, rank = owner[~done], refs[~done], rank[~done]
            if not owner.size:
                break
            h = self.height[refs]
            starts = np.flatnonzero(rank == 0)
            lowest = np.repeat(h[starts], np.diff(np.append(starts, owner.size)))
            m = np.bincount(owner[h == lowest], minlength=lists)
            pairs = np.minimum(np.where(m >= 2, m // 2, 1), count - 2)
            take = rank < 2 * pairs[owner]
            left, right = np.flatnonzero(take & (rank % 2 == 0)), np.flatnonzero(take & (rank % 2 == 1))
            made = self.product(refs[left], refs[right])
            owner = np.concatenate([owner[~take], owner[left]])
            refs = np.concatenate([refs[~take], made])
        out[false] = FALSE_SLOT
        return out

    def layout(self, root: int) -> Layout:
        """The Layout under ``root``: the implicit pairs of the OR nodes' elements (the variables of
        the node an element does not mention) and of the root, then ``dag.place``."""
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, dtype=np.int64)
        elems = np.concatenate(self.elems) if self.elems else np.zeros((0, 2), dtype=np.int64)
        ptr = np.concatenate(([0], np.cumsum(lengths)))
        node = self.base + np.repeat(np.arange(lengths.size), lengths)
        rows = np.flatnonzero(np.concatenate(self.smooth)) if self.smooth else np.zeros(0, dtype=np.int64)
        lack = self.scope[node[rows]] & ~(self.scope[elems[rows, 0]] | self.scope[elems[rows, 1]])
        implicit = np.argwhere(_bits(lack, self.n))  # (row among rows, variable), row-major
        implicit[:, 0] = rows[implicit[:, 0]]
        missing = np.flatnonzero(_bits(~self.scope[root][None], self.n)[0])
        return place(self.n, ptr, elems, self.height[self.base : self.base + self.count], implicit, root, missing)


def _bits(words: np.ndarray, n: int) -> np.ndarray:
    """The bitsets [m, W] (uint64) as bool [m, n]."""
    return np.unpackbits(words.astype("<u8").view(np.uint8), axis=1, bitorder="little")[:, :n].astype(bool)


def _by_level(nnf: Nnf) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The reachable nodes level by level, the edges of each level's nodes (node by node, in file
    order), and where each level's edges start in that list (with the end): ([nodes per level],
    edge order [E'], bounds [levels + 1])."""
    nodes = np.flatnonzero(nnf.level >= 0)
    nodes = nodes[np.argsort(nnf.level[nodes], kind="stable")]
    cuts = np.flatnonzero(np.diff(nnf.level[nodes])) + 1
    levels = np.split(nodes, cuts)
    edges = ranges(nnf.edge_ptr[nodes], nnf.edge_ptr[nodes + 1])
    per_node = np.diff(nnf.edge_ptr)[nodes]
    bounds = np.concatenate(
        (
            [0],
            np.cumsum(
                [per_node[a:b].sum() for a, b in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [nodes.size])))]
            ),
        )
    )
    return levels, edges, bounds.astype(np.int64)


def _lit_slots(nnf: Nnf) -> np.ndarray:
    """The layout's leaf slot of each literal: [L]."""
    v = np.abs(nnf.lits) - 1
    return np.where(nnf.lits > 0, 2 + v, 2 + nnf.n + v)


def to_layout(nnf: Nnf) -> Layout:
    """The level layout of the circuit (see the module docstring); ValueError if it is FALSE."""
    edges_n = nnf.child.size
    nodes = _Nodes(nnf.n)
    edge_lits = np.diff(nnf.lit_ptr)
    lit_owner = np.repeat(np.arange(edges_n), edge_lits)
    lit_product = nodes.reduce(lit_owner, _lit_slots(nnf), edges_n)  # [E, 2]
    several = lit_product[:, 1] != TRUE_SLOT
    lit_ref = lit_product[:, 0].copy()
    lit_ref[several] = nodes.product(lit_product[several, 0], lit_product[several, 1])
    ref = np.full(len(nnf.kind), FALSE_SLOT, dtype=np.int64)
    parent = nnf.edge_parent
    levels, order, bounds = _by_level(nnf)
    for depth, level in enumerate(levels):
        kind = nnf.kind[level]
        ref[level[kind == TRUE]] = TRUE_SLOT
        e = order[bounds[depth] : bounds[depth + 1]]
        if e.size == 0:
            ref[level[(kind == AND)]] = TRUE_SLOT  # an AND without edges; an OR without edges is FALSE
            continue
        owner = parent[e]
        is_or = nnf.kind[owner] == OR
        pair = np.stack([lit_ref[e], ref[nnf.child[e]]], axis=1)
        ors = level[kind == OR]
        # OR nodes: an element per edge whose child is not FALSE
        _oe, opair, oowner = e[is_or], pair[is_or], owner[is_or]
        live = opair[:, 1] != FALSE_SLOT
        oowner, opair = oowner[live], opair[live]
        a, b = opair[:, 0], opair[:, 1]
        a_true, b_true = a == TRUE_SLOT, b == TRUE_SLOT
        lo_first = (nodes.height[a] < nodes.height[b]) | ((nodes.height[a] == nodes.height[b]) & (a <= b))
        first = np.where(a_true, b, np.where(b_true | (a == b), a, np.where(lo_first, a, b)))
        second = np.where(a_true | b_true | (a == b), TRUE_SLOT, np.where(lo_first, b, a))
        counts = np.bincount(oowner, minlength=len(nnf.kind))[ors]
        if np.any(counts):
            made = nodes.add(counts[counts > 0], np.stack([first, second], axis=1), smooth=True)
            ref[ors[counts > 0]] = made
        # AND nodes: their factors multiplied down to one element
        ands = level[kind == AND]
        if ands.size:
            index = np.full(len(nnf.kind), -1, dtype=np.int64)
            index[ands] = np.arange(ands.size)
            aowner = index[owner[~is_or]]
            two = nodes.reduce(np.repeat(aowner, 2), pair[~is_or].ravel(), ands.size)
            single = (two[:, 1] == TRUE_SLOT) | (two[:, 0] == FALSE_SLOT)  # one factor, or FALSE
            out = two[:, 0].copy()
            if np.any(~single):
                out[~single] = nodes.product(two[~single, 0], two[~single, 1])
            ref[ands] = out
    return nodes.layout(int(ref[0]))


def log_partition(nnf: Nnf, r) -> np.ndarray:
    """log Z of the circuit at logits r [T, n] with leaves log sigmoid(+-r): [T] (float64), a level
    of nodes at a time: an edge's value is its child's plus its literals' weights, an AND's the sum
    of its edges', an OR's their logsumexp."""
    r = self_check.as_logits(r)
    weight = np.concatenate([self_check.log_sigmoid(r).T, self_check.log_sigmoid(-r).T])  # [2n, T]
    v = np.abs(nnf.lits) - 1
    lit_w = weight[np.where(nnf.lits > 0, v, nnf.n + v)]  # [L, T]
    edge_w = np.zeros((nnf.child.size, r.shape[0]))
    has = np.flatnonzero(np.diff(nnf.lit_ptr) > 0)
    if has.size:
        edge_w[has] = np.add.reduceat(lit_w, nnf.lit_ptr[has], axis=0)
    val = np.zeros((len(nnf.kind), r.shape[0]))
    parent = nnf.edge_parent
    levels, order, bounds = _by_level(nnf)
    with np.errstate(invalid="ignore", divide="ignore"):
        for depth, level in enumerate(levels):
            kind = nnf.kind[level]
            val[level[(kind == FALSE) | ((kind == OR) & (np.diff(nnf.edge_ptr)[level] == 0))]] = -np.inf
            e = order[bounds[depth] : bounds[depth + 1]]
            if e.size == 0:
                continue
            ev = val[nnf.child[e]] + edge_w[e]  # [e, T]
            owner = parent[e]
            starts = np.flatnonzero(np.concatenate(([True], owner[1:] != owner[:-1])))
            heads = owner[starts]
            top = np.maximum.reduceat(ev, starts, axis=0)
            safe = np.where(np.isfinite(top), top, 0.0)
            spread = np.repeat(safe, np.diff(np.append(starts, e.size)), axis=0)  # [e, T] its node's max
            lse = safe + np.log(np.add.reduceat(np.exp(ev - spread), starts, axis=0))
            lse[top == -np.inf] = -np.inf
            val[heads] = np.where((nnf.kind[heads] == AND)[:, None], np.add.reduceat(ev, starts, axis=0), lse)
    return val[0].copy()
