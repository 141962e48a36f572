"""The SFT data formats: every format in every file type reads the same records, the loss falls on
exactly the tokens it should, and a malformed record is named by file and line (or index)."""

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from probmoe.experiments import data, formats
from probmoe.experiments.tokenizer import byte_tokenizer

IGNORE, EOS = data.IGNORE, "</s>"
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
    {"role": "assistant", "content": "6"},
]
RECORDS = {  # per format: two records, and for each the full text and the text that carries loss
    "question-answer": [
        ({"question": " 1+1? ", "answer": "2 ", "id": 7}, "Question: 1+1?\nAnswer: 2" + EOS, "2" + EOS),
        (
            {"question": "Why?", "answer": "Because.", "id": 8},
            "Question: Why?\nAnswer: Because." + EOS,
            "Because." + EOS,
        ),
    ],
    "prompt-completion": [
        ({"prompt": "Translate: chat ->", "completion": " cat"}, "Translate: chat -> cat" + EOS, " cat" + EOS),
        ({"prompt": "", "completion": "free text"}, "free text" + EOS, "free text" + EOS),
    ],
    "text": [
        ({"text": "All of it."}, "All of it." + EOS, "All of it." + EOS),
        ({"text": "héllo ∑"}, "héllo ∑" + EOS, "héllo ∑" + EOS),
    ],
    "messages": [
        (
            {"messages": CHAT},
            "System: Be brief.\nUser: 2+2?\nAssistant: 4" + EOS + "User: and 3+3?\nAssistant: 6" + EOS,
            "4" + EOS + "6" + EOS,
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                    {"role": "user", "content": "bye"},
                ]
            },
            "User: hi\nAssistant: yo" + EOS + "User: bye\n",
            "yo" + EOS,
        ),
    ],
}


