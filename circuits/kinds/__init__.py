"""The constraint kinds of the library, one module each with everything about them (the interface
they implement and the registry: ``circuits.registry``; their public home: ``circuits.spec``).

cardinality.py  ExactlyK, RangeK
grouped.py      GroupLimited, GroupCapacity
files.py        SddFile, CnfFile (and what files share: paths, digest, the stored circuit's check)
"""
