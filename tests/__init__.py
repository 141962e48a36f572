"""The test suite, as packages: a module is tests.<folder>.<module>, so the folders named after the code's
packages (tests/circuits, tests/probmoe) never stand in for them on sys.path. Shared helpers live in
tests/helpers, which pytest puts on sys.path (pyproject.toml)."""
