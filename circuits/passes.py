"""The circuit passes' public face: ``select`` (the one place that picks an implementation, for a
circuit's ``Program``, the DP's ``Lattice`` or ``Rows``), ``describe``, and the implementations it
picks from. All defined in ``circuits.kernels`` (``circuits.kernels.select`` and the modules it
names); this module only names them for other packages."""

from .kernels.select import (
    IMPLEMENTATIONS,
    CPasses,
    Passes,
    Program,
    RowOps,
    Rows,
    TorchPasses,
    describe,
    draw_uniforms,
    select,
)

__all__ = [
    "IMPLEMENTATIONS",
    "CPasses",
    "Passes",
    "Program",
    "RowOps",
    "Rows",
    "TorchPasses",
    "describe",
    "draw_uniforms",
    "select",
]
