"""``Circuit``: a compiled constraint evaluated batched over tokens, on CPU or CUDA.

All methods take logits [..., n] (log-odds of independent Bernoulli variables), flatten the
leading dimensions into T tokens, run the passes (the fused C passes of ``circuits.native`` for
fp32 on the CPU, else those of ``circuits.kernels`` on [slots, T] buffers; both give the same
results, the same draws for the same generator included), and restore the leading dimensions.
fp16/bf16 logits are computed in fp32 and returned in their own dtype. Logits of -inf mean
"never true".
"""

from __future__ import annotations

import networkx as nx
import torch
from torch import Tensor

from . import kernels, native
from .layout import FALSE_SLOT, TRUE_SLOT, Layout
from .spec import Spec


class _LogPartition(torch.autograd.Function):
    """log Z(r) [T, n] -> [T]; d log Z / d r = m - sigmoid(r).

    When a gradient is needed the forward also runs the downward pass and saves m, so the
    backward is one product; under create_graph the backward recomputes m differentiably
    (double backward works). Saves O(T n).
    """

    @staticmethod
    def forward(ctx, circuit: "Circuit", r: Tensor) -> Tensor:
        log_z, m = circuit._log_z_and_marginals(r, r, ctx.needs_input_grad[1])  # [T], [T, n] or None
        ctx.circuit = circuit
        ctx.save_for_backward(r, m)
        return log_z

    @staticmethod
    def backward(ctx, grad: Tensor):
        r, m = ctx.saved_tensors
        if torch.is_grad_enabled():
            m, _ = _Marginals.apply(ctx.circuit, r, False, None)
        return None, grad.unsqueeze(-1) * (m - torch.sigmoid(r))


class _Marginals(torch.autograd.Function):
    """(m, z) from r [T, n]: marginals [T, n] and, if asked, a sample [T, n] (else empty).

    With ``values`` False the downward pass is skipped and m is zeros: only its backward is
    wanted (a straight-through estimator). Backward of m is Cov(z) v (the Jacobian is
    symmetric), recomputed; saves only r.
    """

    @staticmethod
    def forward(ctx, circuit: "Circuit", r: Tensor, want_sample: bool, generator, values: bool = True):
        raw, r = r, circuit._shift(r)
        z = circuit._draw(r, raw, generator) if want_sample else r.new_empty(0)
        if values:
            _, m = circuit._log_z_and_marginals(r, raw, True)
        else:
            if not want_sample and circuit.validate:
                circuit._upward_checked(r, raw=raw)
            m = torch.zeros_like(r)
        ctx.circuit = circuit
        ctx.save_for_backward(r)
        ctx.mark_non_differentiable(z)
        return m, z

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v: Tensor, _):
        (r,) = ctx.saved_tensors
        jvp = native.marginals_jvp if native.available(r) else kernels.marginals_jvp
        return None, jvp(ctx.circuit._prog, r, v.contiguous()), None, None, None


