"""Command-line front ends: ``probmoe-train``, ``probmoe-eval``, ``probmoe-analyze``.

Each parses its options (flags generated from ``probmoe.experiments.run_config``, and
``--config`` files) and checks them, then calls the library (``probmoe.experiments``,
``probmoe.eval``, ``probmoe.analysis``); a bad argument or input file exits with status 2 and one
line naming it, before any model is built or trained.
"""
