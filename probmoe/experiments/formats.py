"""Supervised fine-tuning data: four record formats in JSON lines, JSON or Parquet, read through
``datasets`` and checked record by record before any training starts.

    format              fields                              loss on (``data.encode``)
    question-answer     question, answer (strings)          the answer and eos (GSM8K's format)
    prompt-completion   prompt, completion (strings)        the completion and eos
    messages            messages: [{role, content}, ...]    the assistant turns (the chat template)
    text                text (string)                       every token and eos

The format follows from the fields (``detect``: exactly one format's fields must be there), or
is given (``--data-format``); other fields are kept and ignored. Files: ``.jsonl`` (one JSON
object per line, blank lines skipped), ``.json`` (an array of objects, or JSON lines) and
``.parquet``. A malformed record is named by file and line (``train.jsonl:12``), or by record
index from 0 in a JSON array or a Parquet file (``train.parquet: record 3``). Arrow infers the
types of a JSON file: a field that is a string on one line and a number on the next fails to
load, and a date-like string ("2020-01-01") comes back as a timestamp. So a JSON file whose
``datasets`` reading fails or does not check out is read again with Python's ``json``, which
keeps the strings as written and names the record at fault.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass

FORMATS = {
    "question-answer": ("question", "answer"),
    "prompt-completion": ("prompt", "completion"),
    "messages": ("messages",),
    "text": ("text",),
}
SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}  # file suffix -> datasets builder


@dataclass
class Records:
    """The checked records of a data file: ``rows`` [dict] in file order, all of ``format``;
    ``lines`` the line of each row (JSON lines) or None (rows named by index)."""

    path: str
    format: str | None  # None only until ``read`` has detected it
    rows: list[dict]
    lines: list[int] | None

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, index: int) -> str:
        """``path:line`` or ``path: record index`` of row ``index``."""
        return f"{self.path}:{self.lines[index]}" if self.lines is not None else f"{self.path}: record {index}"

    def head(self, count: int | None) -> Records:
        """The first ``count`` records (all for None)."""
        return Records(self.path, self.format, self.rows[:count], None if self.lines is None else self.lines[:count])


def read(path, data_format: str | None = None) -> Records:
    """The records of a data file, their format detected from the fields unless ``data_format``
    (one of ``FORMATS``) is given. FileNotFoundError if ``path`` is missing; ValueError naming
    the file (and the line or record) for an unsupported suffix, an unreadable file, an unknown
    or ambiguous format, a malformed record, or a file without records."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file {path!r} does not exist (or is not a file)")
    if data_format is not None and data_format not in FORMATS:
        raise ValueError(f"--data-format must be one of {', '.join(FORMATS)}; got {data_format!r}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"data file {path!r}: the suffix must be one of {', '.join(SUFFIXES)} (JSON lines, JSON, Parquet)"
        )
    parquet = SUFFIXES[suffix] == "parquet"
    lines = None if parquet or _is_array(path) else _record_lines(path)
    try:
        rows = _load(path, SUFFIXES[suffix])
    except Exception as e:  # datasets and Arrow raise many types; the re-read below names the record
        if parquet:
            raise ValueError(f"data file {path!r} is not a readable Parquet file ({_reason(e)})") from None
        rows = None
    if parquet:
        records = Records(path, data_format, rows, None)
        _validate(records)
        return records
    if rows is not None and (lines is None or len(lines) == len(rows)):
        records = Records(path, data_format, rows, lines)
        if _valid(records):
            return records
    records = Records(path, data_format, *_read_json(path))  # Arrow's types are not the file's (see the module)
    _validate(records)
    return records


def _validate(records: Records) -> None:
    """Detect the format unless given, then check every record; ValueError naming the first bad one."""
    if not records.rows:
        raise ValueError(f"data file {records.path!r} holds no records")
    records.format = records.format or detect(records.rows, records.path)
    for index, row in enumerate(records.rows):
        problem = check(row, records.format)
        if problem:
            raise ValueError(f"{records.where(index)}: {problem}")


def _valid(records: Records) -> bool:
    try:
        _validate(records)
    except ValueError:
        return False
    return True


