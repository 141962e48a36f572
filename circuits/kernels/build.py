"""``NativeLibrary``: a shared library of C sources, shipped prebuilt or built on first use, loaded with ctypes.

A library is built with the system's ``cc`` for one instruction set (``ISAS``: ``avx512``,
``avx2``, ``portable``) into ``<cache dir>/native/<key>/lib<name>.so`` (the key hashes the sources,
the flags, the ISA among them, the compiler and the CPU), installed with its sha256 by atomic
renames, and rebuilt when it does not match or does not load; a read-only cache builds into a
temporary directory. A failed build is one warning line (the compiler's first error and where its
full log is) and leaves no folder behind. A wheel ships the library prebuilt for every ISA
(``ship``, called by setup.py at wheel-build time: the same compile, for any CPU of the ISA rather
than this one) in a ``prebuilt`` folder beside the sources; one whose sources match is loaded
first, and the first-use build is the fallback (an editable install, another platform, changed
sources). The ISA is the best this CPU runs, read from its flags in /proc/cpuinfo at
run time (``best_isa()``), or the one ``PROBMOE_NATIVE_ISA`` names (for tests and benchmarks: one
the CPU lacks, or a name not in ``ISAS``, is refused with a warning and the torch code runs). A
CPU that is neither x86-64 nor 64-bit Arm, or no library and no compiler, leaves the torch code too, with one
warning per library. ``PROBMOE_NATIVE=0`` turns every library off. Linked against libgomp, a
library shares the OpenMP runtime torch has loaded, so torch's idle workers run its parallel
loops. The kernels' library (``circuits.kernels.library``: the circuit passes, the DP's sweeps, the
row operations) is one such library; other packages build theirs the same way.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache_dir import default_cache_dir

if TYPE_CHECKING:
    import torch

FLAGS = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fPIC", "-std=c11", "-fopenmp"]
X86 = platform.machine() in ("x86_64", "AMD64")
ARM = platform.machine() in ("aarch64", "arm64")
ISAS = ("avx512", "avx2", "portable")  # best first
# The /proc/cpuinfo flags each x86 level needs (the psABI's x86-64-v2, -v3, -v4).
_V2 = {"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"}
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


def _cpu_flags() -> set[str] | None:
    """This CPU's feature flags (the first "flags" line of /proc/cpuinfo), None when unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.partition(":")[2].split())
    return None


def runnable_isas() -> list[str]:
    """The ISAs of ``ISAS`` this CPU runs, best first ([] for an unknown CPU): on x86-64 from its
    flags (avx512 = x86-64-v4, avx2 = x86-64-v3); on 64-bit Arm only "portable" (NEON is part of
    the base architecture)."""
    if ARM:
        return ["portable"]
    if not X86:
        return []
    flags = _cpu_flags() or set()
    return [isa for isa, need in (("avx512", _V4), ("avx2", _V3)) if need <= flags] + ["portable"]


def best_isa() -> str | None:
    """The best ISA this CPU runs, None for an unknown CPU."""
    isas = runnable_isas()
    return isas[0] if isas else None


def isa_flags(isa: str, any_cpu: bool = False) -> list[str]:
    """The compiler flags of ``isa``: a baseline architecture level and tuning for this CPU, or,
    with ``any_cpu`` (a wheel's prebuilt library), generic tuning and x86-64-v2 for the portable
    build. The portable build has no intrinsics: its loops are plain C that gcc and clang vectorise
    for SSE (x86-64-v2) or NEON (the Arm base)."""
    if isa not in ISAS:
        raise ValueError(f"unknown ISA {isa!r}: one of {', '.join(ISAS)}")
    if ARM:
        return []
    tune = "-mtune=generic" if any_cpu else "-mtune=native"
    if isa == "avx512":  # 512-bit vectors: 20 % faster than 256 on the AVX-512 CPU measured
        return ["-march=x86-64-v4", tune, "-mprefer-vector-width=512"]
    if isa == "avx2":
        return ["-march=x86-64-v3", tune]
    v2 = any_cpu or (_cpu_flags() or set()) >= _V2
    return ["-march=x86-64-v2" if v2 else "-march=x86-64", tune]


