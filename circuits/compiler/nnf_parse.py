"""d4's NNF text parsed into flat arrays (``Nnf``), checked as untrusted input.

The format (d4, also c2d's successors): one line per node, ``o ID 0`` (OR), ``a ID 0`` (AND),
``t ID 0`` (TRUE), ``f ID 0`` (FALSE), and one line per edge, ``PARENT CHILD LIT... 0``: the child
conjoined with the literals. The first node is the root; an edge names nodes defined above it.

``parse`` reads text in d4's own spelling (ASCII, single spaces, ids >= 1 without leading zeros)
with numpy over the bytes and tokens; anything else, well-formed or not, goes to the line-by-line
reader (``_parse_lines``), which accepts what ``str.split`` and ``int`` accept and names the line of
the first error. Both give the same ``Nnf`` for the text the fast path takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dag import ranges

KINDS = "oatf"  # codes 0..3 in Nnf.kind
OR, AND, TRUE, FALSE = range(4)
_MAX_DIGITS = 18  # a token int64 holds whatever its digits

_ALLOWED = np.zeros(256, dtype=bool)
_ALLOWED[list(b"0123456789 \n-" + KINDS.encode())] = True
_KIND_CODE = np.full(256, -1, dtype=np.int64)
_KIND_CODE[list(KINDS.encode())] = np.arange(4)


@dataclass(frozen=True)
class Nnf:
    """A parsed NNF over variables 1..n, nodes in the order they were defined (node 0 the root).

    kind: int64 [N], codes OR, AND, TRUE, FALSE.
    edge_ptr: int64 [N + 1]; node i's edges are edge_ptr[i]:edge_ptr[i+1], in file order.
    child: int64 [E], each edge's child node.
    lit_ptr: int64 [E + 1]; edge e's literals are lits[lit_ptr[e]:lit_ptr[e+1]].
    lits: int64 [L], DIMACS literals (+-v, 1 <= v <= n).
    level: int64 [N], the longest path down to a leaf of each node reachable from the root, -1 for
        the others (no node reachable from the root lies on a cycle).
    """

    n: int
    kind: np.ndarray
    edge_ptr: np.ndarray
    child: np.ndarray
    lit_ptr: np.ndarray
    lits: np.ndarray
    level: np.ndarray

    @property
    def unsatisfiable(self) -> bool:
        return bool(self.kind[0] == FALSE)

    @property
    def edge_parent(self) -> np.ndarray:
        """int64 [E], each edge's parent node."""
        return np.repeat(np.arange(len(self.kind)), np.diff(self.edge_ptr))


def parse(text: str, n: int) -> Nnf:
    """Parse and check d4's NNF text over variables 1..n; ValueError naming the line otherwise."""
    got = _parse_fast(text, n)
    return got if got is not None else _parse_lines(text, n)


def _parse_fast(text: str, n: int) -> Nnf | None:
    """The Nnf of text in d4's spelling, or None for anything else (``_parse_lines`` decides)."""
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        return None
    b = np.frombuffer(raw + b"\n", dtype=np.uint8)
    if not _ALLOWED[b].all():
        return None
    sep = (b == ord(" ")) | (b == ord("\n"))
    word = ~sep
    start = word & np.concatenate(([True], sep[:-1]))
    ts = np.flatnonzero(start)  # token starts
    te = np.flatnonzero(word & np.concatenate((sep[1:], [True]))) + 1  # token ends
    if ts.size == 0:
        return None
    length = te - ts
    head = b[ts]
    code = _KIND_CODE[head]
    letter = code >= 0
    tok_line = np.cumsum(b == ord("\n"))[ts]  # text line of each token
    first = np.concatenate(([True], tok_line[1:] != tok_line[:-1]))  # the first token of its line
    line_start = np.flatnonzero(first)
    line_ntok = np.diff(np.append(line_start, ts.size))
    line_end = line_start + line_ntok - 1  # its last token
    minus = np.flatnonzero(b == ord("-"))
    if (
        np.any(letter & ((length != 1) | ~first))
        or np.any(length > _MAX_DIGITS)
        or np.any(~letter & (head == ord("0")) & (length > 1))  # leading zeros
        or np.count_nonzero(_KIND_CODE[b] >= 0) != np.count_nonzero(letter)  # letters only as kinds
        or not np.all(start[minus])
        or np.any(~np.isin(b[minus + 1], np.frombuffer(b"123456789", np.uint8)))
    ):
        return None
    digits = b.copy()
    digits[ts[letter]] = ord("0")
    vals = np.fromstring(digits.tobytes(), dtype=np.int64, sep=" ")
    if vals.size != ts.size or np.any(vals[line_end] != 0) or np.count_nonzero(vals[~letter] == 0) != line_start.size:
        return None
    is_node = letter[line_start]
    node_line = np.flatnonzero(is_node)
    if node_line.size == 0 or np.any(line_ntok[node_line] != 3):
        return None
    ids = vals[line_start[node_line] + 1]
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    if sorted_ids[0] < 1 or np.any(sorted_ids[1:] == sorted_ids[:-1]):
        return None
    edge_line = np.flatnonzero(~is_node)
    if np.any(line_ntok[edge_line] < 3):
        return None
    s = line_start[edge_line]

    def node_of(v: np.ndarray) -> np.ndarray | None:
        at = np.minimum(np.searchsorted(sorted_ids, v), sorted_ids.size - 1)
        return order[at] if np.all(sorted_ids[at] == v) else None

    parent, child = node_of(vals[s]), node_of(vals[s + 1])
    kind = code[line_start[node_line]]
    if parent is None or child is None or np.any(node_line[parent] > edge_line) or np.any(node_line[child] > edge_line):
        return None
    if np.any(kind[parent] > AND):
        return None
    lit_index = ranges(s + 2, line_end[edge_line])
    lits = vals[lit_index]
    if lits.size and np.abs(lits).max() > n:
        return None
    return _build(n, kind, parent, child, line_end[edge_line] - s - 2, lits)