def detect(rows: list[dict], path: str) -> str:
    """The one format whose fields the records have (a field counts if any record holds it)."""
    present = {key for row in rows for key, value in row.items() if value is not None}
    found = [name for name, fields in FORMATS.items() if set(fields) <= present]
    if len(found) == 1:
        return found[0]
    expected = "; ".join(f"{name}: {' + '.join(fields)}" for name, fields in FORMATS.items())
    if found:
        raise ValueError(
            f"data file {path!r} has the fields of several formats ({', '.join(found)}); choose one with --data-format"
        )
    raise ValueError(
        f"data file {path!r}: cannot tell the data format from its fields {sorted(present)}; expected "
        f"{expected} (or pass --data-format)"
    )


def check(row, data_format: str) -> str | None:
    """What is wrong with one record of ``data_format``, or None. Chat messages are tidied in
    place: keys Arrow filled with None (a key only some messages have) are dropped."""
    if not isinstance(row, dict):
        return f"each record must be a JSON object, got {type(row).__name__}"
    if data_format == "messages":
        return _check_messages(row.get("messages"))
    for field in FORMATS[data_format]:
        value = row.get(field)
        empty_ok = field == "prompt"  # a completion may follow nothing
        if not isinstance(value, str) or not (empty_ok or value.strip()):
            return f"a record must have a {'' if empty_ok else 'non-empty '}string {field!r}; got {_short(value)}"
    return None


def _check_messages(messages) -> str | None:
    if not isinstance(messages, list) or not messages:
        return f"'messages' must be a non-empty list of {{role, content}} objects; got {_short(messages)}"
    for i, message in enumerate(messages):
        if isinstance(message, dict):
            for key in [key for key, value in message.items() if value is None]:
                del message[key]
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and message["role"]
            and isinstance(message.get("content"), str)
        ):
            return f"messages[{i}] must be an object with a string 'role' and a string 'content'; got {_short(message)}"
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        return "'messages' has no assistant message with content (the loss is on the assistant turns)"
    return None


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _reason(error: Exception) -> str:
    cause = error.__cause__ or error.__context__ or error
    return str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__


@contextmanager
def _quiet_datasets():
    """datasets without its progress bars and its log lines (a failed Arrow read logs before the
    fallback takes over), restored afterwards."""
    import datasets

    bars, verbosity = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def _load(path: str, builder: str) -> list[dict]:
    """The rows of ``path`` through ``datasets.load_dataset`` (its cache in a temporary folder,
    removed afterwards: reading a file leaves nothing behind)."""
    import datasets

    with tempfile.TemporaryDirectory(prefix="probmoe-data-") as cache, _quiet_datasets():
        return datasets.load_dataset(
            builder, data_files=path, split="train", cache_dir=cache, keep_in_memory=True
        ).to_list()


def _text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"data file {path!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _is_array(path: str) -> bool:
    """Whether a JSON file's first non-blank character opens an array (else: JSON lines)."""
    with open(path, "rb") as f:
        while chunk := f.read(4096):
            stripped = chunk.lstrip()
            if stripped:
                return stripped[:1] == b"["
    return False


def _record_lines(path: str) -> list[int]:
    """The numbers (from 1) of the non-blank lines of a JSON-lines file: the line of each record."""
    with open(path, "rb") as f:
        return [number for number, line in enumerate(f, 1) if line.strip()]


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _read_json(path: str) -> tuple[list, list[int] | None]:
    """(rows, lines) read with Python's ``json``: the fallback that names a broken line."""
    text = _text(path)
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        return rows, None
    rows, lines = [], []
    for number, line in enumerate(text.split("\n"), 1):  # the lines _record_lines counts
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if not rows and _is_object(text):
                raise ValueError(
                    f"data file {path!r} holds one JSON object; expected an array of records or one record per line"
                ) from None
            raise ValueError(f"{path}:{number}: not valid JSON ({e.msg})") from None
        if not isinstance(rows[-1], dict):
            raise ValueError(f"{path}:{number}: each line must be a JSON object, got {type(rows[-1]).__name__}")
        lines.append(number)
    return rows, lines
