"""``probmoe-launch`` (``python -m probmoe.cli.launch``): torchrun, ending on Ctrl-C or SIGTERM as the commands do.

    probmoe-launch --standalone --nproc_per_node 2 -m probmoe.cli.train ...

takes torchrun's arguments and runs its entry point (``torch.distributed.run.main``) in this
process. The ranks run in sessions of their own, so a Ctrl-C reaches torchrun alone; torchrun
forwards the signal to every rank (each ``probmoe-train`` rank stops at a step boundary and rank 0
prints the one line naming the last complete checkpoint), waits for them (``--shutdown_timeout``,
30 s, then SIGKILL), and raises ``SignalException`` out of its entry point, which plain
``torchrun`` reports with a traceback and status 1. Here that ends the launcher with status 128 +
the signal's number (130, 143), as the ranks end, and no output of its own (torchrun's log lines
about the signal left out too). A second signal while torchrun waits makes it send the ranks
SIGTERM (``probmoe-train`` takes that as the same interrupt: it still stops at the step
boundary) and wait again; a stuck rank is SIGKILLed after ``--shutdown_timeout``.

A rank that fails ends the launcher with that rank's status, not torchrun's ``ChildFailedError``
traceback and status 1: a rank's input error is the rank's own one line (rank 0 prints it,
``config_parser.Parser``) and status 2; any other failure adds one line naming the rank and its
status (its own output above says why). ``--nproc_per_node`` is checked first, in one line.
"""

from __future__ import annotations

import logging
import sys

USAGE = "probmoe-launch [torchrun options] (-m MODULE | SCRIPT) [ARGS...]"
NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")  # torchrun's --nproc_per_node besides a count

# torchrun's log lines about the signal, left out: the ranks' line says it (other log lines stay)
QUIET = {
    "torch.distributed.elastic.agent.server.api": "Received %s death signal, shutting down workers",
    "torch.distributed.elastic.multiprocessing.api": "Sending process %s closing signal %s",
}
# torchrun's log line about a failed rank, left out: the rank said why, the launcher says which
FAILED = (
    "torch.distributed.elastic.multiprocessing.api",
    "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s",
)


def _quiet(record: logging.LogRecord) -> bool:
    return record.msg != QUIET.get(record.name) and (record.name, record.msg) != FAILED


def _error(message: str) -> int:
    print(f"probmoe-launch: error: {message} (see torchrun --help)", file=sys.stderr)
    return 2


def parse(argv):
    """torchrun's arguments ``argv`` parsed as torchrun parses them, but a mistake is a ValueError
    (one line: argparse's message) instead of torchrun's usage block and status 2."""
    from torch.distributed.run import get_args_parser

    def refuse(message):
        raise ValueError(message)

    parser = get_args_parser()
    parser.error = refuse
    return parser.parse_args(argv)


def check_nproc(argv) -> str | None:
    """What is wrong with ``--nproc_per_node`` in torchrun's arguments ``argv``, or None."""
    value = parse(argv).nproc_per_node
    try:
        count = int(value)
    except ValueError:
        return (
            None
            if value in NPROC_WORDS
            else f"--nproc_per_node must be a number of processes >= 1 or one of {', '.join(NPROC_WORDS)}, got {value!r}"
        )
    return (
        None
        if count >= 1
        else f"--nproc_per_node must be a number of processes >= 1 (or one of {', '.join(NPROC_WORDS)}), got {count}"
    )


def failed(e) -> int:
    """The status of a run whose rank failed (``ChildFailedError``): the first failed rank's own
    status (128 + the signal that ended it); one line unless it was a rank's input error (status 2,
    which the rank has said in one line).

    A rank that ended with a status of its own caused the failure; ranks ended by a signal are
    usually the ones torchrun stopped because of it (SIGTERM), so they count only when no rank
    ended by itself. Among the causes, the earliest (then the lowest rank) is the one reported."""
    ended_by_themselves = {r: f for r, f in e.failures.items() if f.exitcode > 0}
    causes = ended_by_themselves or e.failures
    rank, failure = min(causes.items(), key=lambda item: (item[1].timestamp, item[0]))
    code = failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    if code != 2:
        how = f"status {code}" if failure.exitcode > 0 else f"signal {-failure.exitcode}"
        print(f"probmoe-launch: rank {rank} failed ({how}); its output above says why", file=sys.stderr)
    return code


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        return _error(f"give torchrun's options and what to run: {USAGE}")
    try:
        return _launch(argv)
    except KeyboardInterrupt:  # a Ctrl-C before torchrun handles signals itself (torch.distributed loading)
        print("interrupted (SIGINT) before torchrun started the ranks", file=sys.stderr)
        return 130


def _launch(argv) -> int:
    """The checks, then torchrun on ``argv``, its ending mapped as the module says."""
    try:
        problem = check_nproc(argv)
    except ValueError as e:  # torchrun's own argument errors, in one line
        return _error(str(e))
    if problem is not None:
        return _error(problem)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    for name in QUIET:
        logging.getLogger(name).addFilter(_quiet)
    try:
        torchrun(argv)
    except SignalException as e:
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        return failed(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
