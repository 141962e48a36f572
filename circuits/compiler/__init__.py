"""The compile side of ``circuits``: a constraint spec into the level layout (``circuits.layout``)
the evaluators take, with numpy and pysdd and without torch. Nothing here imports the evaluation
side (``circuits.kernels``, ``circuits.ops``, the evaluators).

    registry.py     Spec (the interface of a constraint kind) and the registry of kinds
    kinds/          one module per kind: cardinality.py, grouped.py, files.py
    compile.py      compile_entry: from the cache, or compiled by "direct", "d4" or "pysdd", checked
    count_tree.py   the counting specs' circuits built directly from their structure ("direct")
    dag.py          Dag: OR-of-pairs nodes, laid out by height and fan-in bucket
    groups.py       the counting specs as pysdd SDDs over the group vtree; the group specs' DP
    cnf.py          d4 on a DIMACS file (the ``cnf`` extra), in a child process
    nnf_parse.py    d4's NNF text read into arrays and checked
    nnf.py          the d-DNNF flattened into a Layout ("d4")
    estimate.py     the size and compile-cost estimate by arithmetic, and the size limit
    self_check.py   a layout's log Z at probe logits against an independent computation
    file_checks.py  DIMACS, .sdd and .vtree files checked before a C library reads them
    cache.py        the verified, atomically written cache entries

Nothing is imported here.
"""
