"""Every instruction set's build of the kernels' C library against the torch oracle, and the fallback.

``circuits.kernels.build`` builds the library for one ISA: avx512 (-march=x86-64-v4), avx2
(x86-64-v3) or portable (x86-64-v2 on x86, the base architecture with NEON on Arm), the best the
CPU runs unless ``PROBMOE_NATIVE_ISA`` names another. Here each ISA this CPU runs (read from its
flags; the others are skipped) gets the library (the circuit passes, the row operations and the
cardinality DP) built once per session into the test cache, and each is checked on awkward inputs: -inf logits,
±1e4 logits, ties, T not a multiple of the tile, n = 1, 64 and 256, exactly-k, range-k and a group
constraint. Bit for bit where the C code is exact (the row operations, the uniforms, the MAP, the
DP's draws); the draws of the circuit passes from the same uniforms as the torch passes, but for
rounding at a boundary; log Z, the marginals and Cov(z) v within the tolerances of
test_c_passes.py and test_c_dp.py. Then the fallback: an unknown ISA name, an ISA the
CPU lacks, an unknown CPU and a missing compiler each give the torch code with exactly one warning;
a failed build's warning is one line and leaves no folder. Last, a prebuilt library (what a wheel
ships) loads without a compiler, and gives way to the first-use build when it does not match.
"""

import os
import shutil
import warnings

import pytest
import torch

import circuits
import circuits.kernels.select
from circuits import GroupLimited
from circuits.kernels import build, c_dp, library, straight_through
from circuits.kernels import rows as select
from circuits.kernels import torch_dp as dp
from circuits.kernels import torch_passes as kernels
from circuits.kernels import uniforms as native_uniforms
from circuits.kernels.c_passes import CPasses
from circuits.kernels.lattice import Lattice
from circuits.kernels.program import draw_uniforms
from circuits.kernels.rows import Rows
from circuits.kernels.torch_dp import TorchDP
from circuits.kernels.torch_passes import TorchPasses
from circuits.kernels.uniforms import seed_tensor

LIBS = {"kernels": library.LIBRARY}  # one library (the passes, the row operations, the DP)
CPU = torch.device("cpu")


@pytest.fixture(scope="module", params=build.ISAS)
def isa_libs(request):
    """(ISA, {name: its build}) for one ISA this CPU runs, built once per test session."""
    isa = request.param
    if os.environ.get("PROBMOE_NATIVE", "1") == "0" or build._compiler() is None:
        pytest.skip("the C code is turned off or there is no compiler")
    if isa not in build.runnable_isas():
        pytest.skip(f"this CPU does not run {isa} (it runs {', '.join(build.runnable_isas()) or 'none'})")
    return isa, {name: lib.variant(isa) for name, lib in LIBS.items()}


@pytest.fixture
def isa(isa_libs, monkeypatch):
    """The library points at the build of one ISA for one test."""
    name, libs = isa_libs
    for key, native in LIBS.items():
        monkeypatch.setattr(native, "state", {"lib": libs[key], "where": f"{name} build", "isa": name})
    return name


