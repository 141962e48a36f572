"""A semantic check of a layout: its log-partition at seeded random logits against an
independent computation, so that a cache entry that is well-formed but computes the wrong
function is still caught.

- ``layout_log_partition``: the layout's log Z, a plain numpy upward pass;
- the independent computations: ``cardinality_log_partition`` (a Poisson-binomial dynamic program,
  for ExactlyK / RangeK), ``sdd_log_partition`` (pysdd's own weighted model counter on a stored
  ``circuit.sdd``); the group specs' is ``circuits.compiler.groups.log_partition_reference``, a d-DNNF's
  ``circuits.compiler.nnf.log_partition``;
- ``agree``: the one comparison. Each kind's ``check`` (``circuits.compiler.registry``) puts them together.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..layout import Layout

PROBES = 2


def probe_logits(n: int) -> np.ndarray:
    """Fixed pseudo-random logits [PROBES, n] (float64), the same on every machine."""
    return np.random.default_rng(20260).standard_normal((PROBES, n)) * 1.5


def log_sigmoid(r) -> np.ndarray:
    """log sigmoid(r) elementwise in float64 (numpy), for any array-like r (a CPU tensor too)."""
    return -np.logaddexp(0.0, -np.asarray(r, dtype=np.float64))


def as_logits(r) -> np.ndarray:
    """r [T, n] as a float64 numpy array (a CPU tensor, an array or nested lists)."""
    return np.asarray(r, dtype=np.float64)


def layout_log_partition(layout: Layout, r) -> np.ndarray:
    """log Z of the layout at r [T, n] -> [T] (float64), a plain numpy upward pass: per group
    val[node] = logsumexp over its elements of val[prime] + val[sub]. (Numpy rather than the torch
    passes: torch's float64 exp takes a slow path for results that underflow, 0.7 s for the 10^5
    elements of exactly 128 of 1,024.)"""
    r = as_logits(r)
    val = np.empty((layout.num_slots, r.shape[0]))
    val[0], val[1] = -np.inf, 0.0
    val[2 : 2 + layout.n] = log_sigmoid(r).T
    val[2 + layout.n : 2 + 2 * layout.n] = log_sigmoid(-r).T
    with np.errstate(invalid="ignore", divide="ignore"):
        for s, nodes, fanin, off, _ in layout.groups.tolist():
            kids = layout.children[off : off + nodes * fanin]
            e = (val[kids[:, 0]] + val[kids[:, 1]]).reshape(nodes, fanin, -1)  # [nodes, fanin, T]
            top = e.max(axis=1)  # [nodes, T]
            top[~np.isfinite(top)] = 0.0
            val[s : s + nodes] = top + np.log(np.exp(e - top[:, None]).sum(axis=1))
    return val[-1].copy()


def cardinality_log_partition(r, lo: int, hi: int) -> np.ndarray:
    """log P(lo <= sum x <= hi) for independent Bernoulli(sigmoid(r)): [T, n] -> [T].

    dp[t, j] = log P(j of the variables so far are true), one variable at a time (numpy: the
    arrays are tiny and per-call overhead dominates).
    """
    r = as_logits(r)
    T, n = r.shape
    logp, log1mp = log_sigmoid(r), log_sigmoid(-r)
    dp = np.full((T, hi + 2), -np.inf)
    dp[:, 0] = 0.0
    for i in range(n):
        dp[:, 1:] = np.logaddexp(dp[:, 1:] + log1mp[:, i : i + 1], dp[:, :-1] + logp[:, i : i + 1])
        dp[:, 0] += log1mp[:, i]
    return np.logaddexp.reduce(dp[:, lo : hi + 1], axis=1)


def sdd_log_partition(entry: Path, r) -> np.ndarray:
    """log Z of the SDD stored in ``entry`` by pysdd's WMC (log mode): [T, n] -> [T]."""
    from pysdd.sdd import SddManager, Vtree

    mgr = SddManager.from_vtree(Vtree.from_file(str(entry / "circuit.vtree").encode()))
    root = mgr.read_sdd_file(str(entry / "circuit.sdd").encode())
    out = []
    r = as_logits(r)
    pos, neg = log_sigmoid(r), log_sigmoid(-r)
    for t in range(r.shape[0]):
        wmc = root.wmc(log_mode=True)
        for i in range(r.shape[1]):
            wmc.set_literal_weight(mgr.literal(i + 1), float(pos[t, i]))
            wmc.set_literal_weight(mgr.literal(-i - 1), float(neg[t, i]))
        out.append(wmc.propagate())
    return np.array(out, dtype=np.float64)


def agree(got: np.ndarray, want: np.ndarray, tol: float = 1e-9, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` unless two log Z vectors agree within ``tol`` (relative and absolute, equal
    infinities agree): the one comparison every self-check makes."""
    if not np.allclose(got, want, rtol=tol, atol=tol):
        raise error(f"the layout computes the wrong function (log Z {got.tolist()} != {want.tolist()})")
