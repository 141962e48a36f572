"""What the three commands share beyond their options (``probmoe.experiments.run_config``): the
extras check and the quieting of other libraries' progress bars."""

from __future__ import annotations

import argparse
import importlib.util


def quiet_progress(no_progress: bool) -> None:
    """--no-progress: turn off the progress bars of transformers (loading, writing weights), the hub
    and datasets in this process too, not only ours (the harness's: ``ProbMoELM(progress=False)``)."""
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
    missing = [name for name in ("transformers", "tqdm", "datasets") if importlib.util.find_spec(name) is None]
    if missing:
        parser.error(f"needs {' and '.join(missing)}: pip install 'probmoe[transformers]'")


def progress_bar(enabled: bool):
    """``progress(iterable, desc)``: a tqdm bar over ``iterable``, or none."""
    from tqdm.auto import tqdm

    def progress(iterable, desc):
        return tqdm(iterable, desc=desc, disable=not enabled, dynamic_ncols=True)

    return progress
