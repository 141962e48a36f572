"""The console scripts of pyproject.toml's ``[project.scripts]``: ``probmoe-train``, ``-eval``,
``-analyze``, ``-launch``, ``-compile`` and ``-inspect`` start here, outside the ``probmoe`` and
``circuits`` packages, so that a Ctrl-C in their first moment is one line too (issue 48, point 7).

A command's own module imports ``probmoe`` (torch: seconds on a busy machine) or ``circuits``
before any of its code runs. This module imports nothing but the standard library's ``importlib``,
``os`` and ``signal``; each entry puts in place SIGINT and SIGTERM handlers that print the line
the command prints when interrupted while starting and end the process with status 128 + the
signal's number (130, 143) by ``os._exit`` (an exception raised while torch's C++ code loads can
abort the process instead), then imports the command and calls its ``main``:

- ``probmoe-train``, ``-eval`` and ``-analyze`` handle the signals themselves from the first line
  of ``main`` (``probmoe.experiments.interrupts.catch``), which puts these handlers back when it
  ends; they are kept until ``main`` returns.
- ``probmoe-launch``, ``-compile`` and ``-inspect`` take a Ctrl-C as Python's
  ``KeyboardInterrupt`` (``probmoe-launch`` until torchrun handles the signals, ``probmoe-compile``
  while it compiles), so the handlers found at start are put back before ``main`` runs.

A signal ignored at start (a job started in the background by a shell without job control)
stays ignored while the command loads. ``python -m probmoe.cli.train`` (torchrun's ranks) does
not pass through here.
"""

from __future__ import annotations

import importlib
import os
import signal

SIGNALS = (signal.SIGINT, signal.SIGTERM)

# what each command prints when a signal ends it before it has done anything (as its own code says it)
STARTING = {
    "probmoe-train": "interrupted ({signal}); no checkpoint was written: run the command again to start over",
    "probmoe-eval": "interrupted ({signal}) while starting; nothing was written",
    "probmoe-analyze": "interrupted ({signal}) while starting; nothing was written",
    "probmoe-launch": "interrupted ({signal}) before torchrun started the ranks",
    "probmoe-compile": "probmoe-compile: interrupted ({signal}) while starting; nothing was cached",
    "probmoe-inspect": "probmoe-inspect: interrupted ({signal}) while starting; nothing was written",
}


def _ender(command: str):
    """The handler that ends ``command`` at once: its line on stderr (``probmoe-train`` prints it on
    rank 0 only, as the command does), status 128 + the signal's number."""

    def end(signum, frame):
        if command != "probmoe-train" or os.environ.get("RANK", "0") == "0":
            line = STARTING[command].format(signal=signal.Signals(signum).name)
            os.write(2, (line + "\n").encode())
        os._exit(128 + signum)

    return end


def _install(command: str) -> dict:
    """Put ``command``'s handlers in place for the signals not ignored; returns the handlers found."""
    previous = {}
    for s in SIGNALS:
        found = signal.getsignal(s)
        if found is not signal.SIG_IGN:
            previous[s] = signal.signal(s, _ender(command))
    return previous


def _restore(previous: dict) -> None:
    for s, handler in previous.items():
        signal.signal(s, handler)


def _run(command: str, module: str, name: str, handles_signals: bool) -> int:
    """Import ``module`` with ``command``'s handlers in place, then return ``module.name()``."""
    previous = _install(command)
    try:
        main = getattr(importlib.import_module(module), name)
        if not handles_signals:
            _restore(previous)
        return main()
    finally:
        _restore(previous)


def train_main() -> int:
    """``probmoe-train`` (``probmoe.cli.train``)."""
    return _run("probmoe-train", "probmoe.cli.train", "main", handles_signals=True)


def eval_main() -> int:
    """``probmoe-eval`` (``probmoe.cli.evaluate``)."""
    return _run("probmoe-eval", "probmoe.cli.evaluate", "main", handles_signals=True)


def analyze_main() -> int:
    """``probmoe-analyze`` (``probmoe.cli.analyze``)."""
    return _run("probmoe-analyze", "probmoe.cli.analyze", "main", handles_signals=True)


def launch_main() -> int:
    """``probmoe-launch`` (``probmoe.cli.launch``)."""
    return _run("probmoe-launch", "probmoe.cli.launch", "main", handles_signals=False)


def compile_main() -> int:
    """``probmoe-compile`` (``circuits.inspect.cli``)."""
    return _run("probmoe-compile", "circuits.inspect.cli", "compile_main", handles_signals=False)


def inspect_main() -> int:
    """``probmoe-inspect`` (``circuits.inspect.cli``)."""
    return _run("probmoe-inspect", "circuits.inspect.cli", "inspect_main", handles_signals=False)
