"""``NativeLibrary``: a shared library built from C sources on first use, loaded with ctypes.

A library is built with the system's ``cc`` into ``<cache dir>/native/<key>/lib<name>.so`` (the key
hashes the sources, the flags, the compiler and the CPU, since it is built with -march=native),
installed with its sha256 by atomic renames, and rebuilt when it does not match or does not load; a
read-only cache builds into a temporary directory. ``PROBMOE_NATIVE=0`` turns every library off.
Linked against libgomp, a library shares the OpenMP runtime torch has loaded, so torch's idle
workers run its parallel loops. The circuit passes (``circuits.passes.c_library``) are one such
library; other packages build theirs the same way.
"""

from __future__ import annotations

import atexit
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
from typing import Callable

import torch

from ..cache_dir import default_cache_dir

FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-std=c11", "-fopenmp"]
if platform.machine() in ("x86_64", "AMD64"):
    FLAGS.append("-mprefer-vector-width=512")  # AVX-512 where the CPU has it: 20 % faster here; else ignored
VMATH = Path(__file__).parent / "c" / "vmath.c"  # SIMD exp/log/log1p, the -ffast-math unit
SCRATCH = Path(__file__).parent / "c" / "scratch.c"  # pm_scratch: per-thread scratch buffers


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build_dir() -> Path:
    """The folder of built libraries, one subfolder per build key: ``<cache dir>/native``."""
    return default_cache_dir() / "native"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class NativeLibrary:
    """lib<name>.so built from ``sources`` (C files; ``fast_math`` among them is the one unit built
    with -ffast-math, for libmvec's SIMD exp/log), its functions declared by ``declare(lib)``, which
    raises AttributeError when one is missing (a foreign or stale file). ``library()`` builds and
    loads it once per process; ``describe()`` says where it is or why it is not used."""

    def __init__(self, name: str, sources: list[Path], declare: Callable[[ctypes.CDLL], None],
                 fast_math: Path | None = VMATH, label: str = "C library"):
        self.name, self.sources, self.declare, self.fast_math = name, sorted(sources), declare, fast_math
        self.label = label  # what reports call it: "C passes unavailable: ..."
        self.lock = threading.Lock()  # taken to load, and by anything that caches what points into it
        self.state: dict = {}

    def path(self, cc: str) -> Path:
        """Where the library built by ``cc`` for this machine lives (a sibling .sha256 vouches for it)."""
        h = hashlib.sha256()
        for src in self.sources:
            h.update(src.name.encode() + src.read_bytes())
        version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
        h.update(" ".join(FLAGS).encode() + version.encode() + _cpu_id().encode())
        return build_dir() / h.hexdigest()[:16] / f"lib{self.name}.so"

    def build(self, cc: str, out: Path) -> None:
        """Compile each unit, then link without -ffast-math (which would change the process's
        denormal mode); install ``out`` and its digest by atomic renames."""
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            objects = []
            for src in self.sources:
                obj = Path(tmp) / (src.stem + ".o")
                extra = ["-ffast-math"] if src == self.fast_math else []
                subprocess.run([cc, *FLAGS, *extra, "-c", str(src), "-o", str(obj)], check=True, capture_output=True)
                objects.append(str(obj))
            lib = Path(tmp) / out.name
            subprocess.run([cc, "-shared", "-fopenmp", *objects, "-o", str(lib), "-lmvec", "-lm"],
                           check=True, capture_output=True)
            stamp = Path(tmp) / "digest"
            stamp.write_text(digest(lib))
            os.replace(lib, out)
            os.replace(stamp, out.with_suffix(".so.sha256"))

    def load(self, path: Path) -> ctypes.CDLL:
        """Load a library whose digest matches; OSError otherwise (missing, damaged, foreign)."""
        stamp = path.with_suffix(".so.sha256")
        if not stamp.exists() or stamp.read_text().strip() != digest(path):
            raise OSError(f"{path} does not match its digest")
        lib = ctypes.CDLL(str(path))
        try:
            self.declare(lib)
        except AttributeError as err:
            raise OSError(f"{path} lacks a function: {err}") from None
        return lib

    def library(self) -> ctypes.CDLL | None:
        """The loaded library, building it if needed; None when it is turned off or cannot be built
        (a warning says why, once; ``describe()`` too)."""
        if "lib" in self.state:
            return self.state["lib"]
        with self.lock:
            if "lib" in self.state:
                return self.state["lib"]
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
                    path = self.path(cc)
                    try:
                        lib = self.load(path)
                    except OSError:  # missing, damaged or foreign: build it (again)
                        try:
                            self.build(cc, path)
                        except PermissionError:  # a read-only cache: build for this process only
                            tmp = tempfile.mkdtemp(prefix="probmoe-native-")
                            atexit.register(shutil.rmtree, tmp, True)  # nothing left behind in /tmp
                            path = Path(tmp) / path.name
                            self.build(cc, path)
                        lib = self.load(path)
                    where = str(path)
                except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
                    detail = (getattr(err, "stderr", b"") or b"").decode(errors="replace")[-300:]
                    where = f"unavailable: {err}{'; ' + detail if detail else ''}"
                    warnings.warn(f"{self.name}: {self.label} {where}; using the torch code", RuntimeWarning)
            self.state["lib"], self.state["where"] = lib, where
            return lib

    def takes(self, device: torch.device, dtype: torch.dtype) -> ctypes.CDLL | None:
        """The library when tensors of ``dtype`` on ``device`` take the C code (float32 on the CPU,
        the library built), else None: the one place that makes this choice."""
        if dtype != torch.float32 or torch.device(device).type != "cpu":
            return None
        return self.library()

    def describe(self) -> str:
        """Where the library is, or why it is not used: one line for reports."""
        return self.state["where"] if self.library() is not None else f"{self.label} {self.state['where']}"
