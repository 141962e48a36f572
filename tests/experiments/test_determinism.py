"""The same seeded run twice gives the same weights on a multi-core CPU (issue 42, point 5.6): the
tiny DeepSeek-V3 (top-3) differed in 73 of 85 tensors before, through the experts' gather, whose
gradient the CPU accumulated in thread order; ``--deterministic`` (auto: on for the CPU) fixes it,
and the process's own setting is restored after the run."""

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from probmoe.cli import train
from probmoe.experiments import determinism

QA = [{"question": f"What is {i} times 3?", "answer": f"{i} times 3 is {3 * i}."} for i in range(8)]


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_a_seeded_deepseek_v3_run_repeats_bit_for_bit(tmp_path):
    if torch.get_num_threads() < 2:
        pytest.skip("one thread: the gather's accumulation order cannot differ")
    from safetensors.torch import load_file

    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in QA), encoding="utf-8")
    weights = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert (
            train.main(
                [
                    "--model",
                    "tiny-deepseek-v3",
                    "--method",
                    "probmoe-grouped",
                    "--data",
                    str(data),
                    "--output-dir",
                    str(out),
                    "--max-steps",
                    "3",
                    "--batch-size",
                    "4",
                    "--no-progress",
                ]
            )
            == 0
        )
        weights.append(load_file(str(out / "model.safetensors")))
    a, b = weights
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert not torch.are_deterministic_algorithms_enabled()  # the process's setting is back


def test_the_switch():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert determinism.wanted("auto", cpu) and not determinism.wanted("auto", cuda)
    assert determinism.wanted("on", cuda) and not determinism.wanted("off", cpu)
    with pytest.raises(ValueError, match="--deterministic must be one of auto, on, off"):
        determinism.wanted("yes", cpu)
    with determinism.kernels("auto", cpu):
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
