"""How big a circuit will be and how long it will take to compile, before compiling it.

Pure arithmetic on the spec (no pysdd, microseconds for any n), so that ``compile_circuit`` and the
commands can refuse a size that cannot finish (``check``) and show progress on a long one.

The compiler (``circuits.compile``, ``circuits.groups``) builds "exactly j of this block" states
bottom-up over a balanced vtree, counts capped at ``cap``: a vtree node of m = l + r variables holds
the states j = 0..min(m, cap), and state j ORs f_j conjunctions Eq(left, a) AND Eq(right, j - a),
one per a with 0 <= a <= min(l, cap), 0 <= j - a <= min(r, cap). A balanced vtree has at most two
block sizes per depth, so every sum below is O(log n) closed-form terms.

``Estimate`` fields, per spec kind:

- ``ExactlyK``: ``nodes``, ``elements`` (live ones) and ``levels`` of the layout, exactly (the
  states reachable from the root: j >= k - (n - m)); ``exact`` is True.
- ``RangeK``: the count tree capped at kmax. ``elements`` and ``levels`` are upper bounds of the
  layout's; the layout has at most 2x ``nodes`` (the band's OR adds interval nodes; a band that is
  almost TRUE leaves far fewer).
- ``GroupLimited`` / ``GroupCapacity``: the count trees inside the groups plus the (count, nonempty
  groups) states above them, bounded as if the two counts were independent: upper bounds of the
  layout's elements and levels, at most 2x the nodes, on every spec of the test grids but three
  with a band (kmin < kmax) and a capacity, whose interval nodes pass the element figure by up to
  12% (GroupCapacity(48, groups [8, 16, 4, 20], capacity 3, kmin 2, kmax 9): 393 against 350).
  Within ~3x in elements for groups of 8 or more variables; loose (100x and more) for groups of
  one or two variables with a group limit, where the count and the number of nonempty groups move
  together.
- ``SddFile`` / ``CnfFile``: no estimate (``estimate`` returns None, ``check`` passes). An SDD file
  is read as it is, in time linear in the file, and its layout is at most the file's decision
  nodes; the SDD of a CNF depends on the formula (exponential in the worst case) and cannot be told
  by arithmetic.

``steps`` is the compile cost, per compiler (``circuits.compile``), in units of about 1 us on an
AMD EPYC (2 cores, shared; docs/circuits.md lists the runs):

- "direct" (the default, ``circuits.count_tree``): every live element is built once, straight into
  the layout, then checked and written: steps = ``DIRECT_STEPS_PER_ELEMENT`` * elements; for the
  group specs plus ``SCAN_STEPS`` per (state, state of its left child) pair the builder looks at
  (``scan``: a state's elements are found by trying every left state).
- "pysdd": OR-ing f terms into a state rebuilds it once per term (~f^2 element operations), and
  the layout, its checks and the cache files cost ~30 per built element; so steps = sum over the
  built states of f^2 + 30 * built elements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .spec import GROUP_SPECS, CnfFile, ExactlyK, RangeK, SddFile

MAX_STEPS = 20_000_000  # compile_circuit refuses more (about 20 s on the reference machine)
PROGRESS_STEPS = 1_000_000  # compile_circuit shows progress bars above this (about a second)
SECONDS_PER_STEP = 1e-6  # reference machine: AMD EPYC, 2 cores (docs/circuits.md)
LAYOUT_STEPS_PER_ELEMENT = 30  # pysdd: build_layout, the checks and the cache files, per built element
DIRECT_STEPS_PER_ELEMENT = 4  # direct: building, placing, checking and writing one element
SCAN_STEPS = 1  # direct, group specs: per (state, left state) pair looked at


@dataclass(frozen=True)
class Estimate:
    """Sizes of a spec's layout and the cost of compiling it; see the module docstring for which are
    exact and which are bounds.

    nodes: decision nodes of the layout (counting its synthetic root).
    elements: live elements of the layout (counting the synthetic root's one).
    levels: heights of the layout (the synthetic root's included).
    built_elements: conjunctions the compiler builds (every capped state, reachable or not).
    state_steps: sum over the built states of (terms OR-ed)^2: the pysdd part of its ``steps``.
    steps: the compile cost of the compiler asked for (module docstring).
    exact: nodes, elements and levels are exact (ExactlyK) rather than bounds.
    """

    nodes: int
    elements: int
    levels: int
    built_elements: int
    state_steps: int
    steps: int
    exact: bool
    scan: int = 0  # group specs: (state, left state) pairs the direct builder looks at

    @property
    def seconds(self) -> float:
        """Rough compile seconds on the reference machine (AMD EPYC, 2 cores)."""
        return self.steps * SECONDS_PER_STEP


class CircuitTooLarge(ValueError):
    """A spec whose estimated compile cost passes the limit. ``summary`` says what and by how much,
    without the way to insist (the library and the commands each add their own)."""

    def __init__(self, summary: str, insist: str, estimate: Estimate, limit: int):
        super().__init__(f"{summary}; {insist}")
        self.summary, self.estimate, self.limit = summary, estimate, limit


def _tri(x: int) -> int:
    """Pairs (a, b) of integers >= 0 with a + b <= x."""
    return (x + 1) * (x + 2) // 2 if x >= 0 else 0


def _pairs(A: int, B: int, lo: int, hi: int) -> int:
    """Pairs (a, b) in [0, A] x [0, B] with lo <= a + b <= hi (inclusion-exclusion on the box)."""

    def upto(x: int) -> int:
        return _tri(x) - _tri(x - A - 1) - _tri(x - B - 1) + _tri(x - A - B - 2)

    return upto(hi) - upto(lo - 1) if hi >= lo else 0


def _squares(lo: int, hi: int) -> int:
    """lo^2 + ... + hi^2 (0 when hi < lo); 0 <= lo."""

    def upto(x: int) -> int:
        return x * (x + 1) * (2 * x + 1) // 6 if x > 0 else 0

    return upto(hi) - upto(lo - 1) if hi >= lo else 0


def _terms_squared(A: int, B: int, J: int) -> int:
    """Sum over j = 0..J of f_j^2, f_j = #{a in [0, A] : 0 <= j - a <= B} (1, 2, .., S+1, S+1, ..,
    S+1, S, .., 1 with S = min(A, B)); J <= A + B."""
    S, T = min(A, B), max(A, B)
    rising = _squares(1, min(S, J) + 1)
    flat = max(0, min(T, J) - S) * (S + 1) ** 2
    falling = _squares(A + B - J + 1, S) if J > T else 0
    return rising + flat + falling


def _block_sizes(n: int):
    """(block size m, how many vtree nodes of that size) over a balanced vtree of n variables
    (children m // 2 and m - m // 2), depth by depth: at most two sizes per depth."""
    level = {n: 1}
    while level:
        yield from level.items()
        nxt: dict[int, int] = {}
        for m, count in level.items():
            if m > 1:
                for half in (m // 2, m - m // 2):
                    nxt[half] = nxt.get(half, 0) + count
        level = nxt


@dataclass(frozen=True)
class _Tree:
    """A count tree (or the part above the groups): built states and elements, state_steps, and the
    reachable nodes and elements (ExactlyK only)."""

    nodes: int = 0
    elements: int = 0
    built_nodes: int = 0
    built_elements: int = 0
    state_steps: int = 0
    scan: int = 0  # sum over built states of the left child's states (the direct group builder's loop)


def _count_tree(n: int, cap: int, k: int | None = None) -> _Tree:
    """The "exactly j" count tree over a balanced vtree of n variables, counts capped at ``cap``; with
    ``k`` also the states an ExactlyK(n, k) layout keeps (j in [k - (n - m), min(m, k)])."""
    t = dict(nodes=0, elements=0, built_nodes=0, built_elements=0, state_steps=0, scan=0)
    for m, count in _block_sizes(n):
        if m == 1:
            continue  # leaves are literals, not decision nodes
        A, B, J = min(m // 2, cap), min(m - m // 2, cap), min(m, cap)
        t["built_nodes"] += count * (J + 1)
        t["built_elements"] += count * _pairs(A, B, 0, J)
        t["state_steps"] += count * _terms_squared(A, B, J)
        t["scan"] += count * (J + 1) * (A + 1)
        if k is not None:
            lo, hi = max(0, k - (n - m)), min(m, k)
            t["nodes"] += count * (hi - lo + 1)
            t["elements"] += count * _pairs(A, B, lo, hi)
    return _Tree(**t)


def _depth(n: int) -> int:
    """Height of a balanced vtree over n variables: ceil(log2 n)."""
    return (n - 1).bit_length()


def _estimate(nodes: int, elements: int, levels: int, built_elements: int, state_steps: int, exact: bool) -> Estimate:
    """The estimate with the pysdd compiler's steps (``estimate`` swaps in the direct one's)."""
    steps = state_steps + LAYOUT_STEPS_PER_ELEMENT * built_elements
    return Estimate(nodes, elements, levels, built_elements, state_steps, steps, exact)


def _grouped(spec) -> Estimate:
    """GroupLimited / GroupCapacity: count trees per group, (c, g) states above (see module doc)."""
    K, cap = spec.kmax, min(spec.capacity, spec.kmax)
    M = min(spec.max_groups, K) if spec.limits_groups else 0  # g <= c <= K; 0: g not tracked
    inside = {s: _count_tree(s, cap) for s in set(spec.groups)}
    memo: dict[tuple, tuple] = {}

    def above(sizes: tuple) -> tuple:
        """(most true variables, groups, built nodes, built elements, state steps, scan) under the
        vtree node over these groups; memoised on the sizes, so equal groups cost O(log groups)."""
        if sizes in memo:
            return memo[sizes]
        if len(sizes) == 1:
            t = inside[sizes[0]]
            out = (min(sizes[0], cap), 1, t.built_nodes, t.built_elements, t.state_steps, t.scan)
        else:
            mid = len(sizes) // 2  # circuits.groups._halves
            cl, gl, *left = above(sizes[:mid])
            cr, gr, *right = above(sizes[mid:])
            A, B, C = min(cl, K), min(cr, K), min(cl + cr, K)
            Ag, Bg, Gm = min(gl, M), min(gr, M), min(gl + gr, M)
            here = (
                (C + 1) * (Gm + 1),
                _pairs(A, B, 0, C) * _pairs(Ag, Bg, 0, Gm),
                _terms_squared(A, B, C) * _terms_squared(Ag, Bg, Gm),
                (C + 1) * (Gm + 1) * (A + 1) * (Ag + 1),
            )
            out = (cl + cr, gl + gr, *(x + y + z for x, y, z in zip(left, right, here)))
        memo[sizes] = out
        return out

    _, _, nodes, elements, steps, scan = above(tuple(spec.groups))
    levels = _depth(len(spec.groups)) + _depth(max(spec.groups)) + 1
    return replace(_estimate(nodes + 1, elements + 1, levels, elements, steps, exact=False), scan=scan)


COMPILERS = ("direct", "pysdd")


def estimate(spec, compiler: str | None = None) -> Estimate | None:
    """The estimated layout and cost of compiling ``spec`` with ``compiler`` (None: "direct");
    None for ``SddFile`` / ``CnfFile`` (their size cannot be told by arithmetic, see the module
    docstring)."""
    if isinstance(spec, (SddFile, CnfFile)):
        return None
    compiler = "direct" if compiler is None else compiler
    if compiler not in COMPILERS:
        raise ValueError(
            f"compiler must be one of {', '.join(map(repr, COMPILERS))} for a counting spec, got {compiler!r}"
        )
    est = _pysdd(spec)
    if compiler == "direct":
        est = replace(est, steps=DIRECT_STEPS_PER_ELEMENT * est.elements + SCAN_STEPS * est.scan)
    return est


def _pysdd(spec) -> Estimate:
    """The estimate of a counting spec with the pysdd compiler's steps."""
    if isinstance(spec, ExactlyK):
        t = _count_tree(spec.n, spec.k, spec.k)
        return _estimate(t.nodes + 1, t.elements + 1, _depth(spec.n) + 1, t.built_elements, t.state_steps, exact=True)
    if isinstance(spec, RangeK):
        t = _count_tree(spec.n, spec.kmax)
        return _estimate(
            t.built_nodes + 1, t.built_elements + 1, _depth(spec.n) + 1, t.built_elements, t.state_steps, exact=False
        )
    if isinstance(spec, GROUP_SPECS):
        return _grouped(spec)
    raise TypeError(
        f"spec must be ExactlyK, RangeK, GroupLimited, GroupCapacity, SddFile or CnfFile, got {type(spec).__name__}"
    )


def _number(x: float) -> str:
    """1,234 below a million, else 2.5e9."""
    return f"{x:,.0f}" if x < 1e6 else f"{x:.2g}".replace("e+0", "e").replace("e+", "e")


def _duration(seconds: float) -> str:
    for unit, size in (("years", 3.15e7), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{_number(seconds / size)} {unit}"
    return f"{seconds:.0f} s" if seconds >= 1 else "under a second"


def check(spec, insist: str, compiler: str | None = None) -> Estimate | None:
    """The estimate of ``spec`` (``compiler`` as in ``estimate``; "d4" for a file spec); raises
    ``CircuitTooLarge`` (a ValueError) if its steps pass ``MAX_STEPS`` (read at call time).
    ``insist`` ends the message: how to compile anyway."""
    limit = MAX_STEPS
    est = estimate(spec, None if isinstance(spec, (SddFile, CnfFile)) else compiler)
    if est is None or est.steps <= limit:
        return est
    layout = f"{_number(est.elements)} live elements"
    summary = (
        f"{spec.describe()} is too large to compile: estimated layout {layout}, "
        f"{_number(est.steps)} compile steps (about {_duration(est.seconds)} on a 2-core AMD EPYC); "
        f"the limit is {_number(limit)} steps (about {_duration(limit * SECONDS_PER_STEP)})"
    )
    raise CircuitTooLarge(summary, insist, est, limit)