def shipped_isas() -> tuple[str, ...]:
    """The ISAs a wheel built on this machine ships prebuilt: on Linux all of ``ISAS`` on x86-64,
    portable on 64-bit Arm; none elsewhere (the torch code runs there)."""
    if platform.system() != "Linux":
        return ()
    return ISAS if X86 else ("portable",) if ARM else ()


def runs_prebuilt(isa: str) -> bool:
    """Whether this CPU runs the prebuilt library of ``isa`` (built with ``isa_flags(isa, any_cpu=True)``):
    one of ``runnable_isas()``, and on x86-64 the portable build needs x86-64-v2."""
    if isa not in runnable_isas():
        return False
    return not (X86 and isa == "portable") or (_cpu_flags() or set()) >= _V2


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


def writable(folder: Path) -> bool:
    """Whether files can be created in ``folder``, or in the nearest folder above it that exists
    (where it would be made): a file is created there and removed, nothing else is."""
    folder = Path(folder)
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:  # not a folder, read-only, a pseudo file system (/proc)
        return False


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def requested_isa() -> tuple[str | None, str]:
    """(the ISA to build, "") or (None, why not): ``PROBMOE_NATIVE_ISA`` when set (it must be one
    this CPU runs), else the best this CPU runs."""
    want = os.environ.get("PROBMOE_NATIVE_ISA", "").strip().lower()
    isas = runnable_isas()
    if not isas:
        return None, f"unknown CPU ({platform.machine() or 'unnamed'}): no ISA to build for"
    if not want:
        return isas[0], ""
    if want not in ISAS:
        return None, f"PROBMOE_NATIVE_ISA={want!r} is not one of {', '.join(ISAS)}"
    if want not in isas:
        return None, f"PROBMOE_NATIVE_ISA={want!r}: this CPU runs only {', '.join(isas)}"
    return want, ""


def chosen_isa() -> tuple[str | None, str]:
    """(ISA, "") when this process loads native libraries, else (None, why not). A ``why``
    starting "unavailable" is a failure worth a warning; the others are choices."""
    if os.environ.get("PROBMOE_NATIVE", "1") == "0":
        return None, "turned off by PROBMOE_NATIVE=0"
    if platform.system() != "Linux":
        return None, f"not built on {platform.system()}"
    isa, why = requested_isa()
    return (isa, "") if isa is not None else (None, f"unavailable: {why}")


NO_COMPILER = "no C compiler (cc or $CC) found"


def choice() -> tuple[str | None, str | None, str]:
    """(compiler, ISA, "") when this process builds native libraries, else (None, None, why not):
    what a first-use build acts on, which reports read without building anything
    (``circuits.inspect.report.evaluator``). A ``why`` starting "unavailable" is a failure worth a
    warning; the others are choices."""
    isa, why = chosen_isa()
    if isa is None:
        return None, None, why
    cc = _compiler()
    if cc is None:
        return None, None, f"unavailable: {NO_COMPILER}"
    return cc, isa, ""


class BuildError(RuntimeError):
    """A compile or link that failed: its message is one line (the compiler's first error and the
    file that holds the full log)."""


