"""Counting circuits built directly from their known structure: no generic SDD apply, no pysdd.

A counting constraint's canonical SDD (compressed and trimmed, on the vtree ``circuits.compiler.compile``
uses) has one decision node per (vtree node, set of "states" of its variables): for ``ExactlyK`` /
``RangeK`` the state is the count of true variables and every node is an interval of counts
[a, b]; for the group specs (``circuits.compiler.groups``) it is (count, nonempty groups), or OVER once a
limit is passed. A node's elements follow from its set alone (Darwiche's canonical decomposition):
for each state s of the left child, the sub is the set T(s) of right states that complete s into the
node's set; left states with equal T share an element whose prime is their set. The layout keeps
only the live elements (T nonempty), so only those are built, straight into a ``circuits.compiler.dag.Dag``:
O(elements) work (about 10^6 elements a second), where OR-ing conjunctions through pysdd costs
O(f^2) per state of f terms and builds the dead half of the SDD too.

Trimming follows the SDD rules: a node whose single element has prime TRUE is its sub; a node whose
single live element has sub TRUE is its prime (the rule {(p, TRUE), (not p, FALSE)} = p).

- ``interval_layout(n, lo, hi)``: lo <= (true variables) <= hi over a balanced vtree (``ExactlyK``
  is lo = hi).
- ``grouped_layout(spec)``: a ``GroupLimited`` / ``GroupCapacity`` spec over
  ``circuits.compiler.groups.group_vtree``'s shape (balanced within each group, then over the groups).

The layouts equal pysdd's up to the order of nodes within a height and of elements within a node
(tests/circuits/compiler/test_count_tree.py checks the isomorphism and the function by brute force).
"""

from __future__ import annotations

from collections.abc import Callable

from ..layout import FALSE_SLOT, TRUE_SLOT, Layout
from .dag import Dag, Ref

Progress = Callable[[int], None]  # told the elements built


def _span(lo: int, hi: int) -> int:
    """The bitset of variables lo..hi-1."""
    return ((1 << hi) - 1) ^ ((1 << lo) - 1)


def exactly_layout(n: int, k: int, progress: Progress | None = None) -> Layout:
    """The layout of "exactly k of the n variables are true": the count tree, built a vtree node at a
    time. A vtree node over m variables keeps the counts j its parent needs (from k - (n - m) to
    min(m, k)); "exactly j" has one element (exactly x left, exactly j - x right) per feasible x,
    and every element mentions all of the node's variables (no implicit pairs)."""
    dag = Dag(n)

    def build(first: int, last: int, jlo: int, jhi: int) -> tuple[list[Ref], int]:
        """Refs of "exactly j of x[first:last]" for j = jlo..jhi, and their height."""
        m = last - first
        if m == 1:
            return [dag.literal(first, j == 1) for j in range(jlo, jhi + 1)], 0
        L = m // 2
        R, mid = m - L, first + L
        xlo, xhi = max(0, jlo - R), min(L, jhi)  # left counts used
        ylo, yhi = max(0, jlo - L), min(R, jhi)  # right counts used
        left, hl = build(first, mid, xlo, xhi)
        right, hr = build(mid, last, ylo, yhi)
        height, out = 1 + max(hl, hr), []
        for j in range(jlo, jhi + 1):
            a, b = max(0, j - R), min(L, j)  # x = a..b, sub j - x = j - a down to j - b
            subs = right[j - b - ylo : j - a - ylo + 1][::-1]
            elems = list(zip(left[a - xlo : b - xlo + 1], subs))
            out.append(dag.add(elems, None, implicit=[], height=height))
            if progress is not None:
                progress(len(elems))
        return out, height

    (root,), _ = build(0, n, k, k)
    return dag.layout(root, _span(0, n))


