#!/usr/bin/env bash
# Run the transformers test files against another transformers release than the installed one
# (default: 5.23.0, the oldest the extra allows), installed apart with --no-deps under $TMPDIR.
#   bash tools/test_transformers_versions.sh [VERSION] [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-5.23.0}
shift || true
target=${TMPDIR:-/tmp}/probmoe-transformers-$version
[ -d "$target/transformers" ] || pip install --quiet --target "$target" --no-deps "transformers==$version"
export PYTHONPATH="$target:$PWD"
python -c "import transformers; print('transformers', transformers.__version__, 'from', transformers.__file__)"
python -m pytest tests/integrations/transformers/test_transformers_*.py tests/integrations/test_hf_trainer.py -q "$@"
