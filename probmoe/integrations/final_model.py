"""``final_model.json``: the record ``probmoe-train`` writes beside the final model in its output
folder, last (``experiments.state.save_final``), and the check every loader of such a folder runs.

    {"format": "probmoe-final-model", "step": 200, "sha256": {"model.safetensors": "9f86d0...", ...}}

``verify(directory)`` hashes each file the record lists once (1 MiB at a time) and refuses, in one
``ValueError`` naming the file, one that is missing or does not match its recorded sha256, before
any weights are read: ``from_pretrained``, ``probmoe-eval``, ``probmoe-analyze`` and
``probmoe-train --model DIR`` call it. A folder without the record (any other checkpoint) passes.
No library is imported here.
"""

from __future__ import annotations

import hashlib
import json
import os

FILENAME = "final_model.json"
FORMAT = "probmoe-final-model"
REPAIR = "rerun the run's probmoe-train command with --resume latest to write the final model again"


def sha256_file(path: str) -> str:
    """The hex sha256 of the file at ``path``, read 1 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read(directory: str) -> dict:
    """The record in ``directory``. FileNotFoundError when there is none; ValueError("unreadable")
    or ValueError("malformed") when it is not a record ``save_final`` wrote (its sha256: {file name
    in ``directory``: hex digest}, not empty)."""
    path = os.path.join(directory, FILENAME)
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        raise
    except (OSError, ValueError):
        raise ValueError("unreadable") from None
    sums = record.get("sha256") if isinstance(record, dict) else None
    if (
        not isinstance(record, dict)
        or record.get("format") != FORMAT
        or not isinstance(sums, dict)
        or not sums
        or not all(isinstance(name, str) and os.path.basename(name) == name for name in sums)
    ):
        raise ValueError("malformed")
    return record


def verify(directory) -> None:
    """Every file ``directory``'s record lists is there and matches its recorded sha256 (nothing to
    check without a record); ValueError naming the first that is not, or the record itself."""
    directory = os.fspath(directory)
    try:
        record = read(directory)
    except FileNotFoundError:
        return
    except ValueError as e:
        raise ValueError(
            f"{os.path.join(directory, FILENAME)} is {e}: the final model beside it cannot be checked; {REPAIR}"
        ) from None
    for name, digest in sorted(record["sha256"].items()):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise ValueError(f"{path} is missing, though {FILENAME} beside it records its sha256; {REPAIR}")
        if sha256_file(path) != digest:
            raise ValueError(
                f"{path} does not match its recorded sha256 in {FILENAME} (damaged or modified since it was "
                f"written); {REPAIR}"
            )
