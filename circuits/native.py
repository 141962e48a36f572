"""The fused fp32 CPU passes of ``circuits/native/*.c``: built on first use, loaded with ctypes.

The C passes evaluate one tile of tokens through the whole circuit while it stays in cache (see
passes.c): log Z and the marginals, sampling, MAP, Cov(z) v, and the exactly-k shift.
``circuits.kernels`` is their plain-torch reference and the path for fp64, CUDA, and machines
without a C compiler. The library is built with the system's ``cc`` into
``<cache dir>/native/<hash>/`` (the hash covers the sources, the flags, the compiler and the CPU,
since it is built with -march=native), installed with its sha256 by atomic renames, and rebuilt
when it does not match or load; a read-only cache builds into a temporary directory.
``PROBMOE_NATIVE=0`` turns the C passes off; ``describe()`` says which passes run and why.
Tiles of tokens are split between ``torch.get_num_threads()`` OpenMP threads; linked against
libgomp, the library shares the OpenMP runtime torch has loaded, so torch's idle workers run them.
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

import torch
from torch import Tensor

from .cache import default_cache_dir

SOURCES = Path(__file__).with_name("native")
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-std=c11", "-fopenmp"]
if platform.machine() in ("x86_64", "AMD64"):
    FLAGS.append("-mprefer-vector-width=512")  # AVX-512 where the CPU has it: 20 % faster here; else ignored
FAST_MATH_UNIT = "vmath.c"  # the one unit built with -ffast-math (SIMD exp/log from libmvec)


class _Prog(ctypes.Structure):
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


def _path(cc: str) -> Path:
    """Where the library built by ``cc`` for this machine lives (a sibling .sha256 vouches for it)."""
    return default_cache_dir() / "native" / _key(cc) / "libpasses.so"


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
        lib.pm_kth_largest.restype = None
    except AttributeError as err:
        raise OSError(f"{path} lacks the passes: {err}") from None
    lib.pm_sample.argtypes = [ctypes.POINTER(_Prog), ptr, ptr, ptr, ptr, ptr, ptr, i64, i64]
    lib.pm_jvp.argtypes = [ctypes.POINTER(_Prog), ptr, ptr, ptr, i64, i64]
    lib.pm_marginals.argtypes = [ctypes.POINTER(_Prog), ptr, ptr, ptr, i64, i64]
    lib.pm_map.argtypes = [ctypes.POINTER(_Prog), ptr, ptr, ptr, i64, i64]
    lib.pm_kth_largest.argtypes = [ptr, i64, i64, i64, ptr, i64]
    return lib


_lock = threading.Lock()
_state: dict = {}


def library() -> ctypes.CDLL | None:
    """The loaded library, building it if needed; None when it is turned off or cannot be built
    (a warning says why, once; ``describe()`` too)."""
    if "lib" in _state:
        return _state["lib"]
    with _lock:
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
    """Which passes fp32 CPU calls take, and why: one line for reports."""
    lib = library()
    where = _state["where"]
    return f"fused C passes ({where})" if lib is not None else f"torch passes (C passes {where})"


def available(r: Tensor) -> bool:
    """Whether the C passes take ``r``: fp32 on the CPU, and the library is there."""
    return r.device.type == "cpu" and r.dtype == torch.float32 and library() is not None


def _view(prog) -> tuple:
    """(C struct, uid, tensors it points into) for a ``kernels.Program``, cached on it. uid: long
    [S], each decision slot's vtree id (its row of the sampling uniforms), 0 elsewhere."""
    cached = getattr(prog, "_native", None)
    if cached is None:
        nodes = torch.tensor([[g.start + j, g.rows.start + j * g.fanin, g.fanin] for g in prog.groups
                              for j in range(g.nodes)], dtype=torch.int64)  # [D, 3], bottom-up
        ids, _ = prog.scope_ids
        uid = torch.zeros(prog.num_slots, dtype=torch.int64)
        for g in prog.groups:
            uid[g.slots] = ids[g.start].cpu()
        order = torch.argsort(prog.implicit_row, stable=True)  # implicit pairs by element row, CSR
        imp_var = prog.implicit_var[order].contiguous()
        imp_off = torch.zeros(prog.num_rows + 1, dtype=torch.int64)
        imp_off[1:] = torch.bincount(prog.implicit_row, minlength=prog.num_rows).cumsum(0)
        st = _Prog(prog.n, prog.num_slots, prog.num_rows, len(nodes), int(prog.smooth),
                   nodes.data_ptr(), prog.prime.data_ptr(), prog.sub.data_ptr(), imp_off.data_ptr(),
                   imp_var.data_ptr())
        cached = prog._native = (st, uid, (nodes, prog.prime, prog.sub, imp_off, imp_var))
    return cached


