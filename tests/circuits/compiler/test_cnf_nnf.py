"""The numpy NNF path (circuits.compiler.nnf_parse, circuits.compiler.nnf) against its oracles: the fast reader
against the line-by-line reader on d4's output and on other spellings; the flattened layout and
the direct log Z against brute force on random decision-DNNFs of every shape the format allows
(ANDs of many children, literals on AND edges, shared and FALSE children, unreachable nodes)."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest

from circuits.compiler import cnf, nnf, nnf_parse, self_check

SATLIB = Path(__file__).parents[2] / "data" / "satlib"
FIELDS = ("kind", "edge_ptr", "child", "lit_ptr", "lits", "level")


def same(a: nnf_parse.Nnf, b: nnf_parse.Nnf) -> bool:
    return a.n == b.n and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


@pytest.mark.parametrize("name", ["uf20-01", "uf50-01", "flat30-2", "ais6", "par8-1-c", "2bitcomp_5"])
def test_fast_reader_matches_the_line_reader_on_d4_output(name):
    d4 = cnf.compile_d4(SATLIB / f"{name}.cnf")
    fast = nnf_parse._parse_fast(d4.nnf, d4.n)
    assert fast is not None and same(fast, nnf_parse._parse_lines(d4.nnf, d4.n))


D4_TEXT = "o 1 0\no 2 0\nt 3 0\n2 3 -2 0\n2 3 2 3 0\n1 2 1 0\n1 3 -1 -2 0\n"


@pytest.mark.parametrize(
    "text,fast",
    [
        (D4_TEXT, True),
        (D4_TEXT.rstrip("\n"), True),  # no final newline
        ("c a comment\n" + D4_TEXT, False),
        (D4_TEXT.replace("1 2 1 0", "1  2\t1 0"), False),  # other whitespace
        (D4_TEXT.replace("\n", "\r\n"), False),
        (D4_TEXT.replace("2 3 -2 0", "02 3 -2 0"), False),  # a leading zero
        (D4_TEXT.replace("2 3 -2 0", "2 3 +2 0"), False),
        (D4_TEXT.replace("\n2 3", "\n\n2 3"), True),  # blank lines
        ("o 0 0\nt 5 0\n0 5 1 0\n", False),  # node id 0
    ],
)
def test_other_spellings_read_as_the_line_reader_reads_them(text, fast):
    got = nnf.parse(text, 3)
    assert same(got, nnf_parse._parse_lines(text, 3))
    assert (nnf_parse._parse_fast(text, 3) is not None) == fast


@pytest.mark.parametrize(
    "text,match",
    [
        ("o 1 0\nt 2 0\n1 2 -0 0\n", "literals must be in"),
        ("o 1 0\nt 2 0\n1 2 1-2 0\n", "expected 'PARENT CHILD"),
        ("o 1 0\nt 2 0\n1 2 - 0\n", "expected 'PARENT CHILD"),
        ("o 1 0\n1 2 0\nt 2 0\n", "two nodes defined above"),  # the child is defined below the edge
        ("o 1 0\nt 2 0\n1 2 99999999999999999999 0\n", "literals must be in"),
        ("o 1 0\nt 2 0\n1 2 1 2\n", "two nodes defined above"),  # no final 0
        ("o 1 0\nt 2 0\n1 2 1 0 2 0\n", "literals must be in"),  # two edges on one line
        ("o 1 0 o 2 0\n", "expected a new node"),
        ("o 1 0\no 1\n", "expected a new node"),
        ("at 1 0\n", "expected 'PARENT CHILD"),
        ("o 1 0\n1 1 0\n", "cycle"),
    ],
)
def test_more_bad_text_is_refused_by_line(text, match):
    with pytest.raises(ValueError, match=match):
        nnf.parse(text, 3)


def test_a_cycle_the_root_does_not_reach_is_left_out():
    text = "o 1 0\nt 2 0\no 3 0\no 4 0\n1 2 1 0\n1 2 -1 2 0\n3 4 0\n4 3 0\n"
    parsed = nnf.parse(text, 2)
    assert parsed.level.tolist() == [1, 0, -1, -1]
    assert nnf.to_layout(parsed).model_count() == 3


class RandomDnnf:
    """A random decision-DNNF over variables 1..n as d4 writes one (nodes first, the root first),
    with AND nodes of up to four children, literals on OR and AND edges, FALSE children, shared
    sub-circuits and unreachable nodes."""

    def __init__(self, seed: int, n: int):
        self.rng, self.n = random.Random(seed), n
        self.nodes: list[str] = []  # kinds, in the order made (children first)
        self.edges: list[tuple[int, int, list[int]]] = []
        self.shared: dict[frozenset, int] = {}
        self.root = self.node(list(range(1, n + 1)))
        self.node(self.rng.sample(range(1, n + 1), 2))  # unreachable

    def new(self, kind: str) -> int:
        self.nodes.append(kind)
        return len(self.nodes)

    def units(self, vars_: list[int]) -> tuple[list[int], list[int]]:
        """Some of vars_ as literals on an edge, and the rest."""
        k = self.rng.randint(0, min(3, len(vars_)))
        picked = self.rng.sample(vars_, k)
        return [v if self.rng.random() < 0.5 else -v for v in picked], [v for v in vars_ if v not in picked]

    def node(self, vars_: list[int]) -> int:
        rng, key = self.rng, frozenset(vars_)
        if key in self.shared and rng.random() < 0.5:
            return self.shared[key]
        r = rng.random()
        if not vars_ or r < 0.12:
            out = self.new("f" if rng.random() < 0.15 else "t")
        elif r < 0.6:
            x = rng.choice(vars_)
            rest = [v for v in vars_ if v != x]
            out = self.new("o")
            for sign in rng.sample((1, -1), rng.choice((1, 2, 2, 2))):
                lits, sub = self.units(rest)
                self.edges.append((out, self.node(sub), [sign * x] + lits))
        else:
            rng.shuffle(vars_)
            cuts = sorted(rng.sample(range(len(vars_) + 1), rng.randint(1, min(3, len(vars_) + 1))))
            parts = [vars_[a:b] for a, b in zip([0] + cuts, cuts + [len(vars_)])]
            out = self.new("a")
            for part in parts:
                lits, sub = self.units(part) if rng.random() < 0.4 else ([], part)
                self.edges.append((out, self.node(sub), lits))
        self.shared[key] = out
        return out

    def text(self) -> str:
        ids = {self.root: 1}
        for i in range(len(self.nodes), 0, -1):  # the root first, then the others
            ids.setdefault(i, len(ids) + 1)
        heads = sorted(ids, key=ids.get)
        lines = [f"{self.nodes[i - 1]} {ids[i]} 0" for i in heads]
        lines += [" ".join(map(str, [ids[p], ids[c], *lits, 0])) for p, c, lits in self.edges]
        return "\n".join(lines) + "\n"

    def holds(self, x: tuple[int, ...]) -> bool:
        value: dict[int, bool] = {}

        def ev(i: int) -> bool:
            if i not in value:
                kind = self.nodes[i - 1]
                terms = [
                    ev(c) and all((x[abs(lit) - 1] == 1) == (lit > 0) for lit in lits)
                    for p, c, lits in self.edges
                    if p == i
                ]
                value[i] = kind == "t" or (kind == "o" and any(terms)) or (kind == "a" and all(terms))
            return value[i]

        return ev(self.root)


@pytest.mark.parametrize("seed", range(40))
def test_random_decision_dnnf_against_brute_force(seed):
    n = 3 + seed % 7
    d = RandomDnnf(seed, n)
    parsed = nnf.parse(d.text(), n)
    assert nnf_parse._parse_fast(d.text(), n) is not None
    allowed = [x for x in itertools.product((0, 1), repeat=n) if d.holds(x)]
    r = np.random.default_rng(seed).standard_normal((3, n)) * 2
    weights = np.array(allowed, dtype=np.float64).reshape(-1, n)
    logp = weights @ self_check.log_sigmoid(r).T + (1 - weights) @ self_check.log_sigmoid(-r).T  # [M, T]
    want = np.logaddexp.reduce(logp, axis=0) if allowed else np.full(3, -math.inf)
    np.testing.assert_allclose(nnf.log_partition(parsed, r), want, rtol=0, atol=1e-12)
    if not allowed:
        with pytest.raises(ValueError, match="unsatisfiable"):
            nnf.to_layout(parsed)
        return
    layout = nnf.to_layout(parsed)
    assert layout.model_count() == len(allowed)
    np.testing.assert_allclose(self_check.layout_log_partition(layout, r), want, rtol=0, atol=1e-12)


def test_repeated_factors_count_once():
    """An AND whose edges repeat a literal and a child (not decomposable, but read as Boolean AND)."""
    text = "a 1 0\no 2 0\nt 3 0\n1 2 1 0\n1 2 1 0\n1 3 1 0\n2 3 2 0\n2 3 -2 -3 0\n"
    layout = nnf.to_layout(nnf.parse(text, 3))
    assert layout.model_count() == 3  # x1 and (x2 or (not x2 and not x3))
