"""What the experiment commands and the tools share about their inputs: argument types that name
the allowed range, the device, the output folder check, and clean exits on bad input.

The option lists themselves (every flag of ``probmoe-train``, ``probmoe-eval``,
``probmoe-analyze``) are the dataclasses of ``run_config``.
"""

from __future__ import annotations

import argparse
import os
import sys

from probmoe._validate import Number

DTYPES = ("float32", "bfloat16", "float16")  # the weights' dtypes of an evaluated model
DEVICES = ("cpu", "cuda")


class IntRange(Number):
    """An integer from ``low`` to ``high``, both included: a ``Number`` whose messages name both ends."""

    def __init__(self, low: int, high: int):
        super().__init__(int, low)
        self.high = high
        self.bound = f"from {low} to {high}"
        self.__name__ = f"int {self.bound}"

    def _ok(self, value) -> bool:
        return super()._ok(value) and value <= self.high

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer {self.bound}, got {text!r}") from None
        if not self._ok(value):
            raise argparse.ArgumentTypeError(f"must be an integer {self.bound}, got {value}")
        return value


positive_int = Number(int, 1)  # argparse types that name the allowed range, and the fields' checks
nonnegative_int = Number(int, 0)
nonnegative_float = Number(float, 0)
positive_float = Number(float, 0, inclusive=False)
SEED = IntRange(0, 2**32 - 1)  # what every RNG seeded from --seed takes (NumPy's is the narrowest)


def device(name: str | None) -> str:
    """``name`` ("cpu", "cuda" or None: CUDA when present), checked against the machine."""
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return name or ("cuda" if torch.cuda.is_available() else "cpu")


def check_output_folder(path: str, files: tuple[str, ...], overwrite: bool) -> str:
    """``path``, checked as the folder for ``files`` before any model is loaded (the caller creates
    it once loading has succeeded, so a failure leaves no empty folder): ValueError if it is not
    a folder, or already holds one of ``files`` and ``overwrite`` is off."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--output {path!r} exists and is not a directory")
    taken = [f for f in files if os.path.exists(os.path.join(path, f))]
    if taken and not overwrite:
        raise ValueError(
            f"--output {path!r} already holds {', '.join(taken)}; pass --overwrite or choose another folder"
        )
    return path


def run_or_exit(parser: argparse.ArgumentParser, body):
    """Call ``body()``; a ValueError or FileNotFoundError from checking the inputs becomes
    ``parser.error`` (status 2, one line); a Ctrl-C outside ``interrupts.catch()`` (the tools),
    one line and status 130 (the commands say more: ``interrupts.ended``)."""
    try:
        return body()
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))
    except KeyboardInterrupt:
        print("interrupted (SIGINT); nothing more was written", file=sys.stderr)
        sys.exit(130)


def named(specs: list[str]) -> dict[str, str]:
    """{name: directory} from ``--checkpoint [NAME=]DIR`` arguments; the name defaults to the folder's name."""
    runs = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or os.path.isdir(spec):
            name, path = os.path.basename(os.path.normpath(spec)), spec
        if name in runs:
            raise ValueError(f"--checkpoint: two runs are named {name!r}; name them NAME=DIR")
        runs[name] = path
    return runs


def data_sets(specs: list[str]) -> dict[str, str]:
    """{name: file} from ``--data [NAME=]FILE`` arguments; the name defaults to the file's name without suffix."""
    sets = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or os.path.isfile(spec):
            name, path = os.path.splitext(os.path.basename(spec))[0], spec
        if name in sets:
            raise ValueError(f"--data: two data sets are named {name!r}; name them NAME=FILE")
        sets[name] = path
    return sets