def _run(fn, *args) -> None:
    """Call a pass with torch's thread count (OpenMP threads inside; ctypes releases the GIL)."""
    if fn(*args, torch.get_num_threads()):
        raise MemoryError("circuits: the C passes could not allocate their scratch")


def sample(prog, r: Tensor, uniforms: Tensor, fill: Tensor | None) -> tuple[Tensor, Tensor]:
    """kernels.sample's draw from the same uniforms (``kernels.draw_uniforms``): r [T, n] fp32,
    uniforms [count, T], fill [T, n] or None -> (z [T, n] in {0, 1}, log Z [T], the root's value
    for the input checks)."""
    st, uid, _ = _view(prog)
    r, uniforms = r.contiguous(), uniforms.contiguous()
    fill = None if fill is None else fill.contiguous()
    T = r.shape[0]
    z, log_z = torch.empty_like(r), r.new_empty(T)
    _run(library().pm_sample, ctypes.byref(st), r.data_ptr(), uniforms.data_ptr(), uid.data_ptr(),
         None if fill is None else fill.data_ptr(), z.data_ptr(), log_z.data_ptr(), T)
    return z, log_z


def log_partition(prog, r: Tensor, marginals: bool) -> tuple[Tensor, Tensor | None]:
    """(log Z [T], the marginals [T, n] or None) as kernels.upward, downward and
    marginals_from_flows: r [T, n] fp32."""
    st, _, _ = _view(prog)
    r = r.contiguous()
    log_z, m = r.new_empty(r.shape[0]), torch.empty_like(r) if marginals else None
    _run(library().pm_marginals, ctypes.byref(st), r.data_ptr(), None if m is None else m.data_ptr(),
         log_z.data_ptr(), r.shape[0])
    return log_z, m


def map_assignment(prog, r: Tensor) -> tuple[Tensor, Tensor]:
    """kernels.max_upward then map_assignment: r [T, n] fp32 -> (z [T, n] in {0, 1}, the root's
    max log-value [T], -inf where nothing satisfies: for the input checks)."""
    st, _, _ = _view(prog)
    r = r.contiguous()
    z, best = torch.empty_like(r), r.new_empty(r.shape[0])
    _run(library().pm_map, ctypes.byref(st), r.data_ptr(), z.data_ptr(), best.data_ptr(), r.shape[0])
    return z, best


def marginals_jvp(prog, r: Tensor, v: Tensor) -> Tensor:
    """Cov(z) v as kernels.marginals_jvp: r, v [T, n] fp32 -> [T, n]."""
    st, _, _ = _view(prog)
    r, v = r.contiguous(), v.contiguous()
    out = torch.empty_like(r)
    _run(library().pm_jvp, ctypes.byref(st), r.data_ptr(), v.data_ptr(), out.data_ptr(), r.shape[0])
    return out


def kth_largest(r: Tensor, k: int) -> Tensor:
    """Each row's k-th largest value, as ``r.topk(k).values.amin(-1)``: r [T, n] fp32 -> [T]."""
    r = r.contiguous()
    out = r.new_empty(r.shape[0])
    library().pm_kth_largest(r.data_ptr(), r.shape[0], r.shape[1], k, out.data_ptr(), torch.get_num_threads())
    return out
