"""Command-line front ends: ``probmoe-train``, ``probmoe-eval``, ``probmoe-analyze``.

Each parses and checks its flags, then calls ``probmoe.experiments``; a bad argument or input
file exits with status 2 and one line naming it, before any model is built or trained.
"""
