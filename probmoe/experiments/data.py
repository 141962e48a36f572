"""Question/answer data in JSON lines (GSM8K's format), checked before any training starts.

Each line is a JSON object with string fields ``question`` and ``answer`` (other fields are
kept and ignored). An example becomes

    prompt  = bos + "Question: {question}\\nAnswer: "     (no loss; bos where the tokenizer adds one)
    target  = "{answer}" + eos                          (the loss is on these tokens only)

``prompt(question)`` is also what ``probmoe-eval`` hands the model to generate from.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

IGNORE = -100  # the label of tokens without loss (transformers' convention)


def prompt(question: str) -> str:
    return f"Question: {question.strip()}\nAnswer: "


def read_jsonl(path, *, need_answer: bool = True) -> list[dict]:
    """The records of a JSON-lines file of ``question``/``answer`` pairs.

    FileNotFoundError if ``path`` is missing; ValueError naming the file and line for a line that
    is not a JSON object, lacks ``question`` (or ``answer`` when ``need_answer``), or holds a
    non-string or empty one; ValueError for a file without records. Blank lines are skipped.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file {path!r} does not exist (or is not a file)")
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(_lines(f, path), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: each line must be a JSON object, got {type(record).__name__}")
            for field in ("question", "answer") if need_answer else ("question",):
                value = record.get(field)
                if not isinstance(value, str) or not value.strip():
                    raise ValueError(f"{path}:{number}: a line must have a non-empty string {field!r}; "
                                     f"got {value!r}")
            records.append(record)
    if not records:
        raise ValueError(f"data file {path!r} holds no question/answer records")
    return records


def _lines(f, path: str):
    try:
        yield from f
    except UnicodeDecodeError as e:
        raise ValueError(f"data file {path!r} is not UTF-8 text ({e.reason})") from None


@dataclass
class Encoded:
    """One tokenised example: ``input_ids`` [L] and ``labels`` [L] (``IGNORE`` on the prompt)."""

    input_ids: list[int]
    labels: list[int]


def special_prefix(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before a text (Llama/Mixtral/DeepSeek: bos; GPT-2-style
    and our byte tokenizer: none), found by tokenizing a probe with and without them."""
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    full = tokenizer("x", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start]
    return []


def prompt_ids(tokenizer, question: str) -> list[int]:
    """The prompt's tokens, special prefix included (what training conditions on and eval generates from)."""
    return special_prefix(tokenizer) + tokenizer(prompt(question), add_special_tokens=False)["input_ids"]


def encode(tokenizer, record: dict, max_length: int) -> Encoded:
    """Prompt + answer + eos, cut to ``max_length`` tokens (the answer's tail goes first)."""
    p = prompt_ids(tokenizer, record["question"])
    a = tokenizer(record["answer"].strip(), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = (p + a)[:max_length]
    labels = ([IGNORE] * len(p) + a)[:max_length]
    return Encoded(ids, labels)


def collate(batch: list[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors: input_ids, attention_mask, labels, each [B, L_max]."""
    length = max(len(e.input_ids) for e in batch)
    ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), length), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), length), dtype=torch.long)
    for row, e in enumerate(batch):
        n = len(e.input_ids)
        ids[row, :n] = torch.tensor(e.input_ids)
        labels[row, :n] = torch.tensor(e.labels)
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    """The example order of ``epoch``: a permutation that depends on (seed, epoch) alone, so a
    resumed run and every rank see the same order."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=g).tolist()
