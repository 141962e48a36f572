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
boundary) and wait again; a stuck rank is SIGKILLed after ``--shutdown_timeout``. Anything else
(a rank that fails) is torchrun's own report and status.
"""

from __future__ import annotations

import logging
import sys

# torchrun's log lines about the signal, left out: the ranks' line says it (other log lines stay)
QUIET = {"torch.distributed.elastic.agent.server.api": "Received %s death signal, shutting down workers",
         "torch.distributed.elastic.multiprocessing.api": "Sending process %s closing signal %s"}


def _quiet(record: logging.LogRecord) -> bool:
    return record.msg != QUIET.get(record.name)


def main(argv=None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    for name in QUIET:
        logging.getLogger(name).addFilter(_quiet)
    try:
        torchrun(argv)
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
