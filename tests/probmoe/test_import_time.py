"""Importing the packages leaves torch._dynamo (about 1.5 s of start-up) to the first torch.compile."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository


@pytest.mark.parametrize("module", ["circuits", "probmoe", "probmoe.integrations.transformers"])
def test_import_does_not_load_dynamo(module):
    if module.endswith("transformers"):
        pytest.importorskip("transformers", minversion="5.0")
    code = f"import sys, {module}; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False", f"import {module} imported torch._dynamo (python -X importtime names who)"


def test_constant_result_mark_is_torchs():
    """constraints marks its cached look-ups as torch.compiler.assume_constant_result would (which
    imports torch._dynamo); if torch changes how it marks them, this fails (and the fullgraph tests
    of test_ops_compile.py / test_transformers_compile.py would break on a cold cache)."""
    import torch

    from probmoe import constraints

    def ours():
        return 0

    def torchs():
        return 0

    constraints._assume_constant_result(ours)
    assert torch.compiler.assume_constant_result(torchs) is torchs
    assert vars(ours) == vars(torchs) == {"_dynamo_marked_constant": True}
    assert constraints._ensure._dynamo_marked_constant and constraints._ensure_cardinality._dynamo_marked_constant
