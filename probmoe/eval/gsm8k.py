"""GSM8K answer scoring, following lm-evaluation-harness's ``gsm8k`` task (``gsm8k.yaml``, version 3).

Two ways to read a model's answer out of its completion, as the harness's two filters do:

- ``"strict"`` (its ``strict-match``): the first match of ``#### (\\-?[0-9\\.\\,]+)``, the number the
  GSM8K answer format puts after ``#### ``.
- ``"flexible"`` (its ``flexible-extract``): the last match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)``, i.e.
  the last number anywhere in the completion.

Both are then normalised as the harness's ``exact_match`` does (``regexes_to_ignore``): commas and
``$`` are removed and a trailing period is dropped, so ``"$1,000."`` reads ``"1000"``.

Where this module differs from the harness, on purpose:

- A match without a digit (an ellipsis ``"..."``, a ``"$,"``) is not a number and is skipped, so
  "It is 18. Or is it..." reads ``"18"`` where the harness would compare ``".."``.
- Every trailing period is dropped, not only the last: "It is 18..." reads ``"18"``, not ``"18.."``.
- Answers are compared as exact decimals (``decimal.Decimal``), not as strings: ``"18"``,
  ``"18.0"`` and ``"18.00"`` are all equal, ``"18"`` and ``"180"`` are not, and ``"-5"`` is not
  ``"5"``. The harness compares strings, so it marks a correct ``"18.00"`` wrong. No rounding: 0.33
  is not 1/3.
"""

from __future__ import annotations

import re
from decimal import Decimal

MODES = ("strict", "flexible")

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")  # strict-match, take_first
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # flexible-extract, group_select -1
_NUMBER = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)")  # what a normalised answer must be to compare
_DIGIT = re.compile(r"[0-9]")


def _normalise(match: str) -> str:
    """The harness's ``regexes_to_ignore``: drop ``,`` and ``$``, then trailing periods."""
    return match.replace(",", "").replace("$", "").rstrip(".")


def extract_answer(text: str, mode: str = "flexible") -> str | None:
    """The normalised answer in a completion ``text``, or None when it holds no number.

    ``mode`` is ``"strict"`` (the first number after a ``#### ``) or ``"flexible"`` (the last
    number in the text); see the module docstring. The result is a string such as ``"-1000"`` or
    ``"18.50"``; it may still be malformed (``"1.2.3"``), which ``is_correct`` scores as wrong.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    pattern = _STRICT if mode == "strict" else _FLEXIBLE
    group = 1 if mode == "strict" else 0
    numbers = [_normalise(m.group(group)) for m in pattern.finditer(text) if _DIGIT.search(m.group(group))]
    if not numbers:
        return None
    return numbers[0] if mode == "strict" else numbers[-1]


def _decimal(answer: str) -> Decimal | None:
    """``answer`` (normalised) as an exact decimal, or None when it is not a plain number."""
    return Decimal(answer) if _NUMBER.fullmatch(answer) else None


def gold_answer(answer_field: str) -> str:
    """The reference number of a GSM8K ``answer`` field (after ``#### ``), normalised: ``"1,080"`` -> ``"1080"``."""
    if not isinstance(answer_field, str):
        raise ValueError(f"answer_field must be a str, got {type(answer_field).__name__}")
    answer = extract_answer(answer_field, "strict")
    if answer is None or _decimal(answer) is None:
        raise ValueError(f"answer_field must hold a number after '#### ', got {answer_field[-80:]!r}")
    return answer


def check_references(records) -> None:
    """Every row of ``records`` (``formats.Records`` of question/answer) has a gold number, before
    any model loads: ValueError naming the first row without one, by file and line."""
    for index, row in enumerate(records.rows):
        try:
            gold_answer(row["answer"])
        except ValueError:
            raise ValueError(
                f"--data {records.where(index)}: exact match needs the answer to end in '#### <number>' "
                f"(GSM8K's form), got {row['answer'][-60:]!r}; --skip-generation scores the answer "
                "loss alone"
            ) from None


def is_correct(completion: str, reference_answer: str, mode: str = "flexible") -> bool:
    """Whether the answer ``extract_answer(completion, mode)`` equals the reference, as exact decimals.

    ``reference_answer`` is a full GSM8K ``answer`` field (with ``#### ``) or a bare number such as
    ``"1,080"`` or ``"$18.00"``. A completion without a number, or with a malformed one, is wrong.
    """
    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {type(completion).__name__}")
    if not isinstance(reference_answer, str):
        raise ValueError(f"reference_answer must be a str, got {type(reference_answer).__name__}")
    if "#### " in reference_answer:
        reference = _decimal(gold_answer(reference_answer))
    else:
        reference = _decimal(_normalise(reference_answer.strip()))
        if reference is None:
            raise ValueError(
                "reference_answer must be a GSM8K answer field (with '#### ') or a bare number, "
                f"got {reference_answer[-80:]!r}"
            )
    answer = extract_answer(completion, mode)
    return answer is not None and _decimal(answer) == reference
