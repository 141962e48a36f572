"""One run at a time in an output folder: ``probmoe-train`` holds an exclusive lock
(``fcntl.flock``) on ``<output-dir>/.probmoe-train.lock`` from its first look at the folder to
its end, so a second run started on the same folder stops at once with one line, before it reads
or writes anything there, instead of interleaving its log, config.yaml and checkpoints with the
first's.

Under torchrun the ranks of one launch share the folder: rank 0 alone takes the lock (the
processes then agree on the outcome, ``distributed.agree``), so a second launch's rank 0 is
refused and its ranks stop with it. The kernel releases the lock when the process ends, however it
ends; the file a killed run leaves holds no lock and is not counted as content (``NAME``).
``release`` removes the file while still holding it (a run that opened it meanwhile sees that it
was replaced, and opens the new one) and then the folders ``acquire`` created, if they are still
empty, so a run refused by a later check leaves nothing behind. On a file system without
``flock`` the run goes on unlocked after a one-line warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from dataclasses import dataclass

NAME = ".probmoe-train.lock"


@dataclass
class Lock:
    """A held lock: the open lock file ``fd`` at ``path``, and the folders ``acquire`` made for it
    (deepest first)."""

    fd: int
    path: str
    created: list[str]


def _missing(directory: str) -> list[str]:
    """``directory`` and those of its parents that do not exist, deepest first."""
    missing, path = [], os.path.abspath(directory)
    while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _holder(path: str) -> str:
    """What the lock file at ``path`` says of the run holding it: `` (pid N on HOST)``, or nothing."""
    try:
        with open(path, encoding="utf-8") as f:
            pid, host = f.read().split()
    except (OSError, ValueError):
        return ""
    return f" (pid {pid} on {host})"


def acquire(directory: str) -> Lock:
    """Lock the output folder ``directory`` for this run, creating it if need be; ValueError naming
    ``--output-dir`` when another run holds it or it cannot be written."""
    created = _missing(directory)
    path = os.path.join(directory, NAME)
    while True:
        try:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the run that held it removed the empty folder meanwhile: again
            continue
        except OSError as e:
            raise ValueError(f"--output-dir {directory!r} cannot be written ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(
                f"--output-dir {directory!r} is in use: another probmoe-train run holds it{_holder(path)}; "
                "wait for it to end, or choose another folder"
            ) from None
        except OSError as e:
            print(
                f"warning: --output-dir {directory!r} cannot be locked ({e.strerror or e}): a second run "
                "started on it would not be stopped",
                file=sys.stderr,
            )
            return Lock(fd, path, created)
        try:
            current = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            current = False
        if current:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            return Lock(fd, path, created)
        os.close(fd)  # the run that held it ended and removed the file as this one opened it: again


def release(lock: Lock | None) -> None:
    """Remove the lock file and let go of it, then remove the folders ``acquire`` created that
    are still empty (a run stopped before writing anything leaves none)."""
    if lock is None:
        return
    with contextlib.suppress(FileNotFoundError):  # removed by hand
        os.unlink(lock.path)
    os.close(lock.fd)
    for folder in lock.created:
        try:
            os.rmdir(folder)
        except OSError:  # the run wrote into it
            break


def content(directory: str) -> list[str]:
    """The names in ``directory`` but the lock file: what makes an output folder not empty."""
    return [name for name in os.listdir(directory) if name != NAME]
