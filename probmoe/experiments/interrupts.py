"""SIGINT and SIGTERM for the experiment commands: stop at a step boundary, never mid-write.

Inside ``catch()`` the two signals no longer raise ``KeyboardInterrupt`` (or kill the process)
wherever they land. Outside a ``deferred()`` block (loading, checking) nothing is being written,
so a signal raises ``Interrupted`` at once. Inside one (the training loop and its saves) it only
records the signal: the loop asks ``requested()`` between steps and stops there, and a save
under way finishes. A second Ctrl-C (SIGINT) inside the block raises ``Interrupted`` at once:
the way out of a stuck step; a save it cuts short is discarded (``state.save``). torchrun
forwards the signal it gets to every rank (a second one as SIGTERM); a launcher that leaves the
ranks in the terminal's process group delivers a Ctrl-C twice, from the terminal and forwarded: a
SIGINT within ``SAME_PRESS_S`` of the first, or a SIGTERM, is not a second press. Signals after
the one that ended the command change nothing. ``probmoe.cli.launch`` is torchrun ending as the
ranks do (status 130/143, no traceback).

The command maps ``Interrupted`` to status 128 + the signal number (130 for SIGINT, 143 for
SIGTERM, as a shell reports a process the signal ended) and one line: ``message`` for
``probmoe-train``, ``ended`` for ``probmoe-eval`` and ``probmoe-analyze`` (no ``deferred()``
block there: they stop at once and say what they had written).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
SAME_PRESS_S = 1.0  # a SIGINT this soon after the first is the same Ctrl-C, forwarded by torchrun
_state = {"installed": False, "deferring": False, "signum": None, "at": 0.0}


class Interrupted(BaseException):
    """A SIGINT or SIGTERM ended the command. A BaseException, as ``KeyboardInterrupt`` is, so no
    ``except Exception`` on the way up swallows it. ``step``: the last step completed (None: before
    training started); ``at_boundary``: every rank stopped after that step (none is mid-collective)."""

    def __init__(self, signum: int, step: int | None = None, at_boundary: bool = False):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.step, self.at_boundary = signum, step, at_boundary

    @property
    def status(self) -> int:
        """The exit status a shell shows for a process this signal ended: 128 + its number."""
        return 128 + self.signum


def _handler(signum, frame) -> None:
    now = time.monotonic()
    if _state["signum"] is None:  # the first signal
        _state.update(signum=signum, at=now)
        if not _state["deferring"]:
            raise Interrupted(signum)
    elif _state["deferring"] and signum == signal.SIGINT and now - _state["at"] >= SAME_PRESS_S:
        raise Interrupted(_state["signum"])  # the second Ctrl-C: out now
    # else: the same press again, or the command is on its way out already


@contextmanager
def catch():
    """Handle SIGINT and SIGTERM as the module says until the block ends, then restore the previous
    handlers. Inside another ``catch()`` (a command's whole run holds one from its first line) and
    off the main thread (where Python cannot set handlers) it changes nothing."""
    if _state["installed"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    _state.update(installed=True, deferring=False, signum=None)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state.update(installed=False, deferring=False, signum=None)


@contextmanager
def deferred():
    """Inside ``catch()``: the first signal is recorded for ``requested()`` instead of raising (a
    second Ctrl-C, ``SAME_PRESS_S`` or more later, still raises)."""
    if not _state["installed"]:
        yield
        return
    _state["deferring"] = True
    try:
        yield
    finally:
        _state["deferring"] = False


def requested() -> int | None:
    """The number of the first signal received inside ``deferred()``, or None."""
    return _state["signum"]


def message(error: Interrupted, last_checkpoint: str | None) -> str:
    """The one line a command prints for ``error``: where it stopped, and what to run next."""
    where = f"interrupted ({signal.Signals(error.signum).name})" + (
        f" after step {error.step}" if error.step is not None else ""
    )
    if last_checkpoint is None:
        return f"{where}; no checkpoint was written: run the command again to start over"
    return (
        f"{where}; the last complete checkpoint is {last_checkpoint}: run the same command with --resume latest "
        "to continue from it"
    )


def report(error: Interrupted, output_dir: str | None) -> int:
    """What a command does with ``error``: rank 0 prints ``message`` (naming the newest checkpoint in
    ``output_dir``, None before the command line is read), every rank leaves the process group
    (waiting for the others only when they all stopped at the same step boundary); returns the exit
    status."""
    from . import distributed, state

    if os.environ.get("RANK", "0") == "0":
        last = state.latest_checkpoint(output_dir) if output_dir is not None else None
        print(message(error, last), file=sys.stderr, flush=True)
    distributed.teardown(barrier=error.at_boundary)
    return error.status


def ended(error: Interrupted, doing: str, written: str) -> int:
    """What ``probmoe-eval`` and ``probmoe-analyze`` do with ``error``: one line, ``interrupted
    (SIGINT) while <doing>; <written>``; returns the exit status."""
    print(f"interrupted ({signal.Signals(error.signum).name}) while {doing}; {written}", file=sys.stderr, flush=True)
    return error.status


def run_or_end(body, doing: str, written) -> int:
    """``body()`` (its exit status) inside ``catch()``; a signal ends it with ``ended``'s one line,
    ``written()`` saying what had been written by then."""
    with catch():
        try:
            return body()
        except Interrupted as e:
            return ended(e, doing, written())


def after_writing(what: str, where: str) -> int:
    """After writing ``what`` into ``where`` inside ``deferred()``: 0, or, when a signal came
    meanwhile, ``ended``'s line (the files are whole) and the signal's status."""
    signum = requested()
    return 0 if signum is None else ended(Interrupted(signum), f"writing {what}", f"it is complete in {where}")
