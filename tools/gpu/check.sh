#!/usr/bin/env bash
# The device check, one command:
#   bash tools/gpu/check.sh OUT_DIR [--budget-s 420] [--rehearse] [--wheels DIR]
# Installs, offline, the wheels in DIR (default tools/gpu/wheels, made by tools/gpu/wheels.sh) into a
# folder of its own on PYTHONPATH, then runs tools/gpu/check.py (the tests on cuda, the benchmarks,
# the commands) within the budget and writes OUT_DIR/gpu.json and OUT_DIR/gpu.md.
# --rehearse: the same on the CPU at tiny sizes; the wheels are then checked against the device's
# Python (3.12) and platform (pip's dry run), not installed.
set -euo pipefail
start=$(date +%s)
cd "$(dirname "$0")/../.."
usage="usage: bash tools/gpu/check.sh OUT_DIR [--budget-s 420] [--rehearse] [--wheels DIR]"
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || { echo "$usage" >&2; exit 2; }
out=$1; shift
wheels=tools/gpu/wheels rehearse=0 args=()
while [ $# -gt 0 ]; do
  case $1 in
    --wheels) [ $# -ge 2 ] || { echo "--wheels needs a folder; $usage" >&2; exit 2; }; wheels=$2; shift 2;;
    --rehearse) rehearse=1; args+=("$1"); shift;;
    --budget-s) [ $# -ge 2 ] || { echo "--budget-s needs a number of seconds; $usage" >&2; exit 2; }
                args+=("$1" "$2"); shift 2;;
    *) echo "unknown argument $1; $usage" >&2; exit 2;;
  esac
done
PY=${PYTHON:-python3}
mkdir -p "$out"
log=$out/install.log
: > "$log"
shopt -s nullglob
whl=("$wheels"/*.whl)
site=${TMPDIR:-/tmp}/probmoe-gpu-site
quiet=(--no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check)
if [ ${#whl[@]} -eq 0 ]; then
  echo "no wheels in $wheels: nothing installed (bash tools/gpu/wheels.sh $wheels makes them)" | tee -a "$log"
elif [ $rehearse = 1 ]; then
  # the device's interpreter and platform, not this one's: a dry run proves the wheels install there
  echo "rehearsal: ${#whl[@]} wheels checked for CPython 3.12 on manylinux x86_64 (pip --dry-run)" | tee -a "$log"
  "$PY" -m pip install "${quiet[@]}" --dry-run --ignore-installed --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --target "$site-dry" "${whl[@]}" >> "$log" 2>&1 || { echo "the wheels in $wheels do not install on the device's Python: see $log" >&2; exit 1; }
else
  echo "installing ${#whl[@]} wheels from $wheels into $site" | tee -a "$log"
  "$PY" -m pip install "${quiet[@]}" --upgrade --target "$site" "${whl[@]}" >> "$log" 2>&1 \
      || { echo "installing the wheels failed: see $log" >&2; exit 1; }
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
export PROBMOE_CHECK_ELAPSED=$(( $(date +%s) - start ))
exec "$PY" tools/gpu/check.py "$out" --install-log "$log" ${args[@]+"${args[@]}"}
