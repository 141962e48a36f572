"""d-DNNF circuits in d4's NNF text format: parsing, flattening into a ``Layout``, and an
independent log-partition.

The format (d4, also c2d's successors): one line per node, ``o ID 0`` (OR), ``a ID 0`` (AND),
``t ID 0`` (TRUE), ``f ID 0`` (FALSE), then one line per edge, ``PARENT CHILD LIT... 0``: the child
conjoined with the literals. The first node is the root. d4 emits a decision-DNNF: an OR's edges
carry complementary decision literals (deterministic), an AND's children share no variable
(decomposable).

``to_layout`` maps it onto the layout's OR-of-pairs nodes (``circuits.dag``): an OR node keeps
one element per live edge; an edge's or an AND's factors (literals and child nodes) are multiplied
two at a time, lowest first, through single-element nodes (memoised, so a product shared by two
parents is built once). The OR's variables a child does not mention become implicit pairs (the
layout's smoothing), and so do the variables the root does not mention (free variables).

``log_partition`` evaluates the parsed circuit directly (numpy, float64): with the normalised
leaves log sigmoid(r), log sigmoid(-r) a missing variable contributes log 1, so no smoothing is
needed; it shares nothing with the layout and checks it (``circuits.compile``, ``circuits.cache``).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from . import self_check
from .dag import Dag, Ref
from .layout import FALSE_SLOT, TRUE_SLOT, Layout

KINDS = ("o", "a", "t", "f")


@dataclass(frozen=True)
class Nnf:
    """A parsed NNF: ``kind[i]`` in "oatf", ``edges[i]`` the (child index, literals) of node i,
    ``order`` the node indices children first, node 0 the root; ``n`` variables."""

    n: int
    kind: list[str]
    edges: list[list[tuple[int, tuple[int, ...]]]]
    order: list[int]

    @property
    def unsatisfiable(self) -> bool:
        return self.kind[0] == "f"


def parse(text: str, n: int) -> Nnf:
    """Parse and check d4's NNF text over variables 1..n; ValueError naming the line otherwise."""
    ids: dict[int, int] = {}
    kind: list[str] = []
    edges: list[list[tuple[int, tuple[int, ...]]]] = []
    for no, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0] == "c":
            continue
        if words[0] in KINDS:
            if len(words) != 3 or words[2] != "0" or not words[1].isdigit() or int(words[1]) in ids:
                raise ValueError(f"NNF line {no}: expected a new node 'KIND ID 0', got {line!r}")
            ids[int(words[1])] = len(kind)
            kind.append(words[0])
            edges.append([])
            continue
        try:
            nums = list(map(int, words))
        except ValueError:
            raise ValueError(f"NNF line {no}: expected 'PARENT CHILD LITERALS... 0', got {line!r}") from None
        if len(nums) < 3 or nums[-1] != 0 or nums[0] not in ids or nums[1] not in ids:
            raise ValueError(f"NNF line {no}: an edge must join two nodes defined above and end in 0, got {line!r}")
        lits = tuple(nums[2:-1])
        if lits and (min(lits) < -n or max(lits) > n or 0 in lits):
            raise ValueError(f"NNF line {no}: literals must be in [-{n}, {n}] without 0, got {list(lits)}")
        parent = ids[nums[0]]
        if kind[parent] not in "oa":
            raise ValueError(f"NNF line {no}: only OR and AND nodes have children")
        edges[parent].append((ids[nums[1]], lits))
    if not kind:
        raise ValueError("the NNF has no nodes")
    return Nnf(n, kind, edges, _children_first(edges))


def _children_first(edges: list[list[tuple[int, tuple]]]) -> list[int]:
    """The nodes reachable from node 0, children before parents; ValueError on a cycle."""
    state = [0] * len(edges)  # 0 new, 1 on the stack, 2 done
    order: list[int] = []
    stack = [(0, 0)]
    state[0] = 1
    while stack:
        node, i = stack.pop()
        if i < len(edges[node]):
            stack.append((node, i + 1))
            child = edges[node][i][0]
            if state[child] == 1:
                raise ValueError("the NNF has a cycle")
            if state[child] == 0:
                state[child] = 1
                stack.append((child, 0))
        else:
            state[node] = 2
            order.append(node)
    return order


