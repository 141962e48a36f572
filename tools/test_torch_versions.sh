#!/usr/bin/env bash
# Run the core test suite (circuits and the probmoe core: no transformers) on another torch release
# than the installed one, in a virtual environment of its own under $TMPDIR. The default, 2.11.0,
# is the oldest release pyproject.toml admits (and the one on the GPU machines); the newest, 2.13.0,
# is what CI installs for everything else.
#   bash tools/test_torch_versions.sh [VERSION] [pytest args...]
#   bash tools/test_torch_versions.sh VERSION --build-only     (the venv and torch only: CI makes it while other tests run)
# PyPI's Linux wheels of torch before 2.13 are CUDA builds (several GB with their nvidia-* packages);
# they run on a machine without a GPU, which is all the core suite needs.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-2.11.0}
shift || true
venv=${TMPDIR:-/tmp}/probmoe-torch-$version
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "torch==$version"
fi
[ "${1:-}" = "--build-only" ] && exit 0  # the project is installed by the run itself: never two builds at once
# the project and its test extra, torch left as installed (the project's range must admit it)
"$venv/bin/pip" install --quiet --disable-pip-version-check -e ".[test]"
# the triton that torch before 2.13 brings (3.6 with 2.11) has an interpreter that converts 1-element
# arrays to Python ints, which NumPy 2.4 refuses (TypeError inside every interpreted kernel); the
# triton our main suite runs, 3.9, does not: the interpreted Triton tests need NumPy below 2.4 before it
if "$venv/bin/python" -c "import sys, triton; sys.exit(tuple(map(int, triton.__version__.split('.')[:2])) >= (3, 9))" 2>/dev/null; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check "numpy<2.4"
fi
"$venv/bin/python" -c "import torch; print('torch', torch.__version__, 'from', torch.__file__)"
"$venv/bin/python" -m pytest tests/circuits tests/probmoe -q -p no:cacheprovider "$@"
