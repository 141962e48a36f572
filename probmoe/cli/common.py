"""What the three commands share: argument types, the method and data flags, and clean exits on bad input."""

from __future__ import annotations

import argparse
import sys

METHODS = ("conventional", "frozen", "densemixer", "probmoe", "probmoe-dynamic", "sample-dense-ste",
           "topk-marginal", "defaultmoe", "sparsemixer", "remoe", "probmoe-grouped")  # probmoe.integrations.transformers.ALL_METHODS (checked in the tests)


def _bounded(convert, what: str, low: float, inclusive: bool):
    """An argparse type: ``convert(text)``, finite, >= ``low`` (> ``low`` unless ``inclusive``)."""
    bound = f"{'>=' if inclusive else '>'} {low:g}"

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} {bound}, got {text!r}") from None
        if not (value >= low if inclusive else value > low) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be {what} {bound} (finite), got {text}")
        return value
    return parse


positive_int = _bounded(int, "an integer", 1, True)
nonnegative_int = _bounded(int, "an integer", 0, True)
nonnegative_float = _bounded(float, "a number", 0, True)
positive_float = _bounded(float, "a number", 0, False)


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


def add_data_format_flag(parser: argparse.ArgumentParser) -> None:
    """--data-format (default: told by the data's fields)."""
    from probmoe.experiments.formats import FORMATS

    parser.add_argument("--data-format", choices=tuple(FORMATS), help="the records' format (default: told by their "
                        "fields; see docs/experiments.md, Data)")


DTYPES = ("float32", "bfloat16", "float16")


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype (weights of the evaluated model), --overwrite, --no-progress."""
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: CUDA when present")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="the weights' dtype (default float32)")
    parser.add_argument("--overwrite", action="store_true", help="replace results already in the output folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (ours, transformers', datasets')")


def device(name: str | None) -> str:
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return name or ("cuda" if torch.cuda.is_available() else "cpu")


def check_output_folder(path: str, files: tuple[str, ...], overwrite: bool) -> str:
    """``path``, checked as the folder for ``files`` before any model is loaded (the caller creates
    it once loading has succeeded, so a failure leaves no empty folder): ValueError if it is not
    a folder, or already holds one of ``files`` and ``overwrite`` is off."""
    import os

    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--output {path!r} exists and is not a directory")
    taken = [f for f in files if os.path.exists(os.path.join(path, f))]
    if taken and not overwrite:
        raise ValueError(f"--output {path!r} already holds {', '.join(taken)}; pass --overwrite or choose another "
                         "folder")
    return path


def quiet_progress(no_progress: bool) -> None:
    """--no-progress: turn off the progress bars of transformers (loading, writing), the hub and
    datasets in this process too, not only ours."""
    if not no_progress:
        return
    import datasets
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging

    logging.disable_progress_bar()
    disable_progress_bars()
    datasets.disable_progress_bars()


def require_extras(parser: argparse.ArgumentParser) -> None:
    """Exit with status 2 and the install command when the ``transformers`` extra is missing."""
    import importlib.util

    missing = [name for name in ("transformers", "tqdm", "datasets") if importlib.util.find_spec(name) is None]
    if missing:
        parser.error(f"needs {' and '.join(missing)}: pip install 'probmoe[transformers]'")


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
