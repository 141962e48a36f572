"""The byte-level tokenizer of the built-in tiny models, built offline (no download).

Ids 0, 1, 2 are ``<pad>``, ``<s>``, ``</s>``; ids 3..258 are the 256 bytes, in byte order, through
the GPT-2 byte-to-unicode map (``tokenizers``' ``ByteLevel``), with no merges: any UTF-8 text
round-trips exactly. It is a ``PreTrainedTokenizerFast``, so ``save_pretrained`` writes it beside
a checkpoint and ``AutoTokenizer.from_pretrained`` loads it back.

It carries a plain chat template (``CHAT_TEMPLATE``), in the style of the question/answer prompt,
for the ``messages`` data format:

    System: {content}\n  User: {content}\n  Assistant: {content}</s>   (the generation prompt: "Assistant: ")

Roles other than system, user and assistant are refused with a message naming the role.
"""

from __future__ import annotations

SPECIAL = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: the tiny configs' pad/bos/eos ids
VOCAB_SIZE = len(SPECIAL) + 256
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ 'System: ' + message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'user' -%}{{ 'User: ' + message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}{{ 'Assistant: ' + message['content'] + eos_token }}"
    "{%- else -%}{{ raise_exception('the byte tokenizer\\'s chat template knows the roles system, user and "
    "assistant; got ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Assistant: ' }}{%- endif -%}"
)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's reversible byte -> printable character map, as a list indexed by byte value."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_tokenizer():
    """A ``transformers.PreTrainedTokenizerFast`` over bytes (vocabulary ``VOCAB_SIZE``), padding
    on the left (what batched generation needs; the trainer pads its own batches), with
    ``CHAT_TEMPLATE``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab.update({ch: len(SPECIAL) + b for b, ch in enumerate(_bytes_to_unicode())})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", padding_side="left"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
