"""GSM8K scoring: hand cases for both extraction modes, every gold answer of the release, and
agreement with the GSM8K authors' own correctness labels on 5,276 GPT-3 completions."""

import json
from pathlib import Path

import pytest

from probmoe.eval import extract_answer, gold_answer, is_correct

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
MODELS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")


def _jsonl(name: str) -> list[dict]:
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"GSM8K data not found at {path} (the shared data folder beside the checkout)")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She makes 9 * 2 = $18 every day.\n#### 18", "18"),
        ("The answer is 18.", "18"),  # trailing period
        ("It costs $1,000.", "1000"),  # $ and comma
        ("It went from 3 to -5 degrees", "-5"),  # negative
        ("Each costs 3.50 dollars", "3.50"),  # decimals kept as written
        ("So 16 - 3 - 4 = <<16-3-4=9>>9", "9"),  # calculator annotations
        ("The answer is 18...", "18"),  # trailing periods
        ("It is 18. Or is it...", "18"),  # an ellipsis is not a number
        ("#### 18\nQuestion: what is 2 + 3?", "3"),  # the last number, not the marked one
        ("A: 7", "7"),
        ("There is no number here.", None),
        ("Hmm... well, $ maybe.", None),
        ("", None),
    ],
)
def test_flexible_takes_the_last_number(text, expected):
    assert extract_answer(text) == expected
    assert extract_answer(text, "flexible") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("9 * 2 = 18\n#### 18", "18"),
        ("#### 1,234", "1234"),
        ("#### -3", "-3"),
        ("#### 2.50.", "2.50"),  # trailing period
        ("#### 7 and later #### 8", "7"),  # the first marked number
        ("#### 18\nQuestion: what is 2 + 3?", "18"),
        ("The answer is 18.", None),  # no marker
        ("A: 18", None),
        ("####18", None),  # the marker is '#### ', with its space
        ("#### $18", None),  # the harness's pattern allows no '$' here
        ("#### ...", None),
    ],
)
def test_strict_takes_the_number_after_the_marker(text, expected):
    assert extract_answer(text, "strict") == expected


@pytest.mark.parametrize(
    "completion, reference, expected",
    [
        ("The answer is 18.00", "18", True),  # equal as decimals
        ("The answer is 18.5", "18.50", True),
        ("The answer is 180", "18", False),
        ("The answer is 18", "180", False),
        ("It is 1,000 apples", "1000", True),
        ("It is 1000 apples", "1,000", True),
        ("It is $5.", "$5", True),
        ("It is -5", "5", False),
        ("It is -5", "-5", True),
        ("It is 5", "-5", False),
        ("It is 0.33", "1", False),
        ("No idea.", "18", False),  # no number: wrong
        ("Version 1.2.3", "1.2", False),  # a malformed number: wrong
        ("Janet makes $18.\n#### 18", "Janet sells 9 eggs.\n#### 18", True),  # a full answer field as reference
        ("Janet makes $18.\n#### 18", "Janet sells 9 eggs.\n#### 9", False),
    ],
)
def test_is_correct_compares_exact_decimals(completion, reference, expected):
    assert is_correct(completion, reference) is expected


def test_is_correct_strict_needs_the_marker():
    assert is_correct("... so #### 18", "18", "strict")
    assert not is_correct("The answer is 18", "18", "strict")
    assert is_correct("The answer is 18", "18", "flexible")


def test_gold_answer():
    assert gold_answer("16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 1,080") == "1080"
    assert gold_answer("#### -2") == "-2"


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: extract_answer("18", "loose"), "mode must be one of ('strict', 'flexible')"),
        (lambda: extract_answer("18", None), "mode must be one of"),
        (lambda: extract_answer(18), "text must be a str"),
        (lambda: is_correct(None, "18"), "completion must be a str"),
        (lambda: is_correct("18", 18), "reference_answer must be a str"),
        (lambda: is_correct("18", "A: 18"), "reference_answer must be a GSM8K answer field"),
        (lambda: is_correct("18", ""), "reference_answer must be a GSM8K answer field"),
        (lambda: is_correct("18", "18", "exact"), "mode must be one of"),
        (lambda: gold_answer("The answer is 18"), "answer_field must hold a number after '#### '"),
        (lambda: gold_answer("#### lots"), "answer_field must hold a number"),
        (lambda: gold_answer(None), "answer_field must be a str"),
    ],
)
def test_bad_arguments_raise(call, name):
    with pytest.raises(ValueError, match=name.replace("(", r"\(").replace(")", r"\)")):
        call()


@pytest.mark.parametrize("split, size", [("train.jsonl", 7473), ("test.jsonl", 1319)])
def test_every_gold_answer_scores_itself(split, size):
    rows = _jsonl(split)
    assert len(rows) == size
    for row in rows:
        for mode in ("strict", "flexible"):
            assert is_correct(row["answer"], row["answer"], mode), (mode, row["answer"][-80:])
        assert is_correct(gold_answer(row["answer"]), row["answer"])


def test_agrees_with_the_authors_labels():
    """The GSM8K release's example_model_solutions.jsonl: 1,319 test problems, each solved by four
    GPT-3 models and labelled correct or not by the authors; the gold number ends `ground_truth`
    as "A: 18". The flexible scorer must agree with at least 99% of the 5,276 labels."""
    rows = _jsonl("example_model_solutions.jsonl")
    labelled = [
        (row["ground_truth"].rsplit("A:", 1)[1].strip(), row[model]["solution"], row[model]["is_correct"])
        for row in rows
        for model in MODELS
    ]
    assert len(labelled) == 5276
    agreement = sum(is_correct(solution, gold) == label for gold, solution, label in labelled) / len(labelled)
    assert agreement >= 0.99, agreement
    # The threshold discriminates: the strict scorer finds no '#### ' in these "A: 18" completions,
    # so it calls every one wrong and agrees only with the negative labels (62%).
    negatives = sum(not label for _, _, label in labelled) / len(labelled)
    strict = sum(is_correct(solution, gold, "strict") == label for gold, solution, label in labelled) / len(labelled)
    assert strict == negatives < 0.99