def awkward_logits(T: int, n: int, seed: int) -> torch.Tensor:
    """T x n logits with -inf entries, ±1e4 rows, ties and one dominant logit, among ordinary ones."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(T, n, generator=g) * 3
    q = max(T // 8, 1)
    r[0:q, : max(n // 4, 1) - (n == 1)] = -torch.inf  # never chosen (n = 1: nothing)
    r[q : 2 * q] = r[q : 2 * q].round()  # ties
    r[2 * q : 3 * q] += 1e4  # a big shift
    r[3 * q : 4 * q] -= 1e4
    r[4 * q : 5 * q, ::2] = 1e4  # ±1e4 within a row
    r[4 * q : 5 * q, 1::2] = -1e4
    r[5 * q : 6 * q, 0] = 30.0  # one dominant logit
    return r


SPECS = [
    circuits.ExactlyK(64, 8),
    circuits.RangeK(64, 4, 8),
    circuits.ExactlyK(256, 16),
    circuits.ExactlyK(1, 1),
    circuits.RangeK(1, 0, 1),
    GroupLimited(16, None, 4, 2, kmin=2, kmax=5),
]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_circuit_passes(isa, spec):
    c = circuits.compile_circuit(spec)
    prog, n = c.program, spec.n
    T = 300 if n < 256 else 130  # a partial last tile of 128 tokens
    r = c.shifted(awkward_logits(T, n, seed=n)) if isinstance(spec, circuits.ExactlyK) else awkward_logits(T, n, n)
    v = torch.randn(T, n, generator=torch.Generator().manual_seed(1))
    native = CPasses(prog)
    assert native.lib is library.LIBRARY.state["lib"]
    done, tiles = native.linear_tiles(r)
    assert done > 0 and (done < tiles or n == 1)  # the awkward rows' tiles on logarithms (n = 1: no awkward
    # value survives the shift), the last tile's linear upward
    log_z, m = native.log_partition(r, True)
    up = kernels.upward(prog, r)
    torch.testing.assert_close(log_z, up.val[-1], atol=1e-5, rtol=1e-5)
    finite = r.abs().amax(-1) < 100  # against float64 where fp32 rounding of ±1e4 logits does not dominate
    up64 = kernels.upward(prog, r.double())
    log_z64 = up64.val[-1].clone()  # (the passes' scratch holds up64's values)
    m64 = kernels.marginals_from_flows(prog, kernels.downward(prog, up64), torch.sigmoid(r.double()))
    torch.testing.assert_close(m.double()[finite], m64[finite], atol=2e-6, rtol=0)
    m32 = kernels.TorchPasses(prog).log_partition(r, True)[1]  # the oracle, tilted as the C passes are
    torch.testing.assert_close(m, m32, atol=2e-5, rtol=0)
    uniforms, fill = draw_uniforms(prog, r, torch.Generator().manual_seed(2))
    z, log_z2 = native.sample(r, uniforms, fill)
    z_ref, _ = kernels.TorchPasses(prog).sample(r, uniforms, fill)  # the oracle, tilted as the C passes are
    assert (z != z_ref).any(-1).sum() <= 1  # only rounding at a boundary may differ
    torch.testing.assert_close(log_z2, native.log_partition(r, True, accurate=False)[0], atol=0, rtol=0)
    torch.testing.assert_close(log_z.double(), log_z64, atol=1e-6, rtol=1e-6)  # pm_log_z: in double
    assert not z[0 : T // 8][r[0 : T // 8] == -torch.inf].any()
    z_map, best = native.map(r)
    up_max = kernels.max_upward(prog, r)
    z_map_ref = kernels.map_assignment(prog, r, up_max)
    ties = torch.zeros(T, dtype=torch.bool)
    ties[T // 8 : 2 * (T // 8)] = True  # tied logits: either maximum will do, with the same score
    assert torch.equal(z_map[~ties], z_map_ref[~ties])
    score = lambda z: torch.where(z > 0, r, 0.0).sum(-1)
    assert torch.equal(score(z_map)[ties], score(z_map_ref)[ties])
    torch.testing.assert_close(best, up_max.val[-1], atol=1e-5, rtol=1e-6)
    jvp = native.marginals_jvp(r, v)
    jvp64 = kernels.marginals_jvp(prog, r.double(), v.double())
    torch.testing.assert_close(jvp.double()[finite], jvp64[finite], atol=2e-5, rtol=0)
    torch.testing.assert_close(jvp, kernels.marginals_jvp(prog, r, v), atol=5e-5, rtol=0)


@pytest.mark.parametrize(
    "T,N,kmin,kmax", [(300, 64, 8, 8), (257, 64, 4, 8), (40, 256, 16, 16), (20, 1, 0, 1), (20, 1, 1, 1), (33, 7, 0, 7)]
)
def test_cardinality_dp(isa, T, N, kmin, kmax):
    r = awkward_logits(T, N, seed=N + kmin)
    v = torch.randn(T, N, generator=torch.Generator().manual_seed(3))
    done, tiles = c_dp.linear_tiles(r, kmin, kmax)
    assert 0 < done < tiles or tiles == 1  # the awkward rows' tiles on logarithms, the last one linear
    seed = torch.Generator().manual_seed(4)
    m, z = c_dp.forward_marginals(r, kmin, kmax, seed_tensor(seed), True)
    u = dp.up(r, kmin, kmax)  # the float32 torch DP: the same rounding of the tilted ±1e4 logits
    m_ref, z_ref = dp.down(u, u.band_probs(), 1, torch.Generator().manual_seed(4))
    torch.testing.assert_close(m, m_ref, atol=1e-5, rtol=0, equal_nan=True)
    assert torch.equal(z, z_ref[0])
    sizes = z.sum(-1)
    assert ((sizes >= kmin) & (sizes <= kmax)).all() and not z[r == -torch.inf].any()
    finite = r.abs().amax(-1) < 100
    u64 = dp.up(r.double(), kmin, kmax)
    m64, _ = dp.down(u64, u64.band_probs(), 1, torch.Generator().manual_seed(4))
    torch.testing.assert_close(m.double()[finite], m64[finite], atol=2e-5, rtol=0)  # the fp32 DP's own error
    cov = c_dp.cov_vec(r, v, kmin, kmax)
    torch.testing.assert_close(cov, dp.cov_vec(r, v, kmin, kmax), atol=1e-5, rtol=0, equal_nan=True)
    cov64 = dp.cov_vec(r.double(), v.double(), kmin, kmax)
    torch.testing.assert_close(cov.double()[finite], cov64[finite], atol=2e-5, rtol=0)


@pytest.mark.parametrize("kind", ["softmax", "sigmoid"])
def test_routing_backward_sends_nothing_to_dead_experts(isa, kind):
    """The routing operator's backward on each ISA: exactly 0 at -inf logits (the portable build's
    vectorised exp once left 1e-36 there), and the scores' backward as the plain-torch reference's."""
    r = awkward_logits(96, 64, seed=5)
    # without the ±1e4 rows: they move the scores' float32 rounding, which is not the question here
    r = r[torch.where(r > -torch.inf, r.abs(), 0).amax(-1) < 100]
    idx, _, mask = c_dp.chosen_scores(r, torch.softmax(r, -1), seed_tensor(torch.Generator().manual_seed(1)), 4, 8, 8)
    g = torch.randn(idx.shape, generator=torch.Generator().manual_seed(2))
    got = c_dp.chosen_scores_backward(r, idx, mask, g, 4, 8, kind == "sigmoid")
    dead = r == -torch.inf
    assert dead.any() and torch.equal(got[dead], torch.zeros_like(got[dead]))
    p = straight_through.scores(r.double(), kind)
    g_t = straight_through.slot_tangents(idx, mask, g.double(), p)
    want = straight_through.scores_backward(g_t, p, kind) + dp.cov_vec(r.double(), g_t, 4, 8)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("T,n,k", [(0, 4, 2), (1, 1, 1), (33, 10, 10), (300, 64, 8), (70, 256, 16), (65, 64, 57)])
def test_row_operations(isa, T, n, k):
    r = awkward_logits(T, n, seed=T + n).round(decimals=1) if T else torch.empty(0, n)
    if T > 3:
        r[3, :2] = torch.nan  # counts as -inf
        r[2, 0] = -0.0
    rows = circuits.kernels.select.select(Rows(CPU), torch.float32)  # the C row operations of this ISA's build
    assert rows.lib is rows.uniforms_lib is library.LIBRARY.state["lib"]
    assert torch.equal(rows.kth_largest(r, k), select.kth_largest_reference(r, k))
    values, indices = rows.topk(r, k)
    want_values, want_indices = select.topk_reference(r, k)
    assert torch.equal(values, want_values) and torch.equal(indices, want_indices)
    z = (r > 0.5).float()  # some rows choose more than k, some fewer
    x = torch.softmax(r.nan_to_num(0.0, 0.0, 0.0), -1) if T else r
    got, want = rows.topk_chosen(z, x, k), select.topk_chosen_reference(z, x, k)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    seed = torch.tensor(12345, dtype=torch.int64)
    got = rows.uniforms(seed, 3 * T * n + 5, CPU, torch.float32)
    assert torch.equal(got, native_uniforms.reference(seed, 0, 3 * T * n + 5))


def test_the_isas_this_cpu_runs(monkeypatch):
    """Decided from the CPU's flags: x86-64-v4 for avx512, v3 for avx2; portable always."""
    v3 = {
        "cx16",
        "lahf_lm",
        "popcnt",
        "pni",
        "sse4_1",
        "sse4_2",
        "ssse3",
        "avx",
        "avx2",
        "bmi1",
        "bmi2",
        "f16c",
        "fma",
        "abm",
        "movbe",
        "xsave",
    }
    monkeypatch.setattr(build, "X86", True)
    monkeypatch.setattr(build, "ARM", False)
    monkeypatch.setattr(build, "_cpu_flags", lambda: v3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})
    assert build.runnable_isas() == ["avx512", "avx2", "portable"]
    monkeypatch.setattr(build, "_cpu_flags", lambda: v3)
    assert build.runnable_isas() == ["avx2", "portable"] and build.best_isa() == "avx2"
    assert build.isa_flags("avx2")[0] == "-march=x86-64-v3"
    monkeypatch.setattr(build, "_cpu_flags", lambda: v3 - {"fma"})
    assert build.runnable_isas() == ["portable"]
    monkeypatch.setattr(build, "X86", False)
    monkeypatch.setattr(build, "ARM", True)
    assert build.runnable_isas() == ["portable"] and build.isa_flags("portable") == []
    monkeypatch.setattr(build, "ARM", False)
    assert build.runnable_isas() == [] and build.best_isa() is None


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """The library undecided, with a private cache and the C code on."""
    monkeypatch.setenv("PROBMOE_CACHE", str(tmp_path))
    monkeypatch.delenv("PROBMOE_NATIVE", raising=False)
    monkeypatch.delenv("PROBMOE_NATIVE_ISA", raising=False)
    for native in LIBS.values():
        monkeypatch.setattr(native, "state", {})
    return tmp_path


