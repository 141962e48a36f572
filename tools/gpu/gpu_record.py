"""A pytest plugin for the device check: one JSON line per test outcome, written as each test
ends, so that a run stopped by the check's time budget still reports every test it finished.

    python -m pytest -p gpu_record --record-to=FILE --record-suite=NAME ...

(tools/gpu on PYTHONPATH). Each line: {"suite", "test", "outcome": passed | failed | skipped |
error, "seconds", "message"} where message is the skip reason or the failure's last line.
"""

from __future__ import annotations

import json

_CONFIG: dict = {}  # --record-to and --record-suite, read once


def pytest_addoption(parser):
    parser.addoption("--record-to", help="append one JSON line per test outcome to this file")
    parser.addoption("--record-suite", default="tests", help="the suite name written on each line")


def _message(report) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])  # (file, line, reason)
    if report.failed:
        text = getattr(report, "longreprtext", "") or str(report.longrepr)
        lines = [line for line in text.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""
    return ""


def pytest_runtest_logreport(report):
    """The call phase of each test, or the setup / teardown phase where it did not pass (a skip
    in setup, a fixture's error)."""
    if report.when != "call" and report.passed:
        return
    path = _CONFIG.get("path")
    if not path:
        return
    outcome = report.outcome if report.when == "call" or report.skipped else "error"
    line = dict(
        suite=_CONFIG["suite"],
        test=report.nodeid,
        outcome=outcome,
        seconds=round(report.duration, 3),
        message=_message(report),
    )
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def pytest_configure(config):
    _CONFIG["path"] = config.getoption("--record-to")
    _CONFIG["suite"] = config.getoption("--record-suite")
