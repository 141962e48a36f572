"""The fused C passes' shared library: built from ``c/*.c`` on first use, loaded with ctypes.

The library is built with the system's ``cc`` into ``<cache dir>/native/<hash>/`` (the hash covers
the sources, the flags, the compiler and the CPU, since it is built with -march=native),
installed with its sha256 by atomic renames, and rebuilt when it does not match or load; a
read-only cache builds into a temporary directory. ``PROBMOE_NATIVE=0`` turns it off. Linked
against libgomp, it shares the OpenMP runtime torch has loaded, so torch's idle workers run it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

from ..cache_dir import default_cache_dir

SOURCES = Path(__file__).with_name("c")
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-std=c11", "-fopenmp"]
if platform.machine() in ("x86_64", "AMD64"):
    FLAGS.append("-mprefer-vector-width=512")  # AVX-512 where the CPU has it: 20 % faster here; else ignored
FAST_MATH_UNIT = "vmath.c"  # the one unit built with -ffast-math (SIMD exp/log from libmvec)


class ProgStruct(ctypes.Structure):
    """The C `Prog` of passes.c: a program's sizes and pointers to its index arrays."""

    _fields_ = [("n", ctypes.c_int64), ("num_slots", ctypes.c_int64), ("num_rows", ctypes.c_int64),
                ("num_nodes", ctypes.c_int64), ("smooth", ctypes.c_int64), ("nodes", ctypes.c_void_p),
                ("prime", ctypes.c_void_p), ("sub", ctypes.c_void_p), ("imp_off", ctypes.c_void_p),
                ("imp_var", ctypes.c_void_p)]


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _key(cc: str) -> str:
    h = hashlib.sha256()
    for path in sorted(SOURCES.glob("*.c")):
        h.update(path.name.encode() + path.read_bytes())
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    h.update(" ".join(FLAGS).encode() + version.encode() + _cpu_id().encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    """The folder of built libraries, one subfolder per build key: ``<cache dir>/native``."""
    return default_cache_dir() / "native"


def _path(cc: str) -> Path:
    """Where the library built by ``cc`` for this machine lives (a sibling .sha256 vouches for it)."""
    return build_dir() / _key(cc) / "libpasses.so"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build(cc: str, out: Path) -> None:
    """Compile each unit, then link without -ffast-math (which would change the process's
    denormal mode); install ``out`` and its digest by atomic renames."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        objects = []
        for src in sorted(SOURCES.glob("*.c")):
            obj = Path(tmp) / (src.stem + ".o")
            extra = ["-ffast-math"] if src.name == FAST_MATH_UNIT else []
            subprocess.run([cc, *FLAGS, *extra, "-c", str(src), "-o", str(obj)], check=True, capture_output=True)
            objects.append(str(obj))
        lib = Path(tmp) / "libpasses.so"
        link = [cc, "-shared", "-fopenmp", *objects, "-o", str(lib), "-lmvec", "-lm"]
        subprocess.run(link, check=True, capture_output=True)
        digest = Path(tmp) / "digest"
        digest.write_text(_digest(lib))
        os.replace(lib, out)
        os.replace(digest, out.with_suffix(".so.sha256"))


def _load(path: Path) -> ctypes.CDLL:
    """Load a library whose digest matches; OSError otherwise (missing, damaged, foreign)."""
    stamp = path.with_suffix(".so.sha256")
    if not stamp.exists() or stamp.read_text().strip() != _digest(path):
        raise OSError(f"{path} does not match its digest")
    lib = ctypes.CDLL(str(path))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    try:
        lib.pm_sample.restype = lib.pm_jvp.restype = lib.pm_marginals.restype = lib.pm_map.restype = i64
        lib.pm_kth_largest.restype = i64
    except AttributeError as err:
        raise OSError(f"{path} lacks the passes: {err}") from None
    lib.pm_sample.argtypes = [ctypes.POINTER(ProgStruct), ptr, ptr, ptr, ptr, ptr, ptr, i64, i64]
    lib.pm_jvp.argtypes = [ctypes.POINTER(ProgStruct), ptr, ptr, ptr, i64, i64]
    lib.pm_marginals.argtypes = [ctypes.POINTER(ProgStruct), ptr, ptr, ptr, i64, i64]
    lib.pm_map.argtypes = [ctypes.POINTER(ProgStruct), ptr, ptr, ptr, i64, i64]
    lib.pm_kth_largest.argtypes = [ptr, i64, i64, i64, ptr, i64]
    return lib


LOCK = threading.Lock()  # taken to load the library, and by anything that caches what points into it
_state: dict = {}


def library() -> ctypes.CDLL | None:
    """The loaded library, building it if needed; None when it is turned off or cannot be built
    (a warning says why, once; ``describe()`` too)."""
    if "lib" in _state:
        return _state["lib"]
    with LOCK:
        if "lib" in _state:
            return _state["lib"]
        lib, where = None, ""
        if os.environ.get("PROBMOE_NATIVE", "1") == "0":
            where = "turned off by PROBMOE_NATIVE=0"
        elif platform.system() != "Linux":
            where = f"not built on {platform.system()}"
        else:
            cc = _compiler()
            try:
                if cc is None:
                    raise RuntimeError("no C compiler (cc or $CC) found")
                path = _path(cc)
                try:
                    lib = _load(path)
                except OSError:  # missing, damaged or foreign: build it (again)
                    try:
                        _build(cc, path)
                    except PermissionError:  # a read-only cache: build for this process only
                        path = Path(tempfile.mkdtemp(prefix="probmoe-native-")) / path.name
                        _build(cc, path)
                    lib = _load(path)
                where = str(path)
            except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
                detail = (getattr(err, "stderr", b"") or b"").decode(errors="replace")[-300:]
                where = f"unavailable: {err}{'; ' + detail if detail else ''}"
                warnings.warn(f"circuits: the fused C passes are {where}; using the torch passes", RuntimeWarning)
        _state["lib"], _state["where"] = lib, where
        return lib


def describe() -> str:
    """Where the library is, or why it is not used: one line for reports."""
    return _state["where"] if library() is not None else f"C passes {_state['where']}"