class _Spans:
    """A ``Dag`` whose every node covers a contiguous block of variables (its vtree node's), so that
    an element's implicit variables are the parts of the two halves its children miss."""

    def __init__(self, n: int):
        self.dag, self.n = Dag(n), n
        self.span: dict[Ref, tuple[int, int]] = {}

    def span_of(self, ref: Ref) -> tuple[int, int] | None:
        if ref == TRUE_SLOT:
            return None
        if ref < self.dag.leaves:
            v = (ref - 2) % self.n
            return (v, v + 1)
        return self.span[ref]

    def add(self, elems: list[tuple[Ref, Ref]], first: int, mid: int, last: int) -> Ref:
        """A node over variables first..last-1 split at mid (primes left of it, subs right)."""
        implicit, height, base, heights = [], 0, self.dag.leaves, self.dag.height
        for e, (p, q) in enumerate(elems):
            for child, lo, hi in ((p, first, mid), (q, mid, last)):
                if child >= base:
                    height = max(height, heights[child - base])
                sp = self.span_of(child)
                if sp is None:
                    implicit.extend((e, v) for v in range(lo, hi))
                elif sp != (lo, hi):
                    implicit.extend((e, v) for v in (*range(lo, sp[0]), *range(sp[1], hi)))
        ref = self.dag.add(elems, None, implicit=implicit, height=height + 1)
        self.span[ref] = (first, last)
        return ref

    def layout(self, root: Ref) -> Layout:
        sp = self.span_of(root) if root != FALSE_SLOT else None
        return self.dag.layout(root, 0 if sp is None else _span(*sp))


def interval_layout(n: int, lo: int, hi: int, progress: Progress | None = None) -> Layout:
    """The layout of "between lo and hi of the n variables are true" (0 <= lo <= hi <= n)."""
    spans = _Spans(n)
    memo: dict[tuple[int, int, int, int], Ref] = {}

    def node(first: int, last: int, a: int, b: int) -> Ref:
        """count(x[first:last]) in [a, b]."""
        m = last - first
        a, b = max(a, 0), min(b, m)
        if a > b:
            return FALSE_SLOT
        if a == 0 and b == m:
            return TRUE_SLOT
        if m == 1:
            return spans.dag.literal(first, a == 1)
        key = (first, last, a, b)
        ref = memo.get(key)
        if ref is not None:
            return ref
        L = m // 2
        R, mid = m - L, first + L
        full_lo, full_hi = a, min(b - R, L)  # left counts x whose sub is TRUE: x >= a, x + R <= b
        elems = []
        for x in range(max(0, a - R), min(L, b) + 1):  # left counts x with a nonempty sub
            if full_lo <= x <= full_hi:
                continue
            prime = memo.get((first, mid, x, x)) if L > 1 else None
            elems.append((node(first, mid, x, x) if prime is None else prime, node(mid, last, a - x, b - x)))
        if full_lo <= full_hi:
            elems.append((node(first, mid, full_lo, full_hi), TRUE_SLOT))
        if len(elems) == 1 and elems[0][1] == TRUE_SLOT:  # trimmed: the node is its prime
            ref = elems[0][0]
        else:
            ref = spans.add(elems, first, mid, last)
            if progress is not None:
                progress(len(elems))
        memo[key] = ref
        return ref

    return spans.layout(node(0, n, lo, hi))


OVER = None  # the state past a limit (too many true variables, in a group or in all, or groups)


class _Vnode:
    """A node of the group vtree over variables first..last-1: its kind ("in": inside a group,
    "group": a group's top, "above": over whole groups), children, and reachable states."""

    def __init__(self, first: int, last: int, kind: str, left: _Vnode | None = None, right: _Vnode | None = None):
        self.first, self.last, self.kind, self.left, self.right = first, last, kind, left, right
        self.states: frozenset = frozenset()  # reachable states other than OVER
        self.ordered: tuple = ()  # the same, sorted
        self.over = False  # OVER is reachable
        self.shape: tuple = ()  # (kind, sizes of the groups below, or the block size inside one)


