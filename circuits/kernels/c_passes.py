"""``CPasses``: the passes fused in C (``c/passes.c``), for fp32 on the CPU.

Each pass evaluates one tile of tokens through the whole circuit while it stays in cache: log Z
and the marginals, sampling, MAP, Cov(z) v. ``TorchPasses`` is their
plain-torch meaning and test oracle: the same results, the same draws from the same uniforms.
Tiles of tokens are split between ``torch.get_num_threads()`` OpenMP threads (ctypes releases the
GIL). The library is the kernels' one, ``circuits.kernels.library``.
"""

from __future__ import annotations

import ctypes
import math

import torch
from torch import Tensor

from . import library, torch_passes
from .interface import Passes, shifted
from .program import Program
from .rows import REFERENCES, RowOps


class CPasses(Passes):
    """The C passes over ``program`` (on the CPU). Holds the C view of the program: its sizes and
    pointers into index tensors that this object keeps alive."""

    name = "fused C"
    fused = True

    def __init__(self, program: Program, rows: RowOps = REFERENCES, *, linear: bool = True):
        """linear: let tiles take the linear upward pass where their values allow it (False: the
        upward pass on logarithms everywhere; the two are tested against each other)."""
        super().__init__(program, rows)
        self.lib = library.library()
        if self.lib is None:
            raise RuntimeError("the C passes are not available (circuits.kernels.select.describe() says why)")
        prog = program
        nodes = torch.tensor(
            [[g.start + j, g.rows.start + j * g.fanin, g.fanin] for g in prog.groups for j in range(g.nodes)],
            dtype=torch.int64,
        )  # [D, 3], bottom-up
        ids, _ = prog.scope_ids
        self.uid = torch.zeros(prog.num_slots, dtype=torch.int64)  # [S]: a decision slot's row of the uniforms
        for g in prog.groups:
            self.uid[g.slots] = ids[g.start].cpu()
        order = torch.argsort(prog.implicit_row, stable=True)  # implicit pairs by element row, CSR
        imp_var = prog.implicit_var[order].contiguous()
        imp_off = torch.zeros(prog.num_rows + 1, dtype=torch.int64)
        imp_off[1:] = torch.bincount(prog.implicit_row, minlength=prog.num_rows).cumsum(0)
        lin = linear_constants(prog) if linear else None
        coef = None if lin is None else lin[0]  # float64 [R]: the double pass of log Z alone takes them all
        real = None if lin is None else coef[coef > 0]
        lin_float = lin is not None and not (real.numel() and float(real.min()) < FLOAT_COEF_MIN)
        tilt = prog.tilt  # the tilt of the pass on logarithms (torch_passes.tilt)
        up, down = tilt.up.float().cpu().contiguous(), tilt.down.float().cpu().contiguous()
        self._keep = (nodes, prog.prime, prog.sub, imp_off, imp_var, coef, up, down)  # what the struct points into
        self._coef = coef
        scalars = (0.0,) * 5 + (-1.0,) if lin is None else lin[1:]
        self.struct = library.ProgStruct(
            prog.n,
            prog.num_slots,
            prog.num_rows,
            len(nodes),
            int(prog.smooth),
            nodes.data_ptr(),
            prog.prime.data_ptr(),
            prog.sub.data_ptr(),
            imp_off.data_ptr(),
            imp_var.data_ptr(),
            None if coef is None else coef.data_ptr(),
            int(lin_float),
            *scalars,
            up.data_ptr(),
            down.data_ptr(),
            tilt.kmin,
            tilt.kmax,
            int(not tilt.uniform),
        )

    def _run(self, fn, *args) -> int:
        """Call a pass with torch's thread count (OpenMP threads inside); returns how many tiles of
        tokens took the linear upward pass."""
        linear_tiles = fn(ctypes.byref(self.struct), *args, torch.get_num_threads())
        if linear_tiles < 0:
            raise MemoryError("circuits: the C passes could not allocate their scratch")
        return linear_tiles

    def linear_tiles(self, r: Tensor, shift: Tensor | None = None) -> tuple[int, int]:
        """(tiles that take the linear upward pass, tiles) for logits r [T, n] float32: how much of
        a batch runs without an exp or log per element (``c/passes.c``, ``upward``). A tile holds
        128 tokens; one whose values leave the linear range sends its whole tile to the pass on
        logarithms. For diagnostics and tests."""
        n = self.program.n
        if r.dim() != 2 or r.shape[1] != n or r.dtype != torch.float32 or r.device.type != "cpu":
            raise ValueError(
                f"linear_tiles takes float32 CPU logits [T, {n}], got {r.dtype} {list(r.shape)} on {r.device}"
            )
        r = r.contiguous()
        if shift is not None and shift.shape[0] != r.shape[0]:
            raise ValueError(f"shift must have one row per token ({r.shape[0]}), got {list(shift.shape)}")
        log_z = r.new_empty(r.shape[0])
        done = self._run(self.lib.pm_marginals, r.data_ptr(), _pointer(shift), None, log_z.data_ptr(), None, r.shape[0])
        return done, -(-r.shape[0] // self.lib.pm_tile_tokens())

    def log_partition(
        self, r: Tensor, marginals: bool, shift: Tensor | None = None, *, accurate: bool = True, refine: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        log_z, m = r.new_empty(r.shape[0]), torch.empty_like(r) if marginals else None
        refine = marginals and refine and self.program.float64_rows
        lin = torch.empty(r.shape[0], dtype=torch.uint8) if refine else None  # 1: the token's tile was linear
        if marginals or not accurate:
            self._run(
                self.lib.pm_marginals,
                r.data_ptr(),
                _pointer(shift),
                None if m is None else m.data_ptr(),
                log_z.data_ptr(),
                None if lin is None else lin.data_ptr(),
                r.shape[0],
            )
        if refine:  # the linear pass keeps 24 bits relative to each value; the pass on logarithms does not
            rows = (lin == 0).nonzero().squeeze(1)
            if rows.numel():
                x = shifted(r[rows], None if shift is None else shift[rows], torch.float64)
                m[rows] = torch_passes.TorchPasses(self.program).log_partition(x, True)[1].float()
        if accurate:
            self._accurate_log_z(r, shift, log_z)
        return log_z, m

    def _accurate_log_z(self, r: Tensor, shift: Tensor | None, log_z: Tensor) -> None:
        """log_z [T] = log Z of r [T, n] less shift, accumulated in double: the C double pass
        (``pm_log_z``), and the float64 torch passes for the tokens it refuses (logits far from the
        nominal one or from each other) or for all of them without the double constants."""
        if self._coef is None:
            refused = torch.ones(r.shape[0], dtype=torch.bool)
        else:
            bad = torch.empty(r.shape[0], dtype=torch.uint8)
            self._run(self.lib.pm_log_z, r.data_ptr(), _pointer(shift), log_z.data_ptr(), bad.data_ptr(), r.shape[0])
            refused = bad.bool()
        rows = refused.nonzero().squeeze(1)
        if rows.numel():
            x = shifted(r[rows], None if shift is None else shift[rows])
            log_z[rows] = torch_passes.accurate_log_z(self.program, x)

    def sample(
        self, r: Tensor, uniforms: Tensor, fill: Tensor | None, shift: Tensor | None = None, log_z: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        uniforms = uniforms.contiguous()
        fill = None if fill is None else fill.contiguous()
        z, lz = torch.empty_like(r), r.new_empty(r.shape[0]) if log_z else None
        self._run(
            self.lib.pm_sample,
            r.data_ptr(),
            _pointer(shift),
            uniforms.data_ptr(),
            self.uid.data_ptr(),
            None if fill is None else fill.data_ptr(),
            z.data_ptr(),
            None if lz is None else lz.data_ptr(),
            r.shape[0],
        )
        return z, lz

    def map(self, r: Tensor, shift: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z, best = torch.empty_like(r), r.new_empty(r.shape[0])
        self._run(self.lib.pm_map, r.data_ptr(), _pointer(shift), z.data_ptr(), best.data_ptr(), r.shape[0])
        return z, best

    def marginals_jvp(self, r: Tensor, v: Tensor, shift: Tensor | None = None) -> Tensor:
        v = v.contiguous()
        out = torch.empty_like(r)
        self._run(self.lib.pm_jvp, r.data_ptr(), _pointer(shift), v.data_ptr(), out.data_ptr(), r.shape[0])
        return out

    def chosen(self, r: Tensor, seed: Tensor, p: Tensor, slots: int) -> tuple[Tensor, Tensor, Tensor]:
        """``Kernels.chosen`` in the sampling pass: the draw and the selection in one pass over the
        tiles; an exactly-k circuit's shift (``program.shift_k``) is made inside the pass."""
        uniforms, fill = self.draw_uniforms(r, seed)
        uniforms, p = uniforms.contiguous(), p.contiguous()
        fill = None if fill is None else fill.contiguous()
        T, shift_k = r.shape[0], self.program.shift_k
        w, idx = r.new_empty(T, slots), torch.empty(T, slots, dtype=torch.int64)
        mask = torch.empty(T, slots, dtype=torch.bool)
        shift = r.new_empty(T) if shift_k else None  # the pass's scratch
        if T and slots:
            self._run(
                self.lib.pm_chosen,
                r.data_ptr(),
                shift_k,
                _pointer(shift),
                uniforms.data_ptr(),
                self.uid.data_ptr(),
                None if fill is None else fill.data_ptr(),
                p.data_ptr(),
                slots,
                idx.data_ptr(),
                w.data_ptr(),
                mask.data_ptr(),
                T,
            )
        return w, idx, mask

    def chosen_backward(self, r: Tensor, indices: Tensor, mask: Tensor, g: Tensor, kind: str, paper: bool) -> Tensor:
        """``Kernels.chosen_backward`` in one pass (Cov(z) g_t and the scores' backward, π recomputed)
        for the exact convention; the "paper" one is composed."""
        if paper:
            return super().chosen_backward(r, indices, mask, g, kind, paper)
        indices = indices.to(torch.int32).contiguous()
        g, mask = g.to(torch.float32).contiguous(), mask.contiguous()
        out = torch.empty_like(r)
        shift_k = self.program.shift_k
        shift = r.new_empty(r.shape[0]) if shift_k else None
        if r.shape[0]:
            self._run(
                self.lib.pm_chosen_backward,
                r.data_ptr(),
                shift_k,
                _pointer(shift),
                indices.data_ptr(),
                g.data_ptr(),
                mask.data_ptr(),
                indices.shape[1],
                int(kind == "sigmoid"),
                out.data_ptr(),
                r.shape[0],
            )
        return out


#: The smallest element constant the float linear upward takes (its values would leave float32's range);
#: the double pass of log Z alone (pm_log_z) takes constants down to ``DOUBLE_COEF_MIN``.
FLOAT_COEF_MIN, DOUBLE_COEF_MIN = 2.0**-100, 2.0**-300

#: How far above its nominal value (in nats) the linear upward stores each slot: the stored values of a
#: routing tile then lie in about [e^-75, e^40], inside [2^-120, 2^126] with room for a product of two.
LINEAR_OFFSET = 20.0


def linear_constants(prog: Program) -> tuple[Tensor, float, float, float, float, float, float] | None:
    """What the linear upward of ``c/passes.c`` needs (its comment says how it works), or None when
    the program cannot take it: (c [R] float64, what sigma(r) and sigma(-r) are multiplied by for
    the stored x_i and not x_i, TRUE's stored value, what log Z adds to the log of the root's stored
    value (its b less LINEAR_OFFSET), the nominal logit r0, and k when every model has k true
    variables and the circuit is smooth, else -1: then the C code centres each token's logits on
    r0, which leaves such a distribution unchanged).

    Each slot is stored as exp(value - b + LINEAR_OFFSET), b its log-value at one nominal logit r0
    for every variable: r0 = logit(k / n) with k the mean size of the circuit's models (its
    marginals at logit 0), which is where the (shifted) logits of a routing tile mostly lie, so
    the stored values stay near e^LINEAR_OFFSET. Element row e of node n has the constant
    c_e = exp(b_prime + b_sub - b_n - LINEAR_OFFSET) <= e^-LINEAR_OFFSET (0 for padding rows). None
    when a constant would fall below ``DOUBLE_COEF_MIN`` or the circuit has no model; the float pass
    takes the constants (rounded) only when none is below ``FLOAT_COEF_MIN`` (a circuit too deep or
    too uneven for float32), the double pass of log Z alone takes them all.
    """
    n = prog.n
    zero = torch.zeros(1, n, dtype=torch.float64, device=prog.device)
    up = torch_passes.upward(prog, zero)
    if not torch.isfinite(up.val[-1]).all():
        return None
    marginals = torch_passes.marginals_from_flows(prog, torch_passes.downward(prog, up), torch.sigmoid(zero))
    k = float(marginals.sum()) if n else 0.0
    frac = min(max(k / n, 0.5 / n), 1 - 0.5 / n) if n else 0.5
    r0 = math.log(frac / (1 - frac))
    b = torch_passes.upward(prog, torch.full((1, n), r0, dtype=torch.float64, device=prog.device)).val[:, 0].clone()
    node = torch.empty(prog.num_rows, dtype=torch.long, device=prog.device)  # element row -> its node's slot
    for g in prog.groups:
        node[g.rows] = torch.arange(g.start, g.start + g.nodes, device=prog.device).repeat_interleave(g.fanin)
    log_c = b[prog.prime] + b[prog.sub] - b[node] - LINEAR_OFFSET  # [R]; -inf on padding rows
    real = torch.isfinite(log_c)
    if bool((log_c[real] < math.log(DOUBLE_COEF_MIN)).any()):
        return None
    coef = log_c.exp().cpu().contiguous()
    soft = math.log1p(math.exp(-abs(r0)))  # log sigma(+-r0) = min(+-r0, 0) - soft
    pos, neg = min(r0, 0.0) - soft, min(-r0, 0.0) - soft
    return (
        coef,
        math.exp(LINEAR_OFFSET - pos),
        math.exp(LINEAR_OFFSET - neg),
        math.exp(LINEAR_OFFSET),
        float(b[prog.num_slots - 1]) - LINEAR_OFFSET,
        r0,
        _fixed_cardinality(prog, k),
    )


def _fixed_cardinality(prog: Program, k: float) -> float:
    """k when every model of the (smooth) circuit has k true variables, else -1. With one k,
    log Z at logits a for every variable is log #models + k log sigma(a) + (n - k) log sigma(-a):
    checked in float64 at a = 0 and a = +-(2n + 30), where a model of another size would weigh
    e^(2n + 30) times more or less than one of size k, more than the 2^n models can hide."""
    n, j = prog.n, round(k)
    if not prog.smooth or abs(k - j) > 1e-6:
        return -1.0
    big = 2.0 * n + 30.0
    for a in (-big, big):
        ends = torch.tensor([[0.0] * n, [a] * n], dtype=torch.float64, device=prog.device)
        log_z = torch_passes.upward(prog, ends).val[-1].clone()
        log_sig = torch.nn.functional.logsigmoid(torch.tensor([a, -a], dtype=torch.float64)).tolist()
        want = j * (log_sig[0] - math.log(0.5)) + (n - j) * (log_sig[1] - math.log(0.5))
        if abs(float(log_z[1] - log_z[0]) - want) > 1e-9 * (1 + abs(want)):
            return -1.0
    return float(j)


def _pointer(shift: Tensor | None) -> int | None:
    """The C view of a shift [T, 1] (one float32 per token), or NULL. The callers' shifts are
    contiguous (``Circuit._shift``); a strided one is refused rather than copied to a temporary
    that could be freed before the call."""
    if shift is None:
        return None
    if not shift.is_contiguous() or shift.dtype != torch.float32 or shift.numel() != shift.shape[0]:
        raise ValueError(f"shift must be a contiguous float32 [T, 1] tensor, got {shift.dtype} {list(shift.shape)}")
    return shift.data_ptr()
