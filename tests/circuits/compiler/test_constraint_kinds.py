"""A constraint kind is one module plus its registration (issue 40, point 5).

``AtMostK`` below is a new kind written and registered in this file only, from the library's public
pieces (``circuits.spec.Spec`` and ``register``, the builders in ``circuits.compiler.count_tree`` /
``circuits.compiler.groups``, the arithmetic in ``circuits.compiler.estimate``, the checks in ``circuits.compiler.self_check``):
it compiles with both of its compilers, caches, loads from the cache, estimates, describes itself in
``probmoe-compile``'s report (reached by ``--spec``) and matches brute force, with no library file
touched. The library's
own kinds keep their cache keys, JSON forms and manifests byte for byte (existing caches stay
valid), and the modules that dispatch on kinds ask no kind for its type.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from brute import exact, masks
from pysdd.sdd import SddManager, Vtree

import circuits
from circuits import checks
from circuits.compiler import cache, count_tree, estimate, groups, registry, self_check
from circuits.compiler.cache import CacheWarning
from circuits.compiler.compile import compile_entry
from circuits.inspect import cli, report
from circuits.spec import Spec, register

ROOT = Path(__file__).resolve().parents[3]  # the repository


@dataclass(frozen=True)
class AtMostK(Spec):
    """At most ``k`` of ``n`` variables are true (1 <= n, 0 <= k <= n): a kind added by a user."""

    n: int
    k: int

    compilers = ("direct", "pysdd")
    dict_fields = ("n", "k")

    def __post_init__(self):
        object.__setattr__(self, "n", checks.integer("n", self.n, 1, None))
        object.__setattr__(self, "k", checks.integer("k", self.k, 0, self.n, hi_name="n"))

    @property
    def key(self) -> str:
        return f"atmost-n{self.n}-k{self.k}"

    @property
    def cardinalities(self) -> range:
        return range(self.k + 1)

    def describe(self) -> str:
        return f"AtMostK(n={self.n}, k={self.k})"

    def model_count(self) -> int:
        return sum(math.comb(self.n, j) for j in self.cardinalities)

    def count_formula(self) -> str:
        return f"sum of C({self.n}, j) for j in 0..{self.k}"

    def estimate(self) -> estimate.Estimate:
        t = estimate.count_tree_sizes(self.n, self.k)
        levels = estimate.depth(self.n) + 1
        return estimate.pysdd_estimate(
            t.built_nodes + 1, t.built_elements + 1, levels, t.built_elements, t.state_steps, False
        )

    def build_direct(self, progress=None):
        return count_tree.interval_layout(self.n, 0, self.k, progress)

    def build_sdd(self, progress=None):
        mgr = SddManager.from_vtree(
            Vtree(var_count=self.n, var_order=list(range(1, self.n + 1)), vtree_type="balanced")
        )
        mgr.auto_gc_and_minimize_off()
        root = mgr.false()
        for node in groups.exactly_counts(mgr, mgr.vtree(), self.k, progress):
            root = root | node
        return mgr, root

    def check(self, layout, entry, compiler) -> None:
        r = self_check.probe_logits(layout.n)
        want = self_check.cardinality_log_partition(r, 0, self.k)
        self_check.agree(self_check.layout_log_partition(layout, r), want)


@pytest.fixture
def atmost(monkeypatch):
    """AtMostK registered for one test (the registry as it was afterwards)."""
    monkeypatch.setattr(registry, "KINDS", dict(registry.KINDS))
    return register(AtMostK)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("compiler", [None, "pysdd"])
@pytest.mark.parametrize("n,k", [(1, 0), (1, 1), (7, 3), (10, 4), (9, 9)])
def test_a_new_kind_compiles_caches_and_matches_brute_force(atmost, tmp_path, compiler, n, k):
    spec = atmost(n, k)
    c = circuits.compile_circuit(spec, cache_dir=tmp_path, compiler=compiler)
    assert not c.info["cache_hit"] and c.info["compiler"] == (compiler or "direct")
    allowed = masks(n, range(k + 1))  # [M, n]: every assignment with at most k ones
    assert c.info["model_count"] == str(len(allowed)) == str(spec.model_count())
    r = torch.randn(5, n, generator=torch.Generator().manual_seed(n + k), dtype=torch.float64) * 1.5
    want = exact(r, allowed)
    torch.testing.assert_close(c.log_partition(r), want.log_partition, atol=1e-10, rtol=0)
    torch.testing.assert_close(c.marginals(r), want.marginals, atol=1e-10, rtol=0)
    assert torch.equal(c.map(r), want.map)

    hit = circuits.compile_circuit(atmost(n, k), cache_dir=tmp_path, compiler=compiler)
    entry = tmp_path / (spec.key if compiler is None else f"{spec.key}-{compiler}")
    assert hit.info["cache_hit"] and hit.info["cache_path"] == str(entry)
    assert (hit.layout.children == c.layout.children).all()
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["spec"] == {"type": "AtMostK", "n": n, "k": k} == circuits.spec_to_dict(spec)
    assert manifest["describe"] == f"AtMostK(n={n}, k={k})" and manifest["vtree"] == "balanced"
    assert circuits.spec_from_dict(manifest["spec"]) == spec


def test_a_new_kind_estimates_and_is_refused_past_the_limit(atmost, tmp_path):
    spec = atmost(40, 6)
    est = estimate.estimate(spec)
    layout = compile_entry(spec, cache_dir=tmp_path).layout
    assert layout.sizes()["elements"] <= est.elements and layout.sizes()["nodes"] <= 2 * est.nodes
    assert est.steps == estimate.DIRECT_STEPS_PER_ELEMENT * est.elements  # the direct compiler's cost
    assert estimate.estimate(spec, "pysdd").steps > est.steps
    with pytest.raises(estimate.CircuitTooLarge, match=r"AtMostK\(n=100000, k=50000\) is too large"):
        compile_entry(atmost(100000, 50000), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="compiler must be one of 'direct', 'pysdd' for AtMostK"):
        compile_entry(spec, cache_dir=tmp_path, compiler="d4")


def test_a_new_kind_describes_itself_in_the_report(atmost, tmp_path):
    entry = compile_entry(atmost(12, 2), cache_dir=tmp_path)
    facts = report.compile_facts(entry)
    assert facts["spec"] == {"type": "AtMostK", "n": 12, "k": 2, "describe": "AtMostK(n=12, k=2)"}
    assert facts["model_count"] == str(1 + 12 + 66) and facts["model_count_checked"]
    text = report.render_compile(facts)
    assert "compiled AtMostK(n=12, k=2)" in text
    assert "79 = sum of C(12, j) for j in 0..2, checked against math.comb" in text


def test_a_new_kind_from_the_commands(atmost, tmp_path, capsys):
    """probmoe-compile and probmoe-inspect reach it by --spec, its JSON form (in process: the kind is
    registered here)."""
    args = ["--spec", '{"type": "AtMostK", "n": 9, "k": 2}', "--cache-dir", str(tmp_path)]
    assert cli.compile_main([*args, "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["spec"]["describe"] == "AtMostK(n=9, k=2)" and facts["model_count"] == str(1 + 9 + 36)
    assert facts["cache_path"] == str(tmp_path / "atmost-n9-k2")
    assert cli.inspect_main(args) == 0
    assert "AtMostK(n=9, k=2)" in capsys.readouterr().out


def test_a_new_kinds_check_guards_its_cache_entries(atmost, tmp_path, monkeypatch):
    spec = atmost(8, 3)
    compile_entry(spec, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="computes the wrong function"):
        spec.check(compile_entry(atmost(8, 2), cache_dir=tmp_path).layout, None, "direct")

    def wrong(self, layout, entry, compiler):
        raise ValueError("the layout computes the wrong function (test)")

    monkeypatch.setattr(AtMostK, "check", wrong)
    with pytest.warns(CacheWarning, match="is invalid"), pytest.raises(ValueError, match="wrong function"):
        compile_entry(spec, cache_dir=tmp_path)  # the entry fails its check on read, the recompile too


def test_the_registry_refuses_what_is_not_a_kind(atmost, tmp_path):
    assert register(AtMostK) is AtMostK  # registering again is a no-op

    @dataclass(frozen=True)
    class ExactlyK(AtMostK):
        pass

    with pytest.raises(ValueError, match="a constraint kind named ExactlyK is already registered"):
        register(ExactlyK)
    with pytest.raises(TypeError, match="must be a subclass of circuits.spec.Spec"):
        register(dict)

    @dataclass(frozen=True)
    class Unregistered(AtMostK):
        pass

    with pytest.raises(ValueError, match="spec must be ExactlyK, .*GroupCapacity, AtMostK, a DIMACS file path"):
        compile_entry(Unregistered(4, 2), cache_dir=tmp_path)
    with pytest.raises(TypeError, match="spec must be"):
        estimate.estimate(Unregistered(4, 2))
    with pytest.raises(ValueError, match=r"type must be one of \['ExactlyK', .*'AtMostK'\]"):
        circuits.spec_from_dict({"type": "Unregistered", "n": 4, "k": 2})


def test_no_module_asks_a_kind_for_its_type():
    """compile, estimate, cache and inspect dispatch through the kinds' methods, never isinstance."""
    from circuits.compiler import compile as compile_module

    kinds = "|".join(["Spec", "SPECS", *registry.KINDS])
    for module in (compile_module, estimate, cache, report, cli, self_check, count_tree, groups):
        source = inspect.getsource(module)
        assert not re.search(rf"isinstance\([^)]*\b({kinds})\b", source), module.__name__


