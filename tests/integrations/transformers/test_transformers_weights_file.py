"""Damaged safetensors files get one error naming the file (weights_file), before transformers reads them."""

import json
import struct

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")
safetensors_torch = pytest.importorskip("safetensors.torch")

import probmoe.integrations.transformers as pt  # noqa: E402
from probmoe.integrations.transformers.testing import tiny_model  # noqa: E402
from probmoe.integrations.transformers.weights_file import (  # noqa: E402
    DamagedWeightsError,
    check_weights_file,
    check_weights_files,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    pt.patch_model(tiny_model("olmoe"), "probmoe").save_pretrained(path)
    return path


def copy_of(saved, tmp_path):
    for f in saved.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    return tmp_path / "model.safetensors"


def test_a_good_checkpoint_passes(saved):
    paths = check_weights_files(saved)
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["model.safetensors"]
    assert check_weights_file(paths[0]) == len(safetensors_torch.load_file(paths[0]))


def test_truncated_to_1000_bytes(saved, tmp_path):
    weights = copy_of(saved, tmp_path)
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(DamagedWeightsError) as info:
        pt.from_pretrained(tmp_path)
    message = str(info.value)
    assert str(weights) in message and "\n" not in message
    assert info.value.path == str(weights)
    assert isinstance(info.value, ValueError)


def test_truncated_inside_the_data(saved, tmp_path):
    weights = copy_of(saved, tmp_path)
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(DamagedWeightsError, match="truncated"):
        pt.from_pretrained(tmp_path)


def test_first_8_bytes_overwritten(saved, tmp_path):
    weights = copy_of(saved, tmp_path)
    raw = weights.read_bytes()
    weights.write_bytes(b"\xff" * 8 + raw[8:])
    with pytest.raises(DamagedWeightsError, match="header length .* does not fit the file"):
        pt.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda h: h.replace(b"{", b"[", 1), "not valid JSON"),
        (lambda h: h.replace(b'"data_offsets":[0,', b'"data_offsets":[9,', 1), "bytes for a"),
        (lambda h: h.replace(b'"dtype":"F32"', b'"dtype":"F99"', 1), "unknown dtype"),
    ],
)
def test_corrupted_header(saved, tmp_path, edit, message):
    weights = copy_of(saved, tmp_path)
    raw = weights.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = edit(raw[8 : 8 + n])
    assert len(header) == n and header != raw[8 : 8 + n]  # the edit applied, same length
    weights.write_bytes(raw[:8] + header + raw[8 + n :])
    with pytest.raises(DamagedWeightsError, match=message):
        check_weights_files(tmp_path)


def test_tiny_and_empty_files(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(DamagedWeightsError, match="shorter than the 8-byte header length"):
        check_weights_files(tmp_path)
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    (tmp_path / "a.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    assert check_weights_file(tmp_path / "a.safetensors") == 0
    assert check_weights_files(tmp_path / "nothing-here") == []


def test_sharded_index_names_missing_shards(tmp_path):
    tensors = {"a": torch.zeros(3), "b": torch.ones(2, 2, dtype=torch.bfloat16)}
    safetensors_torch.save_file(tensors, str(tmp_path / "model-00001-of-00002.safetensors"))
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(DamagedWeightsError, match="model-00002-of-00002.safetensors"):
        check_weights_files(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(DamagedWeightsError, match="not a valid safetensors index"):
        check_weights_files(tmp_path)