def falls_back_with_one_warning(match: str) -> None:
    """The library: library() is None after exactly one RuntimeWarning, and the torch code runs."""
    for native in LIBS.values():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert native.library() is None
            assert native.library() is None  # decided once: no second warning
        assert [str(w.message) for w in caught if w.category is RuntimeWarning and match in str(w.message)] == [
            str(w.message) for w in caught
        ], caught
        assert len(caught) == 1, [str(w.message) for w in caught]
        assert "using the torch code" in str(caught[0].message) and native.isa() is None
    assert circuits.kernels.select.describe().startswith("torch passes (C kernels unavailable: ")
    c = circuits.compile_circuit(circuits.RangeK(6, 2, 4))
    assert isinstance(circuits.kernels.select.select(c.program, torch.float32), TorchPasses)
    r = torch.randn(5, 6)
    assert isinstance(circuits.kernels.select.select(Lattice(6, 2, 4, r.device), r.dtype), TorchDP)
    assert torch.isfinite(c.marginals(r)).all()
    rows = circuits.kernels.select.select(Rows(CPU), r.dtype)
    assert rows.lib is None and torch.equal(rows.kth_largest(r, 2), select.kth_largest_reference(r, 2))


@pytest.mark.parametrize("name", ["sse9", "neon512"])
def test_an_unknown_isa_name_falls_back(fresh, monkeypatch, name):
    monkeypatch.setenv("PROBMOE_NATIVE_ISA", name)
    falls_back_with_one_warning(f"PROBMOE_NATIVE_ISA={name!r} is not one of")


