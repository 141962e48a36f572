"""``Circuit``: a compiled constraint evaluated batched over tokens, on CPU or CUDA.

All methods take logits [..., n] (log-odds of independent Bernoulli variables), check them once,
flatten the leading dimensions into T tokens, run the passes that ``circuits.kernels.select``
picked for this circuit and the logits' dtype (picked once, then kept), and restore the leading
dimensions. fp16/bf16 logits are computed in fp32 and returned in their own dtype. Logits of -inf
mean "never true". Gradients follow the contract of ``circuits.ops``.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

from . import checks, ops
from .kernels import select
from .kernels.interface import Passes
from .kernels.program import Program
from .kernels.rows import exactly_k_shift
from .layout import FALSE_SLOT, TRUE_SLOT, Layout
from .spec import ExactlyK, RangeK, Spec


class Circuit:
    """A compiled circuit over n variables. Create with ``circuits.compile_circuit``.

    ``program`` is the layout as tensors on ``device``. Set ``validate = False`` to skip the input
    checks (a caller that has checked the logits already; the value checks cost one host
    synchronisation on the CPU, and are assertions in the graph on CUDA: ``circuits.checks``).
    """

    def __init__(self, layout: Layout, spec: Spec | None = None, info: dict | None = None, device="cpu"):
        self.layout = layout
        self.spec = spec
        self.info = dict(info or {})
        self.validate = True
        self.program = Program.from_layout(layout, device)
        self.program.float64_rows = not isinstance(spec, (ExactlyK, RangeK))  # see Program.float64_rows
        self.program.shift_k = self.shift_size  # the shift the fused queries make themselves
        self.device = self.program.device  # resolved: "cuda" becomes "cuda:0"
        self._passes: dict[torch.dtype, Passes] = {}
        self._lock = threading.Lock()
        self.handle = ops.register(self)  # the ``circuit`` argument of the operators in ``circuits.ops``

    # --- housekeeping -------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.layout.n

    def sizes(self) -> dict:
        """Variables, levels, groups, nodes, live elements, padded elements, padding ratio, slots."""
        return self.layout.sizes()

    def to(self, device) -> Circuit:
        """A copy whose tensors live on ``device`` (the layout arrays are shared)."""
        return Circuit(self.layout, self.spec, self.info, device)

    def __repr__(self) -> str:
        s = self.sizes()
        name = self.spec.describe() if self.spec is not None else f"n={self.n}"
        return (
            f"Circuit({name}, levels={s['levels']}, nodes={s['nodes']}, "
            f"elements={s['elements']}, padding={s['padding']}, device={self.device})"
        )

    def to_networkx(self) -> networkx.DiGraph:  # noqa: F821 (imported here: 0.15 s saved at import)
        """The pruned circuit as a DAG: OR nodes (decision nodes), AND nodes (elements), literals.

        Node attributes: ``kind`` in {"or", "and", "literal", "true"}, ``level``, and ``label``.
        Edges point from parent to child.
        """
        import networkx as nx

        L, n = self.layout, self.n
        G = nx.DiGraph()

        def leaf(slot: int) -> str:
            if slot == TRUE_SLOT:
                G.add_node("T", kind="true", level=0, label="⊤")
                return "T"
            i = slot - 2 if slot < 2 + n else slot - 2 - n
            name = f"x{i}" if slot < 2 + n else f"¬x{i}"
            G.add_node(name, kind="literal", level=0, label=name, var=i, positive=slot < 2 + n)
            return name

        def name(slot: int) -> str:
            return leaf(slot) if slot < 2 + 2 * n else f"or{slot}"

        for start, nodes, fanin, off, height in L.groups.tolist():
            for j in range(nodes):
                parent = f"or{start + j}"
                G.add_node(parent, kind="or", level=2 * height, label="⊕")
                for e in range(fanin):
                    row = off + j * fanin + e
                    p, s = L.children[row].tolist()
                    if p == FALSE_SLOT:
                        continue
                    a = f"and{row}"
                    G.add_node(a, kind="and", level=2 * height - 1, label="⊗")
                    G.add_edge(parent, a)
                    G.add_edge(a, name(p))
                    G.add_edge(a, name(s))
        return G

    def kernels(self, dtype: torch.dtype, device=None) -> Passes:
        """The kernels (``Passes``) that calls with ``dtype`` logits take (``circuits.kernels.select``,
        picked once), on this circuit's device (``device``: ignored, for the evaluators' one signature)."""
        return self.passes(dtype)

    def passes(self, dtype: torch.dtype) -> Passes:
        """The passes that calls with ``dtype`` logits take (``circuits.kernels.select``, picked once)."""
        chosen = self._passes.get(dtype)
        if chosen is None:
            with self._lock:
                chosen = self._passes.get(dtype) or select.select(self.program, dtype)
                self._passes[dtype] = chosen
        return chosen

    # --- input handling -----------------------------------------------------------------------
    def _inputs(self, logits: Tensor, generator=None) -> tuple[Tensor, torch.Size]:
        """[..., n] -> contiguous fp32/fp64 [T, n] on this circuit's device, plus the leading shape.

        The argument checks of every public call, before any pass (skipped when ``validate`` is
        False); the value checks come after the first pass (``_check``), from its log Z.
        """
        if self.validate:
            checks.logits(logits, n=self.n, device=self.device)
            checks.generator(generator, self.device)
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        flat = logits if logits.dim() == 2 else logits.reshape(-1, self.n)  # no view node for [T, n] logits
        return flat.to(dtype).contiguous(), logits.shape[:-1]

    def _check(self, r: Tensor, log_z: Tensor) -> None:
        """Raise ValueError for NaN, +inf or |logits| >= ``checks.MAX_ABS_LOGIT`` in r [T, n] (larger
        ones overflow the fp32 passes) or a row that satisfies nothing (log Z [T] not finite): on
        the CPU one host sync, on CUDA and under torch.compile assertions in the graph
        (``checks.in_graph``)."""
        if not self.validate or r.shape[0] == 0:
            return
        # a variable the circuit leaves implicit never reaches log Z, so look at r too
        if not checks.in_graph(r) and bool(torch.isfinite(log_z).all() & checks.allowed(r).all()):
            return  # the one host sync of a call that passes
        checks.logit_values(r)
        self._require_satisfied(r, log_z)

    def _require_satisfied(self, r: Tensor, log_z: Tensor) -> None:
        """Raise ValueError naming the first row whose log Z [T] is not finite (r [T, n]: its
        logits, for the message); an assertion in the graph on CUDA and under torch.compile."""
        if checks.in_graph(log_z):
            checks.require(torch.isfinite(log_z).all(), self._unsatisfiable())
        elif not bool(torch.isfinite(log_z).all()):
            raise ValueError(self._unsatisfiable(r, int((~torch.isfinite(log_z)).nonzero()[0, 0])))

    def _unsatisfiable(self, r: Tensor | None = None, row: int | None = None) -> str:
        """The message for logits r [T, n] whose -inf entries leave no satisfying assignment at ``row``
        (any row, when not known: the message of a traced assertion)."""
        what = f"the constraint {self.spec.describe()}" if self.spec is not None else "the circuit's constraint"
        if row is None:
            return f"some row of the logits makes {what} unsatisfiable: no subset of its finite logits satisfies it"
        finite = int(torch.isfinite(r[row]).sum())
        need = ""
        if self.spec is not None and getattr(self.spec, "cardinalities", None) and finite < self.spec.cardinalities[0]:
            need = f"; it needs at least {self.spec.cardinalities[0]} logits that are not -inf"
        return (
            f"logits make {what} unsatisfiable at row {row}: no subset of its {finite} finite logits satisfies it{need}"
        )

    @torch.no_grad()
    def check_satisfiable(self, logits: Tensor) -> None:
        """Raise ValueError naming the first row of ``logits`` [..., n] whose -inf entries leave no
        satisfying assignment (one pass at logits 0 / -inf and one host sync; an assertion in the
        graph on CUDA and under torch.compile). NaN and +inf count as finite here."""
        r, _ = self._inputs(logits)
        live = torch.where(r > -torch.inf, 0.0, -torch.inf).to(r.dtype)  # [T, n]
        log_z, _ = torch.ops.circuits.log_partition(live, self.handle, False)
        self._require_satisfied(live, log_z)

    @property
    def shift_size(self) -> int:
        """k for an exactly-k circuit (its passes take logits shifted by the k-th largest, ``_shift``), else 0."""
        return self.spec.cardinalities[0] if self.spec is not None and self.spec.fixed_cardinality else 0

    def _shift(self, r: Tensor) -> Tensor | None:
        """What the passes subtract from checked logits r [T, n]: each row's k-th largest logit,
        [T, 1], for an exactly-k circuit (shift invariant), else None. The k-th largest sits at the
        boundary of the likely subsets, so the logits that matter keep their low bits (the row
        maximum would let one far outlier wipe them out)."""
        k = self.shift_size
        if k == 0 or r.shape[0] == 0:
            return None
        return exactly_k_shift(torch.ops.circuits.kth_largest(r.detach(), k))  # [T, n] -> [T, 1], no gradient

    def shifted(self, r: Tensor) -> Tensor:
        """The logits the passes evaluate for checked logits r [T, n]: r less ``_shift`` (the
        tests feed them to one implementation of the passes directly)."""
        shift = self._shift(r)
        return r if shift is None else r - shift

    # --- the four queries (each one registered operator, ``circuits.ops``) -------------------------
    def log_partition(self, logits: Tensor) -> Tensor:
        """log P(constraint) under independent Bernoulli(sigmoid(logits)): [..., n] -> [...].

        Differentiable; d/d logits = marginals - sigmoid(logits), and twice differentiable.
        """
        r, lead = self._inputs(logits)
        log_z, _ = torch.ops.circuits.log_partition(r, self.handle, r.requires_grad and torch.is_grad_enabled())
        self._check(r, log_z)
        return log_z.reshape(lead).to(logits.dtype)

    def _marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        """(marginals or zeros [T, n], one draw [T, n] or an empty tensor) of checked logits r [T, n]."""
        m, z, log_z = torch.ops.circuits.marginals(r, self._shift(r), seed, self.handle, values, self.validate)
        self._check(r, log_z)
        return m, z

    def marginals(self, logits: Tensor, *, values: bool = True) -> Tensor:
        """P(x_i = 1 | constraint): [..., n] -> [..., n]. Its Jacobian is Cov(x) (exact).

        values=False skips the downward pass and returns zeros that still carry the marginals'
        Jacobian in the backward: for straight-through estimators, which need only the gradient.
        """
        r, lead = self._inputs(logits)
        m, _ = self._marginals(r, None, values)
        return m.reshape(*lead, self.n).to(logits.dtype)

    def sample(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Exact draws from P(x | constraint): [..., n] -> [..., n] in {0, 1}, logits' dtype.

        generator: a ``torch.Generator`` on the circuit's device, for reproducible draws.
        """
        r, lead = self._inputs(logits, generator)
        with torch.no_grad():
            z, log_z = torch.ops.circuits.sample(r, self._shift(r), ops.seed(generator, r), self.handle)
            self._check(r, log_z)
        return z.reshape(*lead, self.n).to(logits.dtype)

    def map(self, logits: Tensor) -> Tensor:
        """The most probable satisfying assignment: [..., n] -> [..., n] in {0, 1}."""
        r, lead = self._inputs(logits)
        with torch.no_grad():
            z, best = torch.ops.circuits.map(r, self._shift(r), self.handle)
            self._check(r, best)  # the best completion is -inf exactly when none exists
        return z.reshape(*lead, self.n).to(logits.dtype)

    def marginals_and_sample(self, logits: Tensor, generator: torch.Generator | None = None, *, values: bool = True):
        """(marginals, sample) from one upward pass; marginals differentiable (and ``values``) as
        in ``marginals``."""
        r, lead = self._inputs(logits, generator)
        m, z = self._marginals(r, ops.seed(generator, r), values)
        shape = (*lead, self.n)
        return m.reshape(shape).to(logits.dtype), z.reshape(shape).to(logits.dtype)

    def chosen_scores(
        self,
        logits: Tensor,
        generator: torch.Generator | None = None,
        *,
        slots: int,
        kind: str = "softmax",
        paper: bool = False,
    ):
        """One exact draw z and its variables by score π = softmax(logits) or sigmoid(logits)
        (``kind``), descending (ties to the lower index), in ``slots`` slots, weighted by Eq. 7's
        straight-through weights: π there, the gradient through π and the marginals (Jacobian Cov(z),
        or Cov(z) diag(1 - sigmoid(logits)) with ``paper``). One operator, ``circuits::chosen_scores``
        (one pass with the C passes). logits [T, n] -> (weights [T, slots], indices [T, slots] long,
        mask [T, slots] bool, π [T, n] detached); unused slots hold the lowest undrawn variables,
        ascending, weight 0."""
        r, _ = self._inputs(logits, generator)
        if self.validate and r.shape[0]:  # the value checks: two host syncs on the CPU (and a pass at logits 0 / -inf)
            checks.logit_values(r)
            self.check_satisfiable(r)
        cards = getattr(self.spec, "cardinalities", None) or (0, self.n)
        return ops.chosen_scores_call(r, generator, cards[0], cards[-1], self.handle, slots, kind, paper)
