"""The constraint kinds of the library, one module each with everything about them (the interface
they implement and the registry: ``circuits.compiler.registry``; their public home: ``circuits.spec``).

cardinality.py  ExactlyK, RangeK
grouped.py      GroupLimited, GroupCapacity
files.py        SddFile, CnfFile (and what files share: paths, digest, the stored circuit's check)
"""

# registered in this order (``KINDS``, the kinds' names in messages), whichever module is imported first
from . import cardinality, files, grouped  # noqa: F401