def test_an_isa_the_cpu_lacks_falls_back(fresh, monkeypatch):
    monkeypatch.setattr(build, "runnable_isas", lambda: ["portable"])  # as on a CPU without AVX2
    monkeypatch.setenv("PROBMOE_NATIVE_ISA", "avx2")
    falls_back_with_one_warning("this CPU runs only portable")


def test_an_unknown_cpu_falls_back(fresh, monkeypatch):
    monkeypatch.setattr(build, "X86", False)
    monkeypatch.setattr(build, "ARM", False)
    falls_back_with_one_warning("unknown CPU")


def test_no_compiler_falls_back(fresh, monkeypatch):
    monkeypatch.setenv("CC", str(fresh / "no-such-cc"))
    falls_back_with_one_warning("no-such-cc")


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
@pytest.mark.skipif(shutil.which("cc") is None or os.environ.get("PROBMOE_NATIVE") == "0", reason="needs cc")
def test_the_isa_is_chosen_and_named_in_the_build_key(fresh, monkeypatch):
    """By default the best ISA the CPU runs; PROBMOE_NATIVE_ISA picks another; each its own build."""
    best = build.best_isa()
    assert library.LIBRARY.isa() == best and f"/native/{best}-" in library.describe()
    monkeypatch.setenv("PROBMOE_NATIVE_ISA", "portable")
    monkeypatch.setattr(library.LIBRARY, "state", {})
    assert library.LIBRARY.isa() == "portable" and "/native/portable-" in library.describe()
    assert library.LIBRARY.path("cc", "portable") != library.LIBRARY.path("cc", best) or best == "portable"


