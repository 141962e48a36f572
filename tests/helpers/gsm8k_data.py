"""The real GSM8K files beside the checkout (../shared/data/gsm8k), for the experiment tests."""

import itertools
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def lines(name: str, count: int) -> list[str]:
    """The first ``count`` lines of ``name`` (train.jsonl, test.jsonl); skips the test if the data is absent."""
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"GSM8K data not found at {path} (the shared data folder beside the checkout)")
    with open(path, encoding="utf-8") as f:
        return list(itertools.islice(f, count))


def write(tmp_path: Path, name: str, count: int) -> str:
    """A JSON-lines file in ``tmp_path`` holding the first ``count`` problems of ``name``."""
    out = tmp_path / f"{Path(name).stem}-{count}.jsonl"
    out.write_text("".join(lines(name, count)), encoding="utf-8")
    return str(out)