def _group_tree(sizes: tuple[int, ...]) -> _Vnode:
    """The shape of ``circuits.compiler.groups.group_vtree(sizes)``: the left half is the smaller."""

    def inside(first: int, last: int, top: bool) -> _Vnode:
        kind = "group" if top else "in"
        if last - first == 1:
            v = _Vnode(first, last, kind)
        else:
            mid = first + (last - first) // 2
            v = _Vnode(first, last, kind, inside(first, mid, False), inside(mid, last, False))
        v.shape = (kind, last - first)
        return v

    def over(groups: list[tuple[int, int]]) -> _Vnode:
        if len(groups) == 1:
            return inside(*groups[0], True)
        mid = len(groups) // 2
        left, right = over(groups[:mid]), over(groups[mid:])
        v = _Vnode(left.first, right.last, "above", left, right)
        v.shape = ("above", tuple(b - a for a, b in groups))
        return v

    bounds, start = [], 0
    for s in sizes:
        bounds.append((start, start + s))
        start += s
    return over(bounds)


def grouped_layout(spec, progress: Progress | None = None) -> Layout:
    """The layout of a group spec (``GroupLimited`` / ``GroupCapacity``): states (c true, g nonempty groups) above the groups (g is 0 when
    the number of groups is not limited), counts inside them, OVER past kmax / capacity / max_groups;
    the root's set is {(c, g): kmin <= c <= kmax}."""
    K, M, cap = spec.kmax, spec.max_groups, min(spec.capacity, spec.kmax)
    track = spec.limits_groups

    def clip(v: _Vnode, c: int, g: int):
        """The state of v with c true variables (g nonempty groups above the groups)."""
        if v.kind == "in":
            return (c, 0) if c <= cap else OVER
        if v.kind == "group":
            g = int(track and c > 0)
            return (c, g) if c <= cap and g <= M else OVER
        return (c, g) if c <= K and g <= M else OVER

    reached: dict[tuple, tuple] = {}  # shape -> (states, ordered, over): equal subtrees reach the same

    def reach(v: _Vnode) -> None:
        if v.left is not None:
            reach(v.left)
            reach(v.right)
        if v.shape not in reached:
            if v.left is None:
                states, over = [clip(v, 0, 0), clip(v, 1, 0)], False
            else:
                states = [clip(v, cl + cr, gl + gr) for cl, gl in v.left.states for cr, gr in v.right.states]
                over = v.left.over or v.right.over
            kept = frozenset(s for s in states if s is not OVER)
            reached[v.shape] = (kept, tuple(sorted(kept)), over or OVER in states)
        v.states, v.ordered, v.over = reached[v.shape]

    root = _group_tree(spec.groups)
    reach(root)
    spans = _Spans(spec.n)
    memo: dict[tuple[int, frozenset], Ref] = {}

    def node(v: _Vnode, S: frozenset) -> Ref:
        """The node of "v's state is in S" (S a subset of v.states)."""
        if not S:
            return FALSE_SLOT
        if v.states == S and not v.over:
            return TRUE_SLOT
        if v.left is None:
            return spans.dag.literal(v.first, next(iter(S))[0] == 1)
        key = (id(v), S)
        if key in memo:
            return memo[key]
        l, r = v.left, v.right
        by_sub: dict[frozenset, list] = {}
        for cl, gl in l.ordered:
            if v.kind == "above":
                T = frozenset(t for t in ((c - cl, g - gl) for c, g in S) if t in r.states)
            else:  # inside a group (g is the group's own nonempty flag, from c)
                T = frozenset(t for t in ((c - cl, 0) for c, _ in S) if t in r.states)
            if T:
                by_sub.setdefault(T, []).append((cl, gl))
        items = [(frozenset(A), T) for T, A in by_sub.items()]
        if len(items) == 1 and items[0][0] == l.states and not l.over:  # trimmed: prime TRUE
            ref = node(r, items[0][1])
        elif len(items) == 1 and items[0][1] == r.states and not r.over:  # trimmed: sub TRUE
            ref = node(l, items[0][0])
        else:
            elems = [(node(l, A), node(r, T)) for A, T in items]
            ref = spans.add(elems, v.first, l.last, v.last)
            if progress is not None:
                progress(len(elems))
        memo[key] = ref
        return ref

    band = frozenset(s for s in root.states if spec.kmin <= s[0] <= spec.kmax)
    return spans.layout(node(root, band))
