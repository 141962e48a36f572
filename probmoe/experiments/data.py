"""Examples as tokens with a loss mask, for every format of ``formats`` (reading is there).

An example is a list of text segments, each with or without loss, tokenised one by one
(``add_special_tokens=False``) and joined:

    question-answer     bos + "Question: {question}\nAnswer: " | "{answer}" + eos
    prompt-completion   bos + prompt                          | completion + eos
    text                bos                                   | text + eos
    messages            the chat template's text, cut at each assistant turn: the turn's text after
                        the generation prompt (its end-of-turn marker included) has loss, the rest not

(left of ``|``: no loss; right: loss; bos only where the tokenizer adds one; prompt and
completion verbatim, question and answer stripped). A chat conversation is rendered by
``tokenizer.apply_chat_template``: for the i-th assistant message, the rendering of the messages
before it with the generation prompt must be a prefix of the rendering through it (true of the
usual templates; a template that rewrites earlier turns is refused). The byte tokenizer of the
tiny models has a default template (``tokenizer.CHAT_TEMPLATE``). ``prompt(question)`` is also
what ``probmoe-eval`` hands the model to generate from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import Records

IGNORE = -100  # the label of tokens without loss (transformers' convention)
EMPTY_LIMIT = 0.5  # probmoe-train refuses data where --max-length leaves this share of examples without loss


def prompt(question: str) -> str:
    return f"Question: {question.strip()}\nAnswer: "


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
        if full[start : start + len(plain)] == plain:
            return full[:start]
    return []


def prompt_ids(tokenizer, question: str) -> list[int]:
    """The prompt's tokens, special prefix included (what training conditions on and eval generates from)."""
    return special_prefix(tokenizer) + tokenizer(prompt(question), add_special_tokens=False)["input_ids"]


def segments(tokenizer, record: dict, data_format: str) -> list[tuple[str, bool]]:
    """The example's texts in order, each with whether its tokens carry loss (see the module)."""
    if data_format == "question-answer":
        return [(prompt(record["question"]), False), (record["answer"].strip(), True)]
    if data_format == "prompt-completion":
        return [(record["prompt"], False), (record["completion"], True)]
    if data_format == "text":
        return [(record["text"], True)]
    if data_format == "messages":
        return chat_segments(tokenizer, record["messages"])
    raise ValueError(f"unknown data format {data_format!r}")


def chat_segments(tokenizer, messages: list[dict]) -> list[tuple[str, bool]]:
    """The chat template's rendering of ``messages``, cut into turns without loss and assistant
    turns with loss. ValueError if the tokenizer has no chat template, the template fails on the
    conversation, or its renderings are not prefixes of one another."""

    def render(upto: int, generation_prompt: bool = False) -> str:
        try:
            return tokenizer.apply_chat_template(
                messages[:upto], tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as e:  # jinja2's TemplateError and raise_exception's message
            raise ValueError(f"the chat template fails on this conversation ({e})") from None

    check_chat_template(tokenizer)
    out, done = [], ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, after = render(i, True), render(i + 1)
        if not before.startswith(done) or not after.startswith(before):
            raise ValueError(
                "the chat template does not render a conversation as a prefix of its continuation "
                f"(at messages[{i}]), so the assistant turns cannot be told apart"
            )
        out += [(before[len(done) :], False), (after[len(before) :], True)]
        done = after
    rest = render(len(messages))
    if not rest.startswith(done):
        raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
    return out + ([(rest[len(done) :], False)] if len(rest) > len(done) else [])  # turns after the last answer


def check_chat_template(tokenizer, name: str = "the tokenizer") -> None:
    """ValueError if ``tokenizer`` has no chat template (the messages format needs one)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{name} has no chat template, which the 'messages' data format needs; give the tokenizer "
            "one (tokenizer.chat_template, saved with it), or write the data as prompt/completion"
        )


def encode(tokenizer, record: dict, max_length: int, data_format: str = "question-answer") -> Encoded:
    """The tokens of ``record`` with their labels (``IGNORE`` where there is no loss), cut to
    ``max_length`` tokens (the end goes first)."""
    chat = data_format == "messages"  # the template places bos and the end of each turn itself
    ids = [] if chat else special_prefix(tokenizer)
    labels = [IGNORE] * len(ids)
    for text, loss in segments(tokenizer, record, data_format):
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        ids += tokens
        labels += tokens if loss else [IGNORE] * len(tokens)
    if not chat:
        ids.append(tokenizer.eos_token_id)
        labels.append(tokenizer.eos_token_id)
    return Encoded(ids[:max_length], labels[:max_length])


def encode_all(tokenizer, records: Records, max_length: int) -> list[Encoded]:
    """``encode`` of every record; a record that cannot be encoded is named (file and line)."""
    if records.format == "messages":
        check_chat_template(tokenizer, f"the tokenizer (for {records.path!r})")
    out = []
    for index, record in enumerate(records.rows):
        try:
            out.append(encode(tokenizer, record, max_length, records.format))
        except ValueError as e:
            raise ValueError(f"{records.where(index)}: {e}") from None
    return out


def without_loss(encoded: list[Encoded]) -> int:
    """How many examples have no token with loss (labels[0] never counts: nothing predicts it)."""
    return sum(all(label == IGNORE for label in e.labels[1:]) for e in encoded)


def check_loss_tokens(encoded: list[Encoded], max_length: int, path: str) -> int:
    """The number of examples ``max_length`` leaves without loss tokens; ValueError when that is
    at least ``EMPTY_LIMIT`` of them (training would learn from almost nothing)."""
    empty = without_loss(encoded)
    if empty >= EMPTY_LIMIT * len(encoded):
        raise ValueError(
            f"--max-length {max_length} leaves no answer token in {empty} of {len(encoded)} examples of "
            f"{path} (refused at {EMPTY_LIMIT:.0%} or more: examples are cut to --max-length tokens from "
            "the end); raise --max-length"
        )
    return empty


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
