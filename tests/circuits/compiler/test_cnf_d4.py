"""CNF files compiled by d4 (circuits.compiler.cnf, circuits.compiler.nnf): every quantity against brute force on
small random CNFs, against Ganak's exact count on SATLIB instances (tests/data/satlib), marginals
against finite differences of log Z, samples inside the formula; the missing extra, d4's silence,
and bad NNF text."""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
import warnings
from pathlib import Path

import pytest
import torch
from brute import exact
from stats import chi2_pvalue, mask_counts

import circuits
from circuits.compiler import cache, cnf, nnf
from circuits.inspect.cli import compile_main

SATLIB = Path(__file__).parents[2] / "data" / "satlib"
SATISFIABLE = ["uf20-01", "uf50-01", "flat30-2", "ais6", "par8-1-c", pytest.param("2bitcomp_5", marks=pytest.mark.slow)]


def write_cnf(path: Path, n: int, clauses: list[list[int]]) -> Path:
    path.write_text(f"p cnf {n} {len(clauses)}\n" + "".join(" ".join(map(str, c)) + " 0\n" for c in clauses))
    return path


def models(n: int, clauses) -> torch.Tensor:
    """Every satisfying assignment, by enumeration: [M, n] float64."""
    rows = [
        m
        for m in itertools.product((0.0, 1.0), repeat=n)
        if all(any((m[abs(lit) - 1] == 1.0) == (lit > 0) for lit in c) for c in clauses)
    ]
    return torch.tensor(rows, dtype=torch.float64).reshape(-1, n)


def satisfied(x: torch.Tensor, clauses) -> torch.Tensor:
    """Whether each row of x [D, n] in {0, 1} satisfies every clause: [D] bool."""
    ok = torch.ones(x.shape[0], dtype=torch.bool)
    for c in clauses:
        lits = torch.tensor(c)
        vals = x[:, lits.abs() - 1].bool()
        ok &= torch.where(lits > 0, vals, ~vals).any(dim=1)
    return ok


def random_cnf(seed: int) -> tuple[int, list[list[int]]]:
    """A random CNF over n <= 12 variables: 1- to 4-literal clauses, some variables left free."""
    rng = random.Random(seed)
    n = rng.randint(3, 12)
    used = rng.sample(range(1, n + 1), max(1, n - rng.randint(0, 2)))
    clauses = []
    for _ in range(rng.randint(1, 3 * n)):
        width = min(len(used), rng.choice((1, 2, 2, 3, 3, 3, 4)))
        clauses.append([v if rng.random() < 0.5 else -v for v in rng.sample(used, width)])
    return n, clauses


def satisfiable_cnfs(count: int) -> list[tuple[int, list[list[int]]]]:
    out, seed = [], 0
    while len(out) < count:
        n, clauses = random_cnf(seed)
        seed += 1
        if len(models(n, clauses)):
            out.append((n, clauses))
    return out


def fd_marginals(c, r: torch.Tensor, h: float = 1e-5) -> torch.Tensor:
    """E[x_i] = d log Z / d r_i + sigmoid(r_i) (log Z with the leaves log sigmoid(+-r)), by central
    differences: r [n] -> [n]."""
    out = torch.empty_like(r)
    for i in range(r.shape[0]):
        e = torch.zeros_like(r)
        e[i] = h
        out[i] = (c.log_partition((r + e)[None]) - c.log_partition((r - e)[None]))[0] / (2 * h)
    return out + torch.sigmoid(r)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("n,clauses", satisfiable_cnfs(12), ids=[f"cnf{i}" for i in range(12)])
def test_random_cnf_against_brute_force(n, clauses, tmp_path):
    path = write_cnf(tmp_path / "f.cnf", n, clauses)
    c = circuits.compile_circuit(path, cache_dir=tmp_path / "cache")
    assert c.info["compiler"] == "d4"
    allowed = models(n, clauses)
    assert c.layout.model_count() == len(allowed)
    r = torch.randn(4, n, generator=torch.Generator().manual_seed(n)) * 1.5
    want = exact(r, allowed)
    torch.testing.assert_close(c.log_partition(r), want.log_partition, atol=1e-10, rtol=0)
    torch.testing.assert_close(c.marginals(r), want.marginals, atol=1e-10, rtol=0)
    torch.testing.assert_close(fd_marginals(c, r[0]), want.marginals[0], atol=1e-6, rtol=0)
    assert torch.equal(c.map(r), want.map)
    draws = c.sample(r[0].expand(20_000, -1), generator=torch.Generator().manual_seed(1))
    assert satisfied(draws, clauses).all()
    assert chi2_pvalue(mask_counts(draws, allowed), want.probs[0]) > 1e-3
    by_pysdd = circuits.compile_circuit(path, cache_dir=tmp_path / "cache", compiler="pysdd")
    torch.testing.assert_close(by_pysdd.log_partition(r), want.log_partition, atol=1e-10, rtol=0)


def test_float32_backend_on_a_random_cnf(tmp_path):
    """The default fp32 CPU evaluator (the C passes where built) on a d4 layout."""
    n, clauses = satisfiable_cnfs(3)[-1]
    c = circuits.compile_circuit(write_cnf(tmp_path / "f.cnf", n, clauses), cache_dir=tmp_path)
    r = torch.randn(3, n, generator=torch.Generator().manual_seed(2))
    want = exact(r.double(), models(n, clauses))
    torch.testing.assert_close(c.log_partition(r).double(), want.log_partition, atol=1e-5, rtol=0)
    torch.testing.assert_close(c.marginals(r).double(), want.marginals, atol=1e-5, rtol=0)
    assert satisfied(c.sample(r), clauses).all()


