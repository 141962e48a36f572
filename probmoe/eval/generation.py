"""GSM8K evaluation behind ``probmoe-eval``: greedy generation scored by exact match, and the
teacher-forced loss on the reference answers.

Generation is greedy (``do_sample=False``) from ``data.prompt(question)`` with the KV cache, in
batches padded on the left; a completion is cut at the first ``"Question:"`` (the model starting
the next problem: lm-evaluation-harness's stop sequence) and at eos. Both scorer modes of
``probmoe.eval.gsm8k`` are reported; ``flexible`` is the headline. ``evaluate`` runs both over a
data set and writes ``results.jsonl`` and ``summary.json``.
"""

from __future__ import annotations

import json
import os

import torch

from probmoe.experiments import data
from probmoe.experiments.trainer import answer_loss_sum, routing_summary

from . import gsm8k

STOP = "Question:"


def left_padded(prompts: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids and attention_mask [B, L_max], padded on the left (what generation continues from)."""
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, length - len(p) :] = torch.tensor(p)
        mask[row, length - len(p) :] = 1
    return {"input_ids": ids, "attention_mask": mask}


def complete(model, tokenizer, questions: list[str], max_new_tokens: int) -> list[str]:
    """Greedy completions of the prompts of ``questions`` (one batch); generation stops at eos (the
    model's generation config) or once every row has written ``STOP``."""
    enc = left_padded([data.prompt_ids(tokenizer, q) for q in questions], tokenizer.pad_token_id)
    enc = {key: value.to(model.device) for key, value in enc.items()}
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=tokenizer.pad_token_id,
            stop_strings=[STOP],
            tokenizer=tokenizer,
        )
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return [t.split(STOP)[0].strip() for t in texts]


def score(record: dict, completion: str) -> dict:
    """One problem's result: the reference, the completion, both modes' answers and verdicts."""
    gold = gsm8k.gold_answer(record["answer"])
    result = {"question": record["question"], "reference": gold, "completion": completion}
    for mode in gsm8k.MODES:
        result[f"answer_{mode}"] = gsm8k.extract_answer(completion, mode)
        result[f"correct_{mode}"] = gsm8k.is_correct(completion, gold, mode)
    return result


def answer_loss(model, tokenizer, records: list[dict], batch_size: int, max_length: int, progress) -> dict:
    """Mean cross-entropy over the reference answers' tokens (teacher forcing), with the routing
    statistics of the same forwards (experts per token averaged over layers and tokens)."""
    total, count, experts, layers = 0.0, 0, 0.0, 0
    encoded = [data.encode(tokenizer, r, max_length) for r in records]
    with torch.no_grad():
        for start in progress(range(0, len(encoded), batch_size), desc="answer loss"):
            batch = data.collate(encoded[start : start + batch_size], tokenizer.pad_token_id)
            batch = {key: value.to(model.device) for key, value in batch.items()}
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            s, n = answer_loss_sum(out.logits, batch["labels"])
            total, count = total + s.item(), count + int(n)
            summary = routing_summary(model, batch["attention_mask"])
            real = int(batch["attention_mask"].sum())
            experts += sum(layer["experts_per_token"] for layer in summary) * real
            layers += len(summary) * real
    return {"answer_loss": total / max(count, 1), "answer_tokens": count, "experts_per_token": experts / max(layers, 1)}


def evaluate(
    model,
    tokenizer,
    records: list[dict],
    out: str,
    *,
    batch_size: int,
    max_length: int,
    max_new_tokens: int,
    generate: bool,
    progress,
    about: dict,
) -> dict:
    """``probmoe-eval --data``: the answer loss over ``records`` and (``generate``) greedy exact
    match, one line per problem into ``out``/results.jsonl as it goes, the summary (``about``: the
    checkpoint, data, routing, first) into ``out``/summary.json; returns the summary."""
    summary = {**about, "problems": len(records)}
    summary.update(answer_loss(model, tokenizer, records, batch_size, max_length, progress))
    results = []
    with open(os.path.join(out, "results.jsonl"), "w", encoding="utf-8") as f:
        for start in progress(range(0, len(records), batch_size) if generate else [], desc="generate"):
            chunk = records[start : start + batch_size]
            completions = complete(model, tokenizer, [r["question"] for r in chunk], max_new_tokens)
            for i, (record, completion) in enumerate(zip(chunk, completions)):
                results.append(dict(index=start + i, **score(record, completion)))
                f.write(json.dumps(results[-1]) + "\n")
            f.flush()
    if results:
        for mode in gsm8k.MODES:
            summary[f"exact_match_{mode}"] = sum(r[f"correct_{mode}"] for r in results) / len(results)
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    return summary