def to_layout(nnf: Nnf) -> Layout:
    """The level layout of the circuit (see the module docstring); ValueError if it is FALSE."""
    dag = Dag(nnf.n)
    products: dict[tuple[Ref, Ref], Ref] = {}
    height, scope = dag.height_of, dag.scope_of

    def product(a: Ref, b: Ref) -> Ref:
        """The single-element node a AND b, built once (its scope and height known: no smoothing)."""
        key = (a, b) if a < b else (b, a)
        got = products.get(key)
        if got is None:
            got = products[key] = dag.add([key], scope(a) | scope(b), implicit=[],
                                          height=1 + max(height(a), height(b)))
        return got

    def pair(factors: list[Ref]) -> tuple[Ref, Ref] | None:
        """The factors as one element (a, b), lowest first into single-element nodes; None if FALSE."""
        if FALSE_SLOT in factors:
            return None
        live = [f for f in factors if f != TRUE_SLOT]
        if len(live) <= 2:  # most of d4's edges: a decision literal and a child, no product to build
            if len(live) == 2 and live[0] != live[1]:
                a, b = live
                return (a, b) if (height(a), a) <= (height(b), b) else (b, a)
            return (live[0], TRUE_SLOT) if live else (TRUE_SLOT, TRUE_SLOT)
        heap = [(height(f), f) for f in dict.fromkeys(live)]
        heapq.heapify(heap)
        while len(heap) > 2:
            (_, a), (_, b) = heapq.heappop(heap), heapq.heappop(heap)
            c = product(a, b)
            heapq.heappush(heap, (height(c), c))
        refs = [f for _, f in sorted(heap)] + [TRUE_SLOT] * (2 - len(heap))
        return refs[0], refs[1]

    leaf = {lit: dag.literal(abs(lit) - 1, lit > 0) for v in range(1, nnf.n + 1) for lit in (v, -v)}
    ref: dict[int, Ref] = {}
    for i in nnf.order:
        k, edges = nnf.kind[i], nnf.edges[i]
        if k in "tf":
            ref[i] = TRUE_SLOT if k == "t" else FALSE_SLOT
            continue
        if k == "a" and len(edges) == 1 and not edges[0][1]:  # an AND of one child: the child
            ref[i] = ref[edges[0][0]]
            continue
        terms = [[*[leaf[lit] for lit in lits], ref[c]] for c, lits in edges]
        if k == "a":
            both = pair([f for t in terms for f in t])
            if both is None:
                ref[i] = FALSE_SLOT
            else:
                ref[i] = both[0] if both[1] == TRUE_SLOT else product(*both)
            continue
        elems = [e for e in map(pair, terms) if e is not None]
        ref[i] = dag.add(elems) if elems else FALSE_SLOT
    return dag.layout(ref[0])


def log_partition(nnf: Nnf, r) -> np.ndarray:
    """log Z of the circuit at logits r [T, n] with leaves log sigmoid(+-r): [T] (float64).

    One row at a time in Python floats (a compile checks T = 2 probe rows: per-node numpy calls
    would cost more than the arithmetic)."""
    r = self_check.as_logits(r)
    pos, neg = self_check.log_sigmoid(r), self_check.log_sigmoid(-r)
    return np.array([_row_log_partition(nnf, p, q) for p, q in zip(pos.tolist(), neg.tolist())], dtype=np.float64)


def _row_log_partition(nnf: Nnf, pos: list[float], neg: list[float]) -> float:
    """log Z for one row of leaf weights ``pos[v]`` = log sigmoid(r_v), ``neg[v]`` = log sigmoid(-r_v)."""
    val: dict[int, float] = {}
    for i in nnf.order:
        k = nnf.kind[i]
        if k in "tf":
            val[i] = 0.0 if k == "t" else -math.inf
            continue
        terms = [val[c] + sum(pos[lit - 1] if lit > 0 else neg[-lit - 1] for lit in lits) for c, lits in nnf.edges[i]]
        if k == "a":
            val[i] = sum(terms)
            continue
        top = max(terms, default=-math.inf)
        val[i] = top if top == -math.inf else top + math.log(sum(math.exp(t - top) for t in terms))
    return val[0]
