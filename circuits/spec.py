"""Constraint specs: what a circuit encodes. The public home of their names.

A spec is an immutable, hashable value of a registered kind (``circuits.compiler.kinds``): its module says
how it compiles, estimates, caches (its ``key`` names its cache entry, ``spec_to_dict`` its JSON
form) and describes itself.

- ``ExactlyK(n, k)``: exactly k of the n variables are true.
- ``RangeK(n, kmin, kmax)``: between kmin and kmax (inclusive) are true.
- ``SddFile(sdd, vtree)``: any SDD saved by pysdd / libsdd (``.sdd`` + ``.vtree``).
- ``CnfFile(path)``: any CNF in DIMACS format, compiled by d4 (or pysdd on a balanced vtree).
- ``GroupLimited(n, k, groups, max_groups)``: exactly k (or kmin..kmax) true, all of them in at
  most ``max_groups`` of the contiguous groups (optionally also at most ``capacity`` per group).
- ``GroupCapacity(n, k, groups, capacity)``: exactly k (or kmin..kmax) true, at most ``capacity``
  in each group (optionally also in at most ``max_groups`` groups).

``Spec`` is the interface every kind implements and ``register`` adds a kind (``circuits.compiler.registry``);
``spec_to_dict`` describes a spec as JSON; ``spec_from_dict`` rebuilds (and re-validates) the
counting specs from such a dict.
"""

from __future__ import annotations

from .compiler.kinds.cardinality import ExactlyK, RangeK
from .compiler.kinds.files import CnfFile, SddFile
from .compiler.kinds.grouped import GroupCapacity, GroupLimited, group_model_count
from .compiler.registry import Spec, register, spec_from_dict, spec_to_dict

GROUP_SPECS = (GroupLimited, GroupCapacity)
CARDINALITY_SPECS = (ExactlyK, RangeK)  # what the cardinality DP (circuits.CardinalityDP) also evaluates
SPECS = (*CARDINALITY_SPECS, *GROUP_SPECS, SddFile, CnfFile)  # the library's kinds

__all__ = [
    "CARDINALITY_SPECS",
    "GROUP_SPECS",
    "SPECS",
    "CnfFile",
    "ExactlyK",
    "GroupCapacity",
    "GroupLimited",
    "RangeK",
    "SddFile",
    "Spec",
    "group_model_count",
    "register",
    "spec_from_dict",
    "spec_to_dict",
]
