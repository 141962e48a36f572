"""Beyond cardinality: any CNF (DIMACS) or pysdd SDD file runs on the same evaluator and cache."""

import itertools
import warnings

import pytest
import torch
from brute import exact
from pysdd.sdd import SddManager, Vtree
from stats import chi2_pvalue, mask_counts

import circuits

pytestmark = pytest.mark.usefixtures("float64")  # 1e-9 tolerances need float64 defaults

# (x1 or x2) and (not x1 or x3) and (x2 or not x4 or x5) and (not x3 or not x5); x6 is unconstrained
CLAUSES = [[1, 2], [-1, 3], [2, -4, 5], [-3, -5]]
N = 6


def _models(n, clauses):
    rows = [
        m
        for m in itertools.product((0.0, 1.0), repeat=n)
        if all(any((m[abs(l) - 1] == 1.0) == (l > 0) for l in c) for c in clauses)
    ]
    return torch.tensor(rows)


@pytest.fixture
def cnf_file(tmp_path):
    path = tmp_path / "f.cnf"
    path.write_text(
        f"c a small test formula\np cnf {N} {len(CLAUSES)}\n" + "".join(" ".join(map(str, c)) + " 0\n" for c in CLAUSES)
    )
    return path


def _check_all(c, allowed, r):
    want = exact(r, allowed)
    torch.testing.assert_close(c.log_partition(r), want.log_partition, atol=1e-10, rtol=0)
    torch.testing.assert_close(c.marginals(r), want.marginals, atol=1e-10, rtol=0)
    assert torch.equal(c.map(r), want.map)
    jac = torch.autograd.functional.jacobian(c.marginals, r[0])
    torch.testing.assert_close(jac, want.cov[0], atol=1e-10, rtol=0)
    draws = c.sample(r[0].expand(100_000, -1), generator=torch.Generator().manual_seed(3))
    assert chi2_pvalue(mask_counts(draws, allowed), want.probs[0]) > 1e-3


