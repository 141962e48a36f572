"""``Circuit``: a compiled constraint evaluated batched over tokens, on CPU or CUDA.

The shapes, checks and queries of ``circuits.evaluator.Evaluator``, by the passes that
``circuits.kernels.select`` picked for this circuit and the logits' dtype (picked once, then kept).
fp16/bf16 logits are computed in fp32 and returned in their own dtype. Gradients follow the
contract of ``circuits.ops``.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

from . import checks
from .evaluator import Evaluator
from .kernels import select
from .kernels.interface import Passes
from .kernels.program import Program
from .kernels.rows import exactly_k_shift
from .layout import FALSE_SLOT, TRUE_SLOT, Layout
from .spec import ExactlyK, RangeK, Spec


class Circuit(Evaluator):
    """A compiled circuit over n variables. Create with ``circuits.compile_circuit``.

    ``program`` is the layout as tensors on ``device``. ``validate = False`` skips the input checks
    (``Evaluator``; the value checks cost one host synchronisation on the CPU, and are assertions in
    the graph on CUDA: ``circuits.checks``).
    """

    def __init__(self, layout: Layout, spec: Spec | None = None, info: dict | None = None, device="cpu"):
        self.layout = layout
        self.info = dict(info or {})
        self.program = Program.from_layout(layout, device)
        self.program.float64_rows = not isinstance(spec, (ExactlyK, RangeK))  # see Program.float64_rows
        self._kernels: dict[torch.dtype, Passes] = {}
        self._lock = threading.Lock()
        super().__init__(spec, layout.n, self.program.device)  # the device resolved: "cuda" becomes "cuda:0"
        self.program.shift_k = self.shift_size  # the shift the fused queries make themselves

    # --- housekeeping -------------------------------------------------------------------------
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

    def kernels(self, dtype: torch.dtype) -> Passes:
        """The passes that calls with ``dtype`` logits take (``circuits.kernels.select``, picked once;
        within a ``circuits.implementation`` block, its choice)."""
        if select.chosen() is not None:
            return select.select(self.program, dtype)
        chosen = self._kernels.get(dtype)
        if chosen is None:
            with self._lock:
                chosen = self._kernels.get(dtype) or select.select(self.program, dtype)
                self._kernels[dtype] = chosen
        return chosen

    # --- the value checks: after the first pass, from its log Z ----------------------------------
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

    # --- the queries on checked logits r [T, n] (each one registered operator, ``circuits.ops``) -------
    def _log_partition(self, r: Tensor) -> Tensor:
        log_z, _ = torch.ops.circuits.log_partition(r, self.handle, r.requires_grad and torch.is_grad_enabled())
        self._check(r, log_z)
        return log_z

    def _marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        m, z, log_z = torch.ops.circuits.marginals(r, self._shift(r), seed, self.handle, values, self.validate)
        self._check(r, log_z)
        return m, z

    def _sample(self, r: Tensor, seed: Tensor) -> Tensor:
        z, log_z = torch.ops.circuits.sample(r, self._shift(r), seed, self.handle)
        self._check(r, log_z)
        return z

    def _map(self, r: Tensor) -> Tensor:
        z, best = torch.ops.circuits.map(r, self._shift(r), self.handle)
        self._check(r, best)  # the best completion is -inf exactly when none exists
        return z

    def _check_chosen(self, r: Tensor) -> None:
        """Two host syncs on the CPU (and a pass at logits 0 / -inf): the operator gives no log Z."""
        checks.logit_values(r)
        self.check_satisfiable(r)