def _parse_lines(text: str, n: int) -> Nnf:
    """The reference reader, one line at a time; ValueError naming the line of the first error."""
    ids: dict[int, int] = {}
    kind: list[int] = []
    parent, child, counts, lits = [], [], [], []
    for no, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0] == "c":
            continue
        if len(words[0]) == 1 and words[0] in KINDS:
            if len(words) != 3 or words[2] != "0" or not words[1].isdigit() or int(words[1]) in ids:
                raise ValueError(f"NNF line {no}: expected a new node 'KIND ID 0', got {line!r}")
            ids[int(words[1])] = len(kind)
            kind.append(KINDS.index(words[0]))
            continue
        try:
            nums = list(map(int, words))
        except ValueError:
            raise ValueError(f"NNF line {no}: expected 'PARENT CHILD LITERALS... 0', got {line!r}") from None
        if len(nums) < 3 or nums[-1] != 0 or nums[0] not in ids or nums[1] not in ids:
            raise ValueError(f"NNF line {no}: an edge must join two nodes defined above and end in 0, got {line!r}")
        edge_lits = nums[2:-1]
        if edge_lits and (min(edge_lits) < -n or max(edge_lits) > n or 0 in edge_lits):
            raise ValueError(f"NNF line {no}: literals must be in [-{n}, {n}] without 0, got {edge_lits}")
        if kind[ids[nums[0]]] > AND:
            raise ValueError(f"NNF line {no}: only OR and AND nodes have children")
        parent.append(ids[nums[0]])
        child.append(ids[nums[1]])
        counts.append(len(edge_lits))
        lits.extend(edge_lits)
    if not kind:
        raise ValueError("the NNF has no nodes")
    as_array = lambda x: np.asarray(x, dtype=np.int64)
    return _build(n, as_array(kind), as_array(parent), as_array(child), as_array(counts), as_array(lits))


def _build(n: int, kind, parent, child, counts, lits) -> Nnf:
    """The Nnf of edges given in file order (parent, child, literal count [E]; lits [L])."""
    order = np.argsort(parent, kind="stable")
    lit_ptr = np.concatenate(([0], np.cumsum(counts)))
    edge_ptr = np.concatenate(([0], np.cumsum(np.bincount(parent, minlength=len(kind))))).astype(np.int64)
    counts = counts[order]
    lits = lits[ranges(lit_ptr[order], lit_ptr[order] + counts)]
    child = child[order]
    return Nnf(
        n,
        kind,
        edge_ptr,
        child,
        np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
        lits,
        _levels(edge_ptr, child),
    )


def _levels(edge_ptr: np.ndarray, child: np.ndarray) -> np.ndarray:
    """Each node's longest path down to a leaf, over the nodes reachable from node 0 (-1 for the
    others), a frontier at a time; ValueError if a reachable node lies on a cycle."""
    nodes = edge_ptr.size - 1
    reach = np.zeros(nodes, dtype=bool)
    reach[0] = True
    frontier = np.zeros(1, dtype=np.int64)
    while frontier.size:
        kids = np.unique(child[ranges(edge_ptr[frontier], edge_ptr[frontier + 1])])
        frontier = kids[~reach[kids]]
        reach[frontier] = True
    parent = np.repeat(np.arange(nodes), np.diff(edge_ptr))
    by_child = np.argsort(child, kind="stable")
    in_ptr = np.concatenate(([0], np.cumsum(np.bincount(child, minlength=nodes))))
    left = np.where(reach, np.diff(edge_ptr), -1)  # children not yet levelled
    level = np.full(nodes, -1, dtype=np.int64)
    ready = np.flatnonzero(left == 0)
    depth = 0
    while ready.size:
        level[ready] = depth
        ups = parent[by_child[ranges(in_ptr[ready], in_ptr[ready + 1])]]
        ups = ups[reach[ups]]
        if ups.size:
            left -= np.bincount(ups, minlength=nodes)
            touched = np.unique(ups)
            ready = touched[left[touched] == 0]
        else:
            ready = ups
        depth += 1
    if np.any(reach & (level < 0)):
        raise ValueError("the NNF has a cycle")
    return level