def ganak_count(n: int, clauses) -> int:
    pyganak = pytest.importorskip("pyganak")
    counter = pyganak.Counter()
    counter.new_vars(n)
    counter.add_clauses(clauses)
    return int(counter.count())


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("name", SATISFIABLE)
def test_satlib_instance(name, tmp_path):
    path = SATLIB / f"{name}.cnf"
    n, clauses = cnf.read_clauses(path)
    c = circuits.compile_circuit(path, cache_dir=tmp_path)
    count = c.layout.model_count()
    assert count == ganak_count(n, clauses)
    zero = torch.zeros(1, n)
    torch.testing.assert_close(
        c.log_partition(zero), torch.tensor([math.log(count) - n * math.log(2)]), atol=1e-9, rtol=0
    )
    r = torch.randn(n, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(c.marginals(r[None])[0], fd_marginals(c, r), atol=1e-6, rtol=0)
    draws = c.sample(r.expand(2_000, -1), generator=torch.Generator().manual_seed(0))
    assert satisfied(draws, clauses).all()
    assert satisfied(c.map(r[None]), clauses).all()
    assert (
        c.info["compile_seconds"] < 10
    )  # about 0.1 s idle (docs/reports/circuits-compile-epyc-2026-11.md); generous on a shared machine


def test_unsatisfiable_instance_is_refused_in_one_line(tmp_path, capsys):
    path = SATLIB / "uuf50-01.cnf"
    with pytest.raises(ValueError, match="uuf50-01.cnf is unsatisfiable \\(d4 proved it in"):
        circuits.compile_circuit(path, cache_dir=tmp_path)
    with pytest.raises(SystemExit) as info:
        compile_main(["--cnf", str(path), "--cache-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert info.value.code == 1 and out == "" and err.count("\n") == 1 and "unsatisfiable" in err


def test_d4_and_libsdd_print_nothing(tmp_path, capfd):
    path = SATLIB / "uf20-01.cnf"
    circuits.compile_circuit(path, cache_dir=tmp_path)
    circuits.compile_circuit(path, cache_dir=tmp_path, compiler="pysdd")
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_missing_extra_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "py_d4", None)  # import py_d4 raises ImportError
    path = SATLIB / "uf20-01.cnf"
    with pytest.raises(cnf.MissingExtra, match=r"pip install 'probmoe\[cnf\]'.*compiler='pysdd'"):
        circuits.compile_circuit(path, cache_dir=tmp_path)
    with pytest.raises(SystemExit) as info:
        compile_main(["--cnf", str(path), "--cache-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert info.value.code == 1 and out == "" and err.count("\n") == 1 and "probmoe[cnf]" in err
    c = circuits.compile_circuit(path, cache_dir=tmp_path, compiler="pysdd")  # pysdd still compiles it
    assert c.layout.model_count() == 8


def test_forged_nnf_in_the_cache_is_caught(tmp_path):
    path = SATLIB / "uf20-01.cnf"
    spec = circuits.CnfFile(str(path))
    circuits.compile_circuit(spec, cache_dir=tmp_path)
    entry = cache.entry_dir(spec, tmp_path)
    text = (entry / "circuit.nnf").read_text()
    line = next(ln for ln in text.splitlines() if len(ln.split()) > 3)  # an edge with a literal
    words = line.split()
    forged = " ".join(words[:2] + [str(-int(words[2]))] + words[3:])
    (entry / "circuit.nnf").write_text(text.replace(line, forged, 1))
    m = json.loads((entry / "manifest.json").read_text())
    m["sha256"]["circuit.nnf"] = cache._sha256(entry / "circuit.nnf")
    (entry / "manifest.json").write_text(json.dumps(m))
    with pytest.warns(circuits.CacheWarning, match="wrong function"):
        c = circuits.compile_circuit(spec, cache_dir=tmp_path)
    assert not c.info["cache_hit"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert circuits.compile_circuit(spec, cache_dir=tmp_path).info["cache_hit"]


@pytest.mark.parametrize(
    "text,match",
    [
        ("", "no nodes"),
        ("o 1 0\no 1 0\n", "expected a new node"),
        ("o 1 0\n1 2 0\n", "two nodes defined above"),
        ("o 1 0\nt 2 0\n1 2 7 0\n", r"literals must be in \[-3, 3\]"),
        ("o 1 0\nt 2 0\n1 2 x 0\n", "expected 'PARENT CHILD"),
        ("o 1 0\no 2 0\n1 2 0\n2 1 0\n", "cycle"),
        ("t 1 0\nt 2 0\n1 2 0\n", "only OR and AND nodes"),
    ],
)
def test_bad_nnf_text_is_refused(text, match):
    with pytest.raises(ValueError, match=match):
        nnf.parse(text, 3)


def test_tautology_and_free_variables(tmp_path):
    """A CNF whose d-DNNF is TRUE: every variable free, each an implicit pair of the root."""
    c = circuits.compile_circuit(write_cnf(tmp_path / "t.cnf", 4, [[1, -1]]), cache_dir=tmp_path)
    assert c.layout.model_count() == 16
    r = torch.randn(2, 4, dtype=torch.float64)
    torch.testing.assert_close(c.marginals(r), torch.sigmoid(r))
