"""What the three commands share: argument types, the method flags, and clean exits on bad input."""

from __future__ import annotations

import argparse
import sys

METHODS = ("conventional", "frozen", "densemixer", "probmoe", "probmoe-dynamic", "sample-dense-ste",
           "topk-marginal")  # probmoe.integrations.transformers.METHODS (checked in the tests)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = nonnegative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be a number > 0, got 0")
    return value


def add_routing_flags(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """--method, --k, --kmin, --kmax, --backend, --grad (as ``patch_model``'s arguments)."""
    parser.add_argument("--method", choices=METHODS, required=required, default=None,
                        help="routing method (see docs/transformers.md)")
    parser.add_argument("--k", type=positive_int, help="experts per token of the exactly-k ProbMoE methods "
                        "(default: the model's top-k)")
    parser.add_argument("--kmin", type=positive_int, help="fewest experts per token (probmoe-dynamic; default 1)")
    parser.add_argument("--kmax", type=positive_int, help="most experts per token (probmoe-dynamic; default: the "
                        "model's top-k)")
    parser.add_argument("--backend", choices=("circuit", "dp"), default="circuit",
                        help="exact backend of the ProbMoE methods")
    parser.add_argument("--grad", choices=("exact", "paper"), default="exact",
                        help="gradient of the marginals: exact Cov(z), or the paper's Cov(z) diag(1 - p)")


def run_or_exit(parser: argparse.ArgumentParser, body):
    """Call ``body()``; a ValueError or FileNotFoundError from checking the inputs becomes
    ``parser.error`` (status 2, one line)."""
    try:
        return body()
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