def test_the_kinds_load_no_torch():
    """The specs, their modules and the registry import without torch (compiling needs none)."""
    code = (
        "import sys, circuits.spec, circuits.compiler.registry, circuits.compiler.kinds.cardinality, circuits.compiler.kinds.grouped, "
        "circuits.compiler.kinds.files; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


FILES = {"f.cnf": "p cnf 4 3\n1 2 0\n-1 3 0\n2 -4 0\n"}
BEFORE = [  # (spec, key, JSON form) as the library wrote them before the kinds had their own modules
    (circuits.ExactlyK(64, 8), "exactly-n64-k8", {"type": "ExactlyK", "n": 64, "k": 8}),
    (circuits.RangeK(64, 4, 8), "range-n64-k4-8", {"type": "RangeK", "n": 64, "kmin": 4, "kmax": 8}),
    (
        circuits.GroupLimited(64, 8, 8, 3),
        "grouplimited-n64-k8-8-g8x8-m3-c8",
        {"type": "GroupLimited", "n": 64, "kmin": 8, "kmax": 8, "groups": [8] * 8, "max_groups": 3, "capacity": 8},
    ),
    (
        circuits.GroupCapacity(48, None, [8, 16, 4, 20], 3, kmin=2, kmax=9),
        "groupcapacity-n48-k2-9-g8.16.4.20-m4-c3",
        {
            "type": "GroupCapacity",
            "n": 48,
            "kmin": 2,
            "kmax": 9,
            "groups": [8, 16, 4, 20],
            "max_groups": 4,
            "capacity": 3,
        },
    ),
    (
        circuits.GroupLimited(200, 3, [1] * 200, 3),
        "grouplimited-n200-k3-3-g200x1-m3-c1",
        {"type": "GroupLimited", "n": 200, "kmin": 3, "kmax": 3, "groups": [1] * 200, "max_groups": 3, "capacity": 1},
    ),
]


def test_the_librarys_kinds_keep_their_keys_and_forms(tmp_path):
    """Existing cache entries stay valid: keys, JSON forms and manifest fields as before."""
    path = tmp_path / "f.cnf"
    path.write_text(FILES["f.cnf"])
    cnf = circuits.CnfFile(str(path))
    specs = [*BEFORE, (cnf, "cnf-96151b1279d495144e6d", {"type": "CnfFile", "digest": "96151b1279d495144e6d"})]
    for spec, key, form in specs:
        assert spec.key == key and json.dumps(circuits.spec_to_dict(spec)) == json.dumps(form)
    entry = compile_entry(circuits.ExactlyK(6, 2), cache_dir=tmp_path)
    manifest = json.loads((tmp_path / "exactly-n6-k2" / "manifest.json").read_text())
    assert list(manifest) == [
        *("format_version", "spec", "describe", "vtree", "sizes", "model_count", "log_model_count"),
        *("compiler", "compile_seconds", "sha256"),
    ]
    assert manifest["format_version"] == 3 and manifest["vtree"] == "balanced" and entry.info["compiler"] == "direct"
    grouped = compile_entry(circuits.GroupLimited(8, 2, 4, 2), cache_dir=tmp_path, compiler="pysdd").info
    assert grouped["vtree"] == "grouped" and list(grouped)[:8] == [
        *("format_version", "spec", "describe", "vtree", "sizes", "model_count", "log_model_count", "compiler"),
    ]
    assert np.isclose(grouped["log_model_count"], math.log(circuits.GroupLimited(8, 2, 4, 2).model_count()))


@pytest.mark.usefixtures("float64")
def test_a_new_kind_routes_as_a_bare_spec(atmost, tmp_path, monkeypatch):
    """probmoe takes any registered kind as it takes the library's: the distribution's marginals are
    brute force's, every draw and the mode obey it; routing checks it by the subset sizes it allows."""
    import probmoe

    monkeypatch.setenv("PROBMOE_CACHE", str(tmp_path))
    n, k = 8, 3
    r = torch.randn(4, n, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    d = probmoe.SubsetDistribution(r, constraint=atmost(n, k))
    want = exact(r, masks(n, range(k + 1)))
    torch.testing.assert_close(d.mean, want.marginals, atol=1e-10, rtol=0)
    assert torch.equal(d.mode, want.map)
    draws = d.sample((200,), generator=torch.Generator().manual_seed(0))
    assert int(draws.sum(-1).max()) <= k
    # routing checks the kind by what it allows: at most k admits no expert at all, which routing refuses
    with pytest.raises(ValueError, match=r"AtMostK\(n=8, k=3\) allows subsets of 0 experts; routing needs at least 1"):
        probmoe.route(r, constraint=atmost(n, k), training=True)
