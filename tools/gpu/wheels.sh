#!/usr/bin/env bash
# The wheels the device image lacks, downloaded here for its Python (3.12) and platform:
#   bash tools/gpu/wheels.sh [DIR]      (default tools/gpu/wheels, which git ignores)
# The image (../shared/ARCHITECTURE.md, section 8) has torch 2.11.0 + CUDA 13.0, triton 3.6.0,
# transformers 5.17.0 and no pysdd or d4solver; tools/gpu/wheels.txt lists what is carried and why.
# DIR must stay under 60 MiB: the whole working tree that travels to the device is 64 MiB at most.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-tools/gpu/wheels}
mkdir -p "$dir"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
grep -v '^\s*#' tools/gpu/wheels.txt | grep -v '^\s*$' | sed 's/\s*#.*//' | while read -r want; do
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp "${platforms[@]}" -d "$dir" "$want"
done
size=$(du -sm "$dir" | cut -f1)
echo "$(ls "$dir"/*.whl | wc -l) wheels, ${size} MiB in $dir"
[ "$size" -lt 60 ] || { echo "$dir is ${size} MiB: over the 60 MiB that can travel with the tree" >&2; exit 1; }
