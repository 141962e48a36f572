"""tools/harness_tasks/gsm8k_mc.yaml: the LM Evaluation Harness task of docs/reports/results-tiny-models-epyc-2026-11.md, from the GSM8K files."""

import importlib.util
import json
import os

import pytest
from gsm8k_data import lines

datasets = pytest.importorskip("datasets")

FOLDER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools", "harness_tasks"
)
_spec = importlib.util.spec_from_file_location("gsm8k_mc_utils", os.path.join(FOLDER, "utils.py"))
utils = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(utils)


def test_documents_from_the_first_40_problems():
    records = [json.loads(line) for line in lines("test.jsonl", 50)]
    docs = utils.process_docs(datasets.Dataset.from_list(records))
    assert len(docs) == 40
    numbers = [r["answer"].split("####")[-1].strip().replace(",", "") for r in records[:40]]
    for i, doc in enumerate(docs):
        assert doc["question"] == records[i]["question"]
        assert doc["label"] == i % 4 and doc["choices"][doc["label"]] == numbers[i]
        assert len(doc["choices"]) == 4 and len(set(doc["choices"])) == 4
        assert all(c in numbers for c in doc["choices"])  # the other choices are other problems' answers
    assert utils.reference("so 3 + 4 = 7.\n#### 1,234") == "1234"
    with pytest.raises(ValueError, match="must end in '#### <number>'"):
        utils.reference("no number here")
    with pytest.raises(ValueError, match="at least 4 distinct reference numbers"):
        utils.process_docs(datasets.Dataset.from_list([{"question": "q", "answer": "#### 1"}] * 5))


@pytest.mark.slow  # about a minute idle, three under load: the harness indexes all its task YAML
def test_the_harness_finds_the_task():
    pytest.importorskip("lm_eval")
    from probmoe.eval import harness

    manager = harness.task_manager(["gsm8k_mc"], FOLDER)
    assert "gsm8k_mc" in manager.all_tasks