def test_cnf_file(cnf_file, tmp_path):
    c = circuits.compile_circuit(cnf_file, cache_dir=tmp_path / "cache")
    allowed = _models(N, CLAUSES)
    assert c.layout.model_count() == len(allowed)
    _check_all(c, allowed, torch.randn(5, N) * 1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid file entry must load without complaint
        hit = circuits.compile_circuit(circuits.CnfFile(str(cnf_file)), cache_dir=tmp_path / "cache")
    assert hit.info["cache_hit"]


def test_sdd_file_with_a_right_linear_vtree(tmp_path):
    vtree = Vtree(var_count=N, var_order=[3, 1, 6, 2, 5, 4], vtree_type="right")
    mgr = SddManager.from_vtree(vtree)
    x = [None] + [mgr.literal(i) for i in range(1, N + 1)]
    f = (x[1] | x[2]) & (~x[1] | x[3]) & (x[2] | ~x[4] | x[5]) & (~x[3] | ~x[5])
    mgr.save(str(tmp_path / "f.sdd").encode(), f)
    mgr.vtree().save(str(tmp_path / "f.vtree").encode())
    c = circuits.compile_circuit((tmp_path / "f.sdd", tmp_path / "f.vtree"), cache_dir=tmp_path / "cache")
    _check_all(c, _models(N, CLAUSES), torch.randn(5, N) * 1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = circuits.compile_circuit(
            circuits.SddFile(str(tmp_path / "f.sdd"), str(tmp_path / "f.vtree")), cache_dir=tmp_path / "cache"
        )
    assert again.info["cache_hit"]


def test_cached_sdd_of_a_range_roundtrips(tmp_path):
    spec = circuits.RangeK(9, 2, 5)
    first = circuits.compile_circuit(spec, cache_dir=tmp_path, compiler="pysdd")  # its entry keeps the SDD
    entry = tmp_path / f"{spec.key}-pysdd"
    c = circuits.compile_circuit(
        circuits.SddFile(str(entry / "circuit.sdd"), str(entry / "circuit.vtree")), cache_dir=tmp_path
    )
    r = torch.randn(4, 9)
    torch.testing.assert_close(c.marginals(r), first.marginals(r))


def test_unsatisfiable_and_missing_files(tmp_path):
    bad = tmp_path / "unsat.cnf"
    bad.write_text("p cnf 1 2\n1 0\n-1 0\n")
    with pytest.raises(ValueError, match="unsatisfiable"):
        circuits.compile_circuit(bad, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="path must be an existing"):
        circuits.CnfFile(str(tmp_path / "nope.cnf"))
    with pytest.raises(ValueError, match="vtree must be an existing"):
        circuits.SddFile(str(bad), str(tmp_path / "nope.vtree"))


@pytest.mark.parametrize(
    "text,message",
    [
        ("garbage\n", "before the 'p cnf' header"),
        ("p cnf 2 1\n1 x 0\n", "expected integers"),
        ("p cnf 2 1\n1 5 0\n", r"literal 5 is outside \[-2, 2\]"),
        ("p cnf 3 3\n1 2 0\n-1 3 0\n", "declares 3 clauses, the file has 2"),
        ("p cnf 3 1\n1 2 0\n-1 3 0\n", "declares 1 clauses, the file has 2"),  # libsdd would drop one
        ("p cnf 3 2\n1 2 0\n-1 3\n", "does not end in 0"),
        ("1 2 0\n", "before the 'p cnf' header"),
        ("c only a comment\n", "no 'p cnf"),
        ("p cnf 0 0\n", "VARIABLES >= 1"),
    ],
)
def test_bad_dimacs_raises_instead_of_killing_the_process(tmp_path, text, message):
    bad = tmp_path / "bad.cnf"
    bad.write_text(text)
    with pytest.raises(ValueError, match=message):
        circuits.compile_circuit(bad, cache_dir=tmp_path / "cache")


def test_dimacs_variants_libsdd_accepts(tmp_path):
    ok = tmp_path / "ok.cnf"
    ok.write_text("c x\np  cnf  3  2\n1 2\n 0 -1 3 0\n%\n0\n")  # clause over two lines, SATLIB tail
    c = circuits.compile_circuit(ok, cache_dir=tmp_path / "cache")
    assert c.layout.model_count() == 4


def _saved_pair(tmp_path, name, vtree_type, order, build):
    mgr = SddManager.from_vtree(Vtree(var_count=len(order), var_order=order, vtree_type=vtree_type))
    node = build(mgr)
    mgr.save(str(tmp_path / f"{name}.sdd").encode(), node)
    mgr.vtree().save(str(tmp_path / f"{name}.vtree").encode())
    return tmp_path / f"{name}.sdd", tmp_path / f"{name}.vtree"


def test_bad_sdd_files_raise_instead_of_crashing(tmp_path):
    sdd, _ = _saved_pair(
        tmp_path, "a", "balanced", [1, 2, 3, 4], lambda m: (m.literal(1) | m.literal(2)) & m.literal(4)
    )
    _, other = _saved_pair(tmp_path, "b", "right", [4, 3, 2, 1], lambda m: m.literal(1) & m.literal(3))
    with pytest.raises(ValueError, match="wrong vtree file"):
        circuits.compile_circuit((sdd, other), cache_dir=tmp_path / "cache")
    garbage = tmp_path / "g.sdd"
    garbage.write_text("this is not an sdd\n")
    with pytest.raises(ValueError, match="expected the header 'sdd NODES'"):
        circuits.compile_circuit((garbage, other), cache_dir=tmp_path / "cache")
    bad_vtree = tmp_path / "g.vtree"
    bad_vtree.write_text("vtree 3\nL 0 1\nL 2 5\nI 1 0 2\n")
    with pytest.raises(ValueError, match="variables 1..2"):
        circuits.compile_circuit((sdd, bad_vtree), cache_dir=tmp_path / "cache")