UNIT = "int pm_unit(void) { return 42; }\n"


def unit_library(folder, text=UNIT, prebuilt=None) -> build.NativeLibrary:
    """A one-function library of its own (quick to build), its source ``folder/unit.c``."""
    src = folder / "unit.c"
    src.write_text(text)
    return build.NativeLibrary("unit", [src], lambda lib: lib.pm_unit, fast_math=None, prebuilt=prebuilt)


needs_cc = pytest.mark.skipif(
    shutil.which("cc") is None or os.environ.get("PROBMOE_NATIVE") == "0", reason="needs cc and the C code on"
)


@needs_cc
def test_a_failed_build_warns_one_line_and_leaves_no_folder(fresh, monkeypatch):
    """The warning names the compiler's first error and the log that holds the whole output, not the
    command line; the build folder it made is gone."""
    monkeypatch.setenv("PROBMOE_NATIVE_ISA", "portable")
    lib = unit_library(fresh, "int pm_unit(void) { return undeclared_name; }\n")
    with pytest.warns(RuntimeWarning) as caught:
        assert lib.library() is None
    (message,) = [str(w.message) for w in caught]
    assert "\n" not in message and "-march" not in message and "-fopenmp" not in message, message
    assert "error: " in message and "undeclared_name" in message, message
    log = build.build_dir() / (lib.path(shutil.which("cc"), "portable").parent.name + ".log")
    assert f"(full log: {log})" in message and "-fopenmp" in log.read_text() and "undeclared_name" in log.read_text()
    assert [p.name for p in build.build_dir().iterdir()] == [log.name]  # no empty <isa>-<hash>/ folder
    assert lib.describe().startswith("C library unavailable: cc failed: ")


@needs_cc
def test_a_prebuilt_library_loads_without_a_compiler(fresh, monkeypatch):
    """What a wheel ships (``ship``: each ISA built for any CPU of it) is loaded first, with no compiler;
    one whose sources changed, or that is damaged, gives way to the first-use build."""
    monkeypatch.setenv("PROBMOE_NATIVE_ISA", "portable")
    shipped = fresh / "prebuilt"
    (fresh / "src").mkdir()
    built = unit_library(fresh / "src").ship(shipped, shutil.which("cc"), isas=("portable",))
    assert built == [shipped / "portable" / "libunit.so"]
    facts = (shipped / "portable" / "libunit.json").read_text()
    assert "-mtune=native" not in facts and ("-march=x86-64-v2" in facts or not build.X86)
    monkeypatch.setenv("CC", "false")  # a compiler that fails at anything
    lib = unit_library(fresh / "src", prebuilt=shipped)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lib.library().pm_unit() == 42
    assert lib.describe() == str(shipped / "portable" / "libunit.so") and not build.build_dir().exists()
    changed = unit_library(fresh / "src", UNIT.replace("42", "43"), prebuilt=shipped)
    assert changed.prebuilt_path("portable") is None
    with pytest.warns(RuntimeWarning, match="false failed"):  # the fallback: built on first use, here by `false`
        assert changed.library() is None
    # damaged as a new file in its place: this process has the old one mapped, and writing over it in
    # place would truncate that mapping (SIGBUS at exit, when the library's pages are touched again)
    (shipped / "portable" / "libunit.so.new").write_bytes(b"damaged")
    os.replace(shipped / "portable" / "libunit.so.new", shipped / "portable" / "libunit.so")
    monkeypatch.setenv("CC", shutil.which("cc"))
    damaged = unit_library(fresh / "src", prebuilt=shipped)
    assert damaged.library().pm_unit() == 42 and damaged.describe().startswith(str(build.build_dir()))