def write(path, rows, kind):
    """``rows`` as JSON lines (with a blank line), a JSON array, or Parquet."""
    if kind == "jsonl":
        lines = [json.dumps(r) for r in rows]
        path.write_text(lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n", encoding="utf-8")
    elif kind == "json":
        path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def loss_text(tok, encoded):
    """The text of the tokens with loss, and a check that they form one or more runs of the labels."""
    assert len(encoded.labels) == len(encoded.input_ids)
    assert all(label in (IGNORE, i) for label, i in zip(encoded.labels, encoded.input_ids))
    return tok.decode([i for i, label in zip(encoded.input_ids, encoded.labels) if label != IGNORE])


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet"])
@pytest.mark.parametrize("fmt", list(RECORDS))
def test_each_format_in_each_file_type_puts_the_loss_on_the_right_tokens(tmp_path, tok, fmt, kind):
    rows = [r for r, _, _ in RECORDS[fmt]]
    records = formats.read(write(tmp_path / f"d.{kind}", rows, kind))
    assert records.format == fmt and len(records) == 2
    assert records.lines == ([1, 3] if kind == "jsonl" else None)
    for encoded, (_, full, with_loss) in zip(data.encode_all(tok, records, 1024), RECORDS[fmt]):
        assert tok.decode(encoded.input_ids) == full  # the byte tokenizer: one token per byte, no bos
        assert loss_text(tok, encoded) == with_loss
        loss_at = [label != IGNORE for label in encoded.labels]
        if fmt in ("text",):
            assert all(loss_at)
        elif fmt != "messages":  # prompt without loss, then answer + eos with loss, nothing else
            n = len(tok(with_loss.removesuffix(EOS), add_special_tokens=False)["input_ids"]) + 1
            assert loss_at == [False] * (len(loss_at) - n) + [True] * n


def test_chat_loss_is_exactly_the_assistant_turns(tok):
    """Token by token: loss on the assistant contents and their eos, on nothing of the roles or the user turns."""
    e = data.encode(tok, {"messages": CHAT}, 1024, "messages")
    text = RECORDS["messages"][0][1]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert e.input_ids == ids
    first = text.index("Assistant: 4") + len("Assistant: ")
    second = text.index("Assistant: 6") + len("Assistant: ")
    want = set(range(first, first + 1 + 4)) | set(range(second, second + 1 + 4))  # byte positions: "4</s>", "6</s>"
    # the byte tokenizer maps "</s>" (4 bytes in the text) to one token: map character positions to tokens
    positions, at = [], 0
    for i in ids:
        piece = tok.decode([i])
        positions.append(set(range(at, at + len(piece))))
        at += len(piece)
    expected = [bool(p & want) for p in positions]
    assert [label != IGNORE for label in e.labels] == expected and sum(expected) == 4


def test_question_answer_encoding_is_unchanged(tok):
    """What GSM8K runs trained on before the formats existed: bos-free byte prompt, answer + eos."""
    e = data.encode(tok, {"question": "q", "answer": " a "}, 1024)
    prompt = tok("Question: q\nAnswer: ", add_special_tokens=False)["input_ids"]
    assert e.input_ids == prompt + [tok.convert_tokens_to_ids("a"), tok.eos_token_id]
    assert e.labels == [IGNORE] * len(prompt) + e.input_ids[len(prompt) :]
    assert data.encode(tok, {"question": "q", "answer": "a"}, 5).input_ids == prompt[:5]


def test_format_is_detected_or_given(tmp_path):
    both = write(tmp_path / "both.jsonl", [{"text": "t", "question": "q", "answer": "a"}], "jsonl")
    with pytest.raises(ValueError, match="several formats .*question-answer, text.*--data-format"):
        formats.read(both)
    assert formats.read(both, "text").format == "text"
    none = write(tmp_path / "none.jsonl", [{"input": "x", "output": "y"}], "jsonl")
    with pytest.raises(ValueError, match=r"cannot tell the data format from its fields \['input', 'output'\]"):
        formats.read(none)
    with pytest.raises(ValueError, match="none.jsonl:1: a record must have a string 'prompt'; got None"):
        formats.read(none, "prompt-completion")
    with pytest.raises(ValueError, match="suffix must be one of .jsonl, .json, .parquet"):
        formats.read(write(tmp_path / "d.csv", [{"text": "t"}], "json"))


BAD_JSONL = [  # (file text, the message)
    ('{"question": "q", "answer": "a"}\n\n{"question": "q", "answer": "a"\n', r"d.jsonl:3: not valid JSON"),
    ('{"question": "q", "answer": "a"}\n\n\n{"question": "q"}\n', r"d.jsonl:4: .*non-empty string 'answer'; got None"),
    (
        '{"question": "q", "answer": "a"}\n{"question": "q", "answer": 5}\n',  # Arrow cannot type it: re-read
        r"d.jsonl:2: .*non-empty string 'answer'; got 5",
    ),
    ('{"text": "a"}\n[1, 2]\n', r"d.jsonl:2: each line must be a JSON object, got list"),
    ('{"text": "a"}\n{"text": "  "}\n', r"d.jsonl:2: .*non-empty string 'text'"),
    ('{"messages": [{"role": "user", "content": "hi"}]}\n', r"d.jsonl:1: 'messages' has no assistant message"),
    (
        '{"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]}\n',
        r"d.jsonl:1: messages\[0\] must be an object with a string 'role' and a string 'content'",
    ),
    ('{"messages": "hello"}\n', r"d.jsonl:1: 'messages' must be a non-empty list"),
    ('{\n "text": ["a"]\n}\n', r"holds one JSON object; expected an array of records or one record per line"),
]


@pytest.mark.parametrize("text,message", BAD_JSONL)
def test_a_malformed_json_lines_record_is_named_by_line(tmp_path, text, message):
    (tmp_path / "d.jsonl").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        formats.read(tmp_path / "d.jsonl")


def test_a_malformed_record_of_an_array_or_parquet_is_named_by_index(tmp_path):
    rows = [{"prompt": "p", "completion": "c"}, {"prompt": "p", "completion": "c"}, {"prompt": "p"}]
    for kind in ("json", "parquet"):
        with pytest.raises(ValueError, match=rf"d.{kind}: record 2: .*'completion'; got None"):
            formats.read(write(tmp_path / f"d.{kind}", rows, kind))
    (tmp_path / "broken.json").write_text('[{"text": "a"},\n {"text": }]')
    with pytest.raises(ValueError, match=r"broken.json:2: not valid JSON"):
        formats.read(tmp_path / "broken.json")
    (tmp_path / "fake.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match="fake.parquet' is not a readable Parquet file"):
        formats.read(tmp_path / "fake.parquet")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match="is not UTF-8"):
        formats.read(tmp_path / "latin1.jsonl")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        formats.read(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("kind", ["jsonl", "json"])
def test_strings_stay_as_written_where_arrow_would_retype_them(tmp_path, kind):
    """Arrow reads "2020-01-01" as a timestamp and fails on a field of two types: the strings come back as written."""
    rows = [
        {"question": "2020-01-01", "answer": "1970-01-01 00:00:00", "id": 1},
        {"question": "q", "answer": "a", "id": "two"},
    ]
    records = formats.read(write(tmp_path / f"d.{kind}", rows, kind))
    assert records.rows == rows and records.lines == ([1, 3] if kind == "jsonl" else None)


def test_arrow_filled_message_keys_are_dropped(tmp_path, tok):
    """Parquet unifies the messages' keys: a key one message has becomes None in the others; the
    template must not see it."""
    rows = [{"messages": [{"role": "user", "content": "hi", "name": "ann"}, {"role": "assistant", "content": "yo"}]}]
    records = formats.read(write(tmp_path / "d.parquet", rows, "parquet"))
    assert records.rows[0]["messages"][1] == {"role": "assistant", "content": "yo"}


def test_chat_template_problems_are_clear(tmp_path, tok):
    bad_role = write(
        tmp_path / "d.jsonl",
        [{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}],
        "jsonl",
    )
    with pytest.raises(
        ValueError,
        match=r"d.jsonl:1: the chat template fails .*knows the roles system, user and "
        r"assistant; got tool",
    ):
        data.encode_all(tok, formats.read(bad_role), 64)
    chat = formats.read(write(tmp_path / "c.jsonl", [{"messages": CHAT}], "jsonl"))
    plain = byte_tokenizer()
    plain.chat_template = None
    with pytest.raises(ValueError, match="has no chat template, which the 'messages' data format needs"):
        data.encode_all(plain, chat, 64)
    plain.chat_template = "{% for m in messages | reverse %}{{ m.content }}|{% endfor %}"  # rewrites earlier turns
    with pytest.raises(ValueError, match=r"c.jsonl:1: the chat template does not render a conversation as a prefix"):
        data.encode_all(plain, chat, 64)


def test_lost_answers_are_counted_and_refused_at_half(tok):
    records = [{"question": "q" * n, "answer": "a"} for n in (1, 1, 1, 40)]
    encoded = [data.encode(tok, r, 30) for r in records]
    assert data.without_loss(encoded) == 1 and data.check_loss_tokens(encoded, 30, "f") == 1
    encoded[1] = data.encode(tok, {"question": "q" * 40, "answer": "a"}, 30)  # 2 of 4: refused
    with pytest.raises(
        ValueError, match="--max-length 30 leaves no answer token in 2 of 4 examples of f .*50%.*raise --max-length"
    ):
        data.check_loss_tokens(encoded, 30, "f")
