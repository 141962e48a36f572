"""Safetensors weight files checked before transformers reads them, so that a damaged file gets
one line naming it and what is wrong instead of a ``SafetensorError`` traceback.

A ``.safetensors`` file is: 8 bytes, the little-endian length n of a JSON header; the header,
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``; then the
data region, where each tensor holds bytes [begin, end) (offsets from the region's start). Only
the header is read, never the data.
"""

from __future__ import annotations

import json
import math
import os
import struct

DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def check_weights_file(path: str) -> None:
    """ValueError naming ``path`` if its header is unreadable or a tensor lies outside the data
    region (truncated or overwritten file)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size < 8:
            raise ValueError(f"{path}: damaged weights file ({size} bytes, shorter than the 8-byte header length)")
        (length,) = struct.unpack("<Q", f.read(8))
        if length > size - 8:
            raise ValueError(f"{path}: damaged weights file (its header claims {length} bytes, the file has "
                             f"{size - 8} after the length; truncated or overwritten?)")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: damaged weights file (its header is not JSON: {e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: damaged weights file (its header is not a JSON object)")
    region = size - 8 - length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_problem(info, region)
        if problem:
            raise ValueError(f"{path}: damaged weights file (tensor {name!r}: {problem})")


def _tensor_problem(info, region: int) -> str | None:
    if not isinstance(info, dict):
        return "its entry is not an object"
    offsets, shape, dtype = info.get("data_offsets"), info.get("shape"), info.get("dtype")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        return f"data_offsets {offsets!r} is not [begin, end]"
    begin, end = offsets
    if not 0 <= begin <= end <= region:
        return f"bytes [{begin}, {end}) lie outside the data region of {region} bytes (truncated file?)"
    if dtype in DTYPE_BYTES and isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape):
        expected = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - begin != expected:
            return f"{end - begin} bytes for a {dtype} tensor of shape {shape} ({expected} expected)"
    return None


def check_weights_files(directory: str) -> list[str]:
    """Check every ``*.safetensors`` file in ``directory`` (``check_weights_file``); returns
    their names, sorted. ValueError naming the first damaged file."""
    names = sorted(name for name in os.listdir(directory) if name.endswith(".safetensors"))
    for name in names:
        check_weights_file(os.path.join(directory, name))
    return names
