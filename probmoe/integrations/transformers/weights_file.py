"""Checks of a checkpoint directory's safetensors weights before any loader reads them.

A truncated or overwritten ``model.safetensors`` makes the safetensors library fail deep inside
transformers' loader (``SafetensorError: header too large``, ``incomplete metadata``); here the
same damage is one ``DamagedWeightsError`` naming the file and what is wrong. The safetensors
layout checked:

    bytes 0..8       n, the header length, unsigned 64-bit little-endian
    bytes 8..8+n     the header: a JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]},
                     "__metadata__": {str: str} (optional)}
    bytes 8+n..      the tensor data; each tensor's bytes are [8+n+begin, 8+n+end), end - begin =
                     (bytes of dtype) · prod(shape), all within the file

Only the header is read (at most ``MAX_HEADER`` bytes), never the tensor data. A sharded
checkpoint's ``model.safetensors.index.json`` must name shards that exist.
"""

from __future__ import annotations

import glob
import json
import math
import os
import struct

MAX_HEADER = 100_000_000  # the safetensors library's own limit on the header length
INDEX = "model.safetensors.index.json"
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


class DamagedWeightsError(ValueError):
    """A weights file that cannot be a valid safetensors file; ``path`` is the file."""

    def __init__(self, path: str, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path}: damaged weights file: {problem}; re-save or re-download the checkpoint")


def check_weights_file(path) -> int:
    """Check one safetensors file's header against its size; returns the number of tensors.
    DamagedWeightsError naming ``path`` if it cannot be valid."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise DamagedWeightsError(path, f"{size} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, MAX_HEADER):
                raise DamagedWeightsError(
                    path,
                    f"header length {n} bytes does not fit the file of {size} bytes "
                    "(truncated, or its first bytes overwritten)",
                )
            raw = f.read(n)
    except OSError as e:
        raise DamagedWeightsError(path, f"unreadable ({e.strerror or e})") from e
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DamagedWeightsError(path, f"the {n}-byte header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise DamagedWeightsError(path, f"the header is a JSON {type(header).__name__}, not an object")
    data = size - 8 - n  # bytes of tensor data
    tensors = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors += 1
        _check_tensor(path, name, info, data)
    return tensors


def _check_tensor(path: str, name: str, info, data: int) -> None:
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise DamagedWeightsError(path, f"tensor {name!r} has no dtype, shape and data_offsets in the header")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in DTYPE_BYTES:
        raise DamagedWeightsError(path, f"tensor {name!r} has unknown dtype {dtype!r}")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise DamagedWeightsError(path, f"tensor {name!r} has a bad shape {shape!r}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise DamagedWeightsError(path, f"tensor {name!r} has bad data_offsets {offsets!r}")
    if offsets[1] > data:
        raise DamagedWeightsError(
            path,
            f"tensor {name!r} ends at byte {offsets[1]} of the data but the file holds "
            f"{data} bytes of data (truncated)",
        )
    if offsets[1] - offsets[0] != DTYPE_BYTES[dtype] * math.prod(shape):
        raise DamagedWeightsError(
            path, f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for a {dtype} tensor of shape {shape}"
        )


def check_weights_files(directory) -> list[str]:
    """Check every ``*.safetensors`` file of a checkpoint directory (and, if present, that the
    shards named by ``model.safetensors.index.json`` exist); returns the checked paths, sorted
    (empty when the directory holds no safetensors file: the loader then says what it misses).
    DamagedWeightsError naming the first damaged file."""
    directory = os.fspath(directory)
    paths = sorted(glob.glob(os.path.join(glob.escape(directory), "*.safetensors")))
    index = os.path.join(directory, INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                shards = set(json.load(f)["weight_map"].values())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise DamagedWeightsError(index, f"not a valid safetensors index ({type(e).__name__}: {e})") from None
        missing = sorted(str(s) for s in shards if not os.path.isfile(os.path.join(directory, str(s))))
        if missing:
            raise DamagedWeightsError(index, f"names shards that are missing: {', '.join(missing)}")
    for path in paths:
        check_weights_file(path)
    return paths