def _run(command: list[str], log: Path) -> None:
    """Run a compiler command; BuildError naming its first error line and ``log`` (which then holds
    the command and its whole output) when it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 0:
        return
    lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
    first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else f"exit status {done.returncode}")
    log.write_text(" ".join(command) + "\n\n" + done.stderr + done.stdout)
    raise BuildError(f"{Path(command[0]).name} failed: {first} (full log: {log})")


class NativeLibrary:
    """lib<name>.so built from ``sources`` (C files; ``fast_math`` among them is the one unit built
    with -ffast-math, for libmvec's SIMD exp/log), its functions declared by ``declare(lib)``, which
    raises AttributeError when one is missing (a foreign or stale file). ``prebuilt`` is the folder
    a wheel ships it in (``<prebuilt>/<isa>/lib<name>.so``, written by ``ship``), None for a library
    only ever built on first use. ``library()`` loads it once per process for the ISA
    ``requested_isa()`` names, the prebuilt one when it matches the sources, else built; ``variant(isa)``
    does the same for any other ISA this CPU runs (tests and benchmarks compare them); ``describe()``
    says where it is or why it is not used."""

    def __init__(
        self,
        name: str,
        sources: list[Path],
        declare: Callable[[ctypes.CDLL], None],
        fast_math: Path | None = VMATH,
        label: str = "C library",
        prebuilt: Path | None = None,
    ):
        self.name, self.sources, self.declare, self.fast_math = name, sorted(sources), declare, fast_math
        self.label = label  # what reports call it: "C passes unavailable: ..."
        self.prebuilt = prebuilt
        self.lock = threading.Lock()  # taken to load, and by anything that caches what points into it
        self.state: dict = {}
        self.variants: dict[tuple[str, Path], ctypes.CDLL] = {}  # (isa, build dir) -> loaded library

    def headers(self) -> list[Path]:
        """The headers the sources include by a quoted relative path (``#include "x.h"``), which a
        change must rebuild as well."""
        found = set()
        for src in self.sources:
            for name in re.findall(r'^#include "([^"]+)"', src.read_text(), flags=re.M):
                found.add((src.parent / name).resolve())
        return sorted(found)

    def sources_digest(self) -> str:
        """The sha256 of the sources and the headers they include, names and contents."""
        h = hashlib.sha256()
        for src in self.sources + self.headers():
            h.update(src.name.encode() + src.read_bytes())
        return h.hexdigest()

    def path(self, cc: str, isa: str | None = None) -> Path:
        """Where the library built by ``cc`` for ``isa`` (default: the one ``library()`` builds) on
        this machine lives (a sibling .sha256 vouches for it)."""
        isa = isa or requested_isa()[0] or "portable"
        h = hashlib.sha256(self.sources_digest().encode())
        version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
        h.update(" ".join(FLAGS + isa_flags(isa)).encode() + version.encode() + _cpu_id().encode())
        return build_dir() / f"{isa}-{h.hexdigest()[:16]}" / f"lib{self.name}.so"

    def build(self, cc: str, out: Path, isa: str | None = None, any_cpu: bool = False) -> None:
        """Compile each unit for ``isa`` (for any CPU of it with ``any_cpu``, else for this one), then
        link without -ffast-math (which would change the process's denormal mode); install ``out``
        and its digest by atomic renames. A failure is a BuildError whose full log lies beside
        ``out``'s folder (``<folder>.log``), and a folder this build made is removed."""
        flags = FLAGS + isa_flags(isa or requested_isa()[0] or "portable", any_cpu)
        made = not out.parent.exists()
        out.parent.mkdir(parents=True, exist_ok=True)
        log = out.parent.with_name(out.parent.name + ".log")
        try:
            with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
                objects = []
                for src in self.sources:
                    obj = Path(tmp) / (src.stem + ".o")
                    extra = ["-ffast-math"] if src == self.fast_math else []
                    _run([cc, *flags, *extra, "-c", str(src), "-o", str(obj)], log)
                    objects.append(str(obj))
                lib = Path(tmp) / out.name
                link = [cc, "-shared", "-fopenmp", *objects, "-o", str(lib), "-lm"]
                try:
                    _run(link[:-1] + ["-lmvec", "-lm"], log)
                except BuildError:  # a libc without libmvec (older glibc on Arm, musl)
                    _run(link, log)
                stamp = Path(tmp) / "digest"
                stamp.write_text(digest(lib))
                os.replace(lib, out)
                os.replace(stamp, out.with_suffix(".so.sha256"))
        except BaseException:
            if made and not any(out.parent.iterdir()):
                out.parent.rmdir()
            raise
        log.unlink(missing_ok=True)  # a failed try's log (the link without libmvec) is stale now

    def ship(self, folder: Path, cc: str | None = None, isas: tuple[str, ...] | None = None) -> list[Path]:
        """Build the library with ``cc`` (default: ``$CC`` or the system's) for each of ``isas``
        (default: ``shipped_isas()``) for any CPU of that ISA into ``<folder>/<isa>/lib<name>.so``, each
        with its digest and ``lib<name>.json`` (the sources' digest it was built from, the flags, the
        compiler): what a wheel holds (setup.py calls this at wheel-build time). Returns the
        libraries' paths; RuntimeError without a compiler, BuildError when one fails."""
        cc = cc or _compiler()
        if cc is None:
            raise RuntimeError(NO_COMPILER)
        built = []
        version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.partition("\n")[0]
        for isa in shipped_isas() if isas is None else isas:
            out = Path(folder) / isa / f"lib{self.name}.so"
            self.build(cc, out, isa, any_cpu=True)
            facts = {
                "sources": self.sources_digest(),
                "flags": FLAGS + isa_flags(isa, any_cpu=True),
                "compiler": version,
            }
            out.with_suffix(".json").write_text(json.dumps(facts, indent=1) + "\n")
            built.append(out)
        return built

    def prebuilt_path(self, isa: str) -> Path | None:
        """The prebuilt library for ``isa`` when one is shipped, was built from these sources and
        this CPU runs it; else None (the first-use build is the fallback)."""
        if self.prebuilt is None or not runs_prebuilt(isa):
            return None
        path = self.prebuilt / isa / f"lib{self.name}.so"
        try:
            facts = json.loads(path.with_suffix(".json").read_text())
        except (OSError, ValueError):
            return None
        return path if isinstance(facts, dict) and facts.get("sources") == self.sources_digest() else None

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

    def _load_or_build(self, isa: str) -> tuple[ctypes.CDLL, Path]:
        """The prebuilt library for ``isa`` if it loads, else the one built on this machine (built
        now if missing, damaged or foreign); RuntimeError without a compiler."""
        path = self.prebuilt_path(isa)
        if path is not None:
            try:
                return self.load(path), path
            except OSError:  # damaged: the first-use build below
                pass
        cc = _compiler()
        if cc is None:
            raise RuntimeError(NO_COMPILER)
        path = self.path(cc, isa)
        try:
            return self.load(path), path
        except OSError:  # missing, damaged or foreign: build it (again)
            try:
                if not writable(path.parent):  # a cache under a file or on /proc: not only PermissionError
                    raise PermissionError(13, "not writable", str(path.parent))
                self.build(cc, path, isa)
            except PermissionError:  # a read-only or unusable cache: build for this process only
                tmp = tempfile.mkdtemp(prefix="probmoe-native-")
                atexit.register(shutil.rmtree, tmp, True)  # nothing left behind in /tmp
                path = Path(tmp) / path.name
                self.build(cc, path, isa)
            return self.load(path), path

    def variant(self, isa: str) -> ctypes.CDLL:
        """The library for ``isa`` (one of ``ISAS`` this CPU runs), prebuilt or built, loaded once
        per process and cache directory; RuntimeError when the CPU or the compiler cannot. For tests
        and benchmarks: the passes use ``library()``."""
        if isa not in runnable_isas():
            raise RuntimeError(f"this CPU does not run {isa!r} (it runs {', '.join(runnable_isas()) or 'none'})")
        with self.lock:
            key = (isa, build_dir())
            if key not in self.variants:
                self.variants[key] = self._load_or_build(isa)[0]
            return self.variants[key]

    def library(self) -> ctypes.CDLL | None:
        """The loaded library, prebuilt or built if needed; None when it is turned off or cannot be
        had (a one-line warning says why, once; ``describe()`` too)."""
        if "lib" in self.state:
            return self.state["lib"]
        with self.lock:
            if "lib" in self.state:
                return self.state["lib"]
            lib = None
            isa, where = chosen_isa()
            if isa is not None:
                try:
                    lib, path = self._load_or_build(isa)
                    where = str(path)
                except (OSError, RuntimeError, ValueError) as err:
                    where, isa = f"unavailable: {err}", None
            if where.startswith("unavailable"):
                warnings.warn(f"{self.name}: {self.label} {where}; using the torch code", RuntimeWarning, stacklevel=2)
            self.state["lib"], self.state["where"], self.state["isa"] = lib, where, isa
            return lib

    def isa(self) -> str | None:
        """The ISA ``library()`` was built for, None when it is not used."""
        self.library()
        return self.state.get("isa")

    def takes(self, device: torch.device, dtype: torch.dtype) -> ctypes.CDLL | None:
        """The library when tensors of ``dtype`` on ``device`` take the C code (float32 on the CPU,
        the library built), else None: the one place that makes this choice."""
        import torch  # the build machinery itself runs without torch (``plan``)

        if dtype != torch.float32 or torch.device(device).type != "cpu":
            return None
        return self.library()

    def describe(self) -> str:
        """Where the library is, or why it is not used: one line for reports."""
        return self.state["where"] if self.library() is not None else f"{self.label} {self.state['where']}"
