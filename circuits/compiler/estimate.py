"""How big a circuit will be and how long it will take to compile, before compiling it.

Pure arithmetic on the spec (no pysdd, microseconds for any n), so that ``compile_circuit`` and the
commands can refuse a size that cannot finish (``check``) and show progress on a long one.

The compiler (``circuits.compiler.compile``, ``circuits.compiler.groups``) builds "exactly j of this block" states
bottom-up over a balanced vtree, counts capped at ``cap``: a vtree node of m = l + r variables holds
the states j = 0..min(m, cap), and state j ORs f_j conjunctions Eq(left, a) AND Eq(right, j - a),
one per a with 0 <= a <= min(l, cap), 0 <= j - a <= min(r, cap). A balanced vtree has at most two
block sizes per depth, so every sum below is O(log n) closed-form terms.

Each kind computes its own ``Estimate`` from the helpers here (``count_tree_sizes``, ``pairs``,
``terms_squared``, ``depth``, ``pysdd_estimate``) and its module says which fields are exact and
which are bounds (``circuits.compiler.kinds``): exact for ``ExactlyK``, upper bounds for ``RangeK`` and the
group specs. A kind without one (``SddFile``, ``CnfFile``) gives None: ``estimate`` returns None
and ``check`` passes it.

``steps`` is the compile cost, per compiler (``circuits.compiler.compile``), in units of about 1 us on an
AMD EPYC (2 cores, shared; docs/reports/circuits-compile-epyc-2026-11.md lists the runs):

- "direct" (the default, ``circuits.compiler.count_tree``): every live element is built once, straight into
  the layout, then checked and written: steps = ``DIRECT_STEPS_PER_ELEMENT`` * elements; for the
  group specs plus ``SCAN_STEPS`` per (state, state of its left child) pair the builder looks at
  (``scan``: a state's elements are found by trying every left state).
- "pysdd": OR-ing f terms into a state rebuilds it once per term (~f^2 element operations), and
  the layout, its checks and the cache files cost ~30 per built element; so steps = sum over the
  built states of f^2 + 30 * built elements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .registry import require

MAX_STEPS = 20_000_000  # compile_circuit refuses more (about 20 s on the reference machine)
PROGRESS_STEPS = 1_000_000  # compile_circuit shows progress bars above this (about a second)
SECONDS_PER_STEP = 1e-6  # reference machine: AMD EPYC, 2 cores (docs/reports/circuits-compile-epyc-2026-11.md)
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


def pairs(A: int, B: int, lo: int, hi: int) -> int:
    """Pairs (a, b) in [0, A] x [0, B] with lo <= a + b <= hi (inclusion-exclusion on the box)."""

    def upto(x: int) -> int:
        return _tri(x) - _tri(x - A - 1) - _tri(x - B - 1) + _tri(x - A - B - 2)

    return upto(hi) - upto(lo - 1) if hi >= lo else 0


def _squares(lo: int, hi: int) -> int:
    """lo^2 + ... + hi^2 (0 when hi < lo); 0 <= lo."""

    def upto(x: int) -> int:
        return x * (x + 1) * (2 * x + 1) // 6 if x > 0 else 0

    return upto(hi) - upto(lo - 1) if hi >= lo else 0


def terms_squared(A: int, B: int, J: int) -> int:
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
class Tree:
    """A count tree (or the part above the groups): built states and elements, state_steps, and the
    reachable nodes and elements (ExactlyK only)."""

    nodes: int = 0
    elements: int = 0
    built_nodes: int = 0
    built_elements: int = 0
    state_steps: int = 0
    scan: int = 0  # sum over built states of the left child's states (the direct group builder's loop)


def count_tree_sizes(n: int, cap: int, k: int | None = None) -> Tree:
    """The "exactly j" count tree over a balanced vtree of n variables, counts capped at ``cap``; with
    ``k`` also the states an ExactlyK(n, k) layout keeps (j in [k - (n - m), min(m, k)])."""
    t = dict(nodes=0, elements=0, built_nodes=0, built_elements=0, state_steps=0, scan=0)
    for m, count in _block_sizes(n):
        if m == 1:
            continue  # leaves are literals, not decision nodes
        A, B, J = min(m // 2, cap), min(m - m // 2, cap), min(m, cap)
        t["built_nodes"] += count * (J + 1)
        t["built_elements"] += count * pairs(A, B, 0, J)
        t["state_steps"] += count * terms_squared(A, B, J)
        t["scan"] += count * (J + 1) * (A + 1)
        if k is not None:
            lo, hi = max(0, k - (n - m)), min(m, k)
            t["nodes"] += count * (hi - lo + 1)
            t["elements"] += count * pairs(A, B, lo, hi)
    return Tree(**t)


def depth(n: int) -> int:
    """Height of a balanced vtree over n variables: ceil(log2 n)."""
    return (n - 1).bit_length()


def pysdd_estimate(
    nodes: int, elements: int, levels: int, built_elements: int, state_steps: int, exact: bool
) -> Estimate:
    """The estimate with the pysdd compiler's steps (``estimate`` swaps in the direct one's)."""
    steps = state_steps + LAYOUT_STEPS_PER_ELEMENT * built_elements
    return Estimate(nodes, elements, levels, built_elements, state_steps, steps, exact)


COMPILERS = ("direct", "pysdd")


def estimate(spec, compiler: str | None = None) -> Estimate | None:
    """The estimated layout and cost of compiling ``spec`` with ``compiler`` (None: "direct"); None
    for a kind without an arithmetic estimate (``SddFile``, ``CnfFile``: see ``circuits.compiler.kinds.files``).
    TypeError for anything but a spec of a registered kind."""
    est = require(spec).estimate()
    if est is None:
        return None
    compiler = "direct" if compiler is None else compiler
    if compiler not in COMPILERS:
        raise ValueError(
            f"compiler must be one of {', '.join(map(repr, COMPILERS))} for a counting spec, got {compiler!r}"
        )
    if compiler == "direct":
        est = replace(est, steps=DIRECT_STEPS_PER_ELEMENT * est.elements + SCAN_STEPS * est.scan)
    return est


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
    est = estimate(spec, compiler)
    if est is None or est.steps <= limit:
        return est
    layout = f"{_number(est.elements)} live elements"
    summary = (
        f"{spec.describe()} is too large to compile: estimated layout {layout}, "
        f"{_number(est.steps)} compile steps (about {_duration(est.seconds)} on a 2-core AMD EPYC); "
        f"the limit is {_number(limit)} steps (about {_duration(limit * SECONDS_PER_STEP)})"
    )
    raise CircuitTooLarge(summary, insist, est, limit)