class Circuit:
    """A compiled circuit over n variables. Create with ``circuits.compile_circuit``.

    Set ``validate = False`` to skip the input checks (they cost one host synchronisation).
    """

    def __init__(self, layout: Layout, spec: Spec | None = None, info: dict | None = None, device="cpu"):
        self.layout = layout
        self.spec = spec
        self.info = dict(info or {})
        self.validate = True
        self._prog = kernels.Program.from_layout(layout, device)
        self.device = self._prog.prime.device  # resolved: "cuda" becomes "cuda:0"

    # --- housekeeping -------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.layout.n

    def sizes(self) -> dict:
        """Variables, levels, groups, nodes, live elements, padded elements, padding ratio, slots."""
        return self.layout.sizes()

    def to(self, device) -> "Circuit":
        """A copy whose tensors live on ``device`` (the layout arrays are shared)."""
        return Circuit(self.layout, self.spec, self.info, device)

    def __repr__(self) -> str:
        s = self.sizes()
        name = self.spec.describe() if self.spec is not None else f"n={self.n}"
        return (
            f"Circuit({name}, levels={s['levels']}, nodes={s['nodes']}, "
            f"elements={s['elements']}, padding={s['padding']}, device={self.device})"
        )

    def to_networkx(self) -> nx.DiGraph:
        """The pruned circuit as a DAG: OR nodes (decision nodes), AND nodes (elements), literals.

        Node attributes: ``kind`` in {"or", "and", "literal", "true"}, ``level``, and ``label``.
        Edges point from parent to child.
        """
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

    # --- input handling -----------------------------------------------------------------------
    def _flatten(self, logits: Tensor, name: str = "logits") -> tuple[Tensor, torch.Size]:
        """[..., n] -> fp32/fp64 [T, n] on this circuit's device, plus the leading shape."""
        if not isinstance(logits, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dim() == 0 or logits.shape[-1] != self.n:
            raise ValueError(f"{name} must have shape [..., n] with n = {self.n}, got {list(logits.shape)}")
        if not logits.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {logits.dtype}")
        if logits.device != self.device:
            raise ValueError(
                f"{name} is on {logits.device} but the circuit is on {self.device}; use circuit.to(device)"
            )
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        return logits.reshape(-1, self.n).to(dtype).contiguous(), logits.shape[:-1]

    def _check(self, r: Tensor, log_z: Tensor) -> None:
        """One host sync: raise ValueError for NaN / +inf logits or an unmeetable constraint."""
        if not self.validate or r.shape[0] == 0:
            return
        # one sync: a variable the circuit leaves implicit never reaches log Z, so look at r too
        if bool(torch.isfinite(log_z).all() & ~(torch.isnan(r) | torch.isposinf(r)).any()):
            return
        if bool(torch.isnan(r).any()):
            raise ValueError("logits contain NaN")
        if bool(torch.isposinf(r).any()):
            raise ValueError("logits must be finite or -inf (never chosen); got +inf")
        bad = int((~torch.isfinite(log_z)).nonzero()[0, 0])
        finite = int(torch.isfinite(r[bad]).sum())
        need = ""
        if self.spec is not None and getattr(self.spec, "cardinalities", None):
            need = f" (needs at least {self.spec.cardinalities[0]} variables that are not -inf)"
        raise ValueError(
            f"logits make the constraint unsatisfiable at row {bad}: {finite} finite logits{need}"
        )

    def _check_generator(self, generator) -> None:
        if generator is not None and (
            not isinstance(generator, torch.Generator) or generator.device.type != self.device.type
        ):
            where = getattr(generator, "device", type(generator).__name__)
            raise ValueError(f"generator must be a torch.Generator on {self.device.type}, got one on {where}")

    def _shift(self, r: Tensor) -> Tensor:
        """Exactly-k distributions are shift invariant: subtract each row's k-th largest logit.

        The k-th largest sits at the boundary of the likely subsets, so the logits that matter
        keep their low bits (the row maximum would let one far outlier wipe them out). [T, n].
        """
        k = self.spec.cardinalities[0] if self.spec is not None and self.spec.fixed_cardinality else 0
        if k == 0 or r.shape[0] == 0:
            return r
        if native.available(r):
            ref = native.kth_largest(r, k).unsqueeze(-1)  # [T, n] -> [T, 1]
        else:
            ref = r.topk(k, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)
        return r - torch.where(torch.isfinite(ref), ref, torch.zeros_like(ref))

    def _upward_checked(self, r: Tensor, raw: Tensor | None = None) -> kernels.Upward:
        """The upward pass on r, after which the input checks run on ``raw`` (default r)."""
        up = kernels.upward(self._prog, r)
        self._check(r if raw is None else raw, up.val[-1])
        return up

    def _log_z_and_marginals(self, r: Tensor, raw: Tensor, marginals: bool) -> tuple[Tensor, Tensor | None]:
        """(log Z [T], the marginals [T, n] if asked) of r, after the checks on ``raw``: the fused C
        pass for fp32 on the CPU, else the torch passes."""
        if native.available(r):
            log_z, m = native.log_partition(self._prog, r, marginals)
            self._check(raw, log_z)
            return log_z, m
        up = self._upward_checked(r, raw=raw)
        m = None
        if marginals:
            m = kernels.marginals_from_flows(self._prog, kernels.downward(self._prog, up), torch.sigmoid(r))
        return up.val[-1].clone(), m

    def _draw(self, r: Tensor, raw: Tensor, generator) -> Tensor:
        """One exact draw per row of the shifted logits r [T, n] (the checks run on ``raw``):
        the fused C pass for fp32 on the CPU, else the torch passes; the same uniforms either way."""
        uniforms, fill = kernels.draw_uniforms(self._prog, r, generator)
        if native.available(r):
            z, log_z = native.sample(self._prog, r, uniforms, fill)
            self._check(raw, log_z)
            return z
        return kernels.sample(self._prog, r, self._upward_checked(r, raw=raw), uniforms, fill)

    # --- the four queries ---------------------------------------------------------------------
    def log_partition(self, logits: Tensor) -> Tensor:
        """log P(constraint) under independent Bernoulli(sigmoid(logits)): [..., n] -> [...].

        Differentiable; d/d logits = marginals - sigmoid(logits), and twice differentiable.
        """
        r, lead = self._flatten(logits)
        return _LogPartition.apply(self, r).reshape(lead).to(logits.dtype)

    def marginals(self, logits: Tensor, *, values: bool = True) -> Tensor:
        """P(x_i = 1 | constraint): [..., n] -> [..., n]. Its Jacobian is Cov(x) (exact).

        values=False skips the downward pass and returns zeros that still carry the marginals'
        Jacobian in the backward: for straight-through estimators, which need only the gradient.
        """
        r, lead = self._flatten(logits)
        m, _ = _Marginals.apply(self, r, False, None, values)
        return m.reshape(*lead, self.n).to(logits.dtype)

    def sample(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Exact draws from P(x | constraint): [..., n] -> [..., n] in {0, 1}, logits' dtype.

        generator: a ``torch.Generator`` on the circuit's device, for reproducible draws.
        """
        r, lead = self._flatten(logits)
        self._check_generator(generator)
        with torch.no_grad():
            z = self._draw(self._shift(r), r, generator)
        return z.reshape(*lead, self.n).to(logits.dtype)

    def map(self, logits: Tensor) -> Tensor:
        """The most probable satisfying assignment: [..., n] -> [..., n] in {0, 1}."""
        r, lead = self._flatten(logits)
        with torch.no_grad():
            rs = self._shift(r)
            if native.available(rs):
                z, best = native.map_assignment(self._prog, rs)
                self._check(r, best)  # the best completion is -inf exactly when none exists
            else:
                up = kernels.max_upward(self._prog, rs)
                self._check(r, up.val[-1])
                z = kernels.map_assignment(self._prog, rs, up)
        return z.reshape(*lead, self.n).to(logits.dtype)

    def marginals_and_sample(self, logits: Tensor, generator: torch.Generator | None = None, *,
                             values: bool = True):
        """(marginals, sample) from one upward pass; marginals differentiable (and ``values``) as
        in ``marginals``."""
        r, lead = self._flatten(logits)
        self._check_generator(generator)
        m, z = _Marginals.apply(self, r, True, generator, values)
        shape = (*lead, self.n)
        return m.reshape(shape).to(logits.dtype), z.reshape(shape).to(logits.dtype)
