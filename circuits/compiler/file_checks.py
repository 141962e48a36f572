"""Checks of DIMACS, ``.vtree`` and ``.sdd`` files before libsdd reads them.

libsdd trusts its input: a malformed file makes it print a parse error and exit the whole
process, an out-of-range literal or an SDD read with the wrong vtree makes it crash, and a CNF
with more clauses than its header declares is silently cut short. These checks turn each of
those into a ``ValueError`` naming the file, the line and what is wrong.
"""

from __future__ import annotations

from pathlib import Path


def _fail(path, line: int, what: str):
    raise ValueError(f"{path}: line {line}: {what}")


def _ints(path, no: int, words: list[str]) -> list[int]:
    try:
        return [int(w) for w in words]
    except ValueError:
        _fail(path, no, f"expected integers, got {' '.join(words)!r}")


def _lines(path):
    """(line number, words) of the non-empty lines that are not comments."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: unreadable ({exc.__class__.__name__})") from None
    for no, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if words and words[0] != "c":
            yield no, words


def check_dimacs(path) -> None:
    """A DIMACS CNF: one ``p cnf V C`` header, then exactly C clauses of literals in [-V, V] \\ {0},
    each ending in 0 (clauses may span lines; a SATLIB ``%`` line ends the file)."""
    header, clauses, open_clause, last = None, 0, False, 0
    for no, words in _lines(path):
        last = no
        if words[0] == "%":
            break
        if words[0] == "p":
            if header is not None or len(words) != 4 or words[1] != "cnf":
                _fail(path, no, "the header must be one line 'p cnf VARIABLES CLAUSES'")
            header = _ints(path, no, words[2:])
            if header[0] < 1 or header[1] < 0:
                _fail(path, no, f"the header needs VARIABLES >= 1 and CLAUSES >= 0, got {header}")
            continue
        if header is None:
            _fail(path, no, "clauses before the 'p cnf' header")
        for lit in _ints(path, no, words):
            if lit == 0:
                clauses, open_clause = clauses + 1, False
            elif abs(lit) > header[0]:
                _fail(path, no, f"literal {lit} is outside [-{header[0]}, {header[0]}]")
            else:
                open_clause = True
    if header is None:
        raise ValueError(f"{path}: no 'p cnf VARIABLES CLAUSES' header")
    if open_clause:
        _fail(path, last, "the last clause does not end in 0")
    if clauses != header[1]:
        raise ValueError(f"{path}: the header declares {header[1]} clauses, the file has {clauses}")


def _records(path, header: str) -> tuple[int, list[tuple[int, str, list[int]]]]:
    """A libsdd file: the node count of its 'HEADER COUNT' line, and (line, kind, integers) per node."""
    declared, records = None, []
    for no, words in _lines(path):
        if declared is None:
            if words[0] != header or len(words) != 2:
                _fail(path, no, f"expected the header '{header} NODES'")
            declared = _ints(path, no, words[1:])[0]
        else:
            records.append((no, words[0], _ints(path, no, words[1:])))
    if declared is None:
        raise ValueError(f"{path}: no '{header} NODES' header")
    return declared, records


def _check_vtree(path) -> dict[int, tuple]:
    """Parse a ``.vtree`` file: id -> ("L", var, leaves) or ("I", left, right, leaves)."""
    nodes: dict[int, tuple] = {}
    used: set[int] = set()
    declared, records = _records(path, "vtree")
    for no, kind, args in records:
        if kind == "L" and len(args) == 2 and args[1] >= 1:
            node = ("L", args[1], frozenset([args[1]]))
        elif kind == "I" and len(args) == 3:
            left, right = nodes.get(args[1]), nodes.get(args[2])
            if left is None or right is None or args[1] in used or args[2] in used or args[1] == args[2]:
                _fail(path, no, "an internal node's children must be distinct nodes defined above, used once")
            used.update(args[1:])
            node = ("I", args[1], args[2], left[-1] | right[-1])
        else:
            _fail(path, no, "expected 'L id var' or 'I id left right'")
        if args[0] in nodes:
            _fail(path, no, f"vtree node {args[0]} is defined twice")
        nodes[args[0]] = node
    if len(nodes) != declared or len(nodes) - len(used) != 1:
        raise ValueError(f"{path}: expected {declared} vtree nodes forming one tree")
    leaves = [n[1] for n in nodes.values() if n[0] == "L"]
    if sorted(leaves) != list(range(1, len(leaves) + 1)):
        raise ValueError(f"{path}: the leaves must hold the variables 1..{len(leaves)}, once each")
    return nodes


def check_sdd_pair(sdd, vtree) -> None:
    """An ``.sdd`` file that is a normalised SDD over the given ``.vtree``."""
    vt = _check_vtree(vtree)
    scope: dict[int, frozenset] = {}  # sdd id -> variables of its vtree node (empty for constants)
    declared, records = _records(sdd, "sdd")
    for no, kind, args in records:
        if not args or args[0] in scope:
            _fail(sdd, no, "each node needs a new id")
        if kind in ("T", "F") and len(args) == 1:
            scope[args[0]] = frozenset()
        elif kind == "L" and len(args) == 3:
            v = vt.get(args[1])
            if v is None or v[0] != "L" or v[1] != abs(args[2]):
                _fail(sdd, no, f"literal {args[2]} does not sit on vtree leaf {args[1]} (wrong vtree file?)")
            scope[args[0]] = v[-1]
        elif kind == "D" and len(args) >= 3 and len(args) == 3 + 2 * args[2] and args[2] >= 1:
            v = vt.get(args[1])
            if v is None or v[0] != "I":
                _fail(sdd, no, f"decision node on vtree node {args[1]}, which is not internal (wrong vtree file?)")
            left, right = vt[v[1]][-1], vt[v[2]][-1]
            for prime, sub in zip(args[3::2], args[4::2]):
                if prime not in scope or sub not in scope:
                    _fail(sdd, no, "an element refers to a node not defined above")
                if not scope[prime] <= left or not scope[sub] <= right:
                    _fail(sdd, no, "the SDD is not normalised for this vtree (wrong vtree file?)")
            scope[args[0]] = v[-1]
        else:
            _fail(sdd, no, "expected 'F id', 'T id', 'L id vtree literal' or 'D id vtree k prime sub ...'")
    if len(scope) != declared or not scope:
        raise ValueError(f"{sdd}: expected {declared} SDD nodes")
