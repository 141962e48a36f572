"""The kernels' C library in one piece (issue 40, point 4): one folder of units, one header that every
unit includes and that declares each exported function once, units that compile clean under
-Wall -Wextra -Wmissing-prototypes for every instruction set this CPU runs, and the ctypes
declarations (``circuits.kernels.library``) that agree with the header."""

from __future__ import annotations

import ctypes
import re
import subprocess

import pytest

from circuits.kernels import build, library

C_TYPES = {"int64_t": ctypes.c_int64, "size_t": ctypes.c_size_t, "double": ctypes.c_double, "float": ctypes.c_float}
# a top-level function declaration (a type at column 0, then the name) ending in ");" or opening a body
TOP_LEVEL = r"^(?!static\b|typedef\b)(?:const )?[A-Za-z_]\w*(?: \w+)*[ *]+(\w+)\(([^;{]*)\)"


def _code(path) -> str:
    """The C text without comments."""
    return re.sub(r"/\*.*?\*/", " ", path.read_text(), flags=re.S)


def _ctype(decl: str):
    """The ctypes type of a declarator's C type, e.g. ``const Prog *`` or ``int64_t``."""
    decl = decl.replace("const ", "").strip()
    if decl.endswith("*"):
        return ctypes.POINTER(library.ProgStruct) if decl[:-1].strip() == "Prog" else ctypes.c_void_p
    return None if decl == "void" else C_TYPES[decl]


def _prototypes() -> dict[str, tuple]:
    """name -> (return type, [argument types]) of every function ``kernels.h`` declares."""
    found = {}
    text = _code(library.HEADER)
    for ret, name, args in re.findall(r"^((?:const )?\w+(?: \w+)*[ *]+?)(\w+)\(([^)]*)\);", text, flags=re.M):
        params = [] if args.strip() in ("", "void") else [re.sub(r"\w+$", "", a.strip()) for a in args.split(",")]
        found[name] = (_ctype(ret), [_ctype(p) for p in params])
    return found


def _prog_fields() -> list[tuple[str, object]]:
    """The fields of ``Prog`` in ``kernels.h``, in order, as (name, ctypes type)."""
    body = re.search(r"typedef struct \{(.*?)\} Prog;", _code(library.HEADER), flags=re.S).group(1)
    fields = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        base = re.match(r"(const )?(\w+)", decl).group(2)
        for item in decl[decl.index(base) + len(base) :].split(","):
            item = item.strip()
            fields.append((item.lstrip("*").strip(), ctypes.c_void_p if item.startswith("*") else C_TYPES[base]))
    return fields


def test_ctypes_declarations_are_the_headers():
    declared = _prototypes()
    for name, (restype, argtypes) in library.FUNCTIONS.items():
        assert name in declared, f"{name} is declared for ctypes but not in kernels.h"
        want_ret, want_args = declared[name]
        assert restype is want_ret, name
        assert [a.__name__ for a in argtypes] == [a.__name__ for a in want_args], name


def test_prog_struct_is_the_headers():
    assert [(name, t) for name, t in library.ProgStruct._fields_] == _prog_fields()


def test_one_folder_one_header_no_prototype_twice():
    """Every unit includes kernels.h and declares no function of the library itself (the header
    does, once); max2 and min2 are defined once (in the header); every function the header declares
    is defined in exactly one unit."""
    units = sorted(library.SOURCES.glob("*.c"))
    assert {u.name for u in units} >= {"passes.c", "cardinality.c", "chosen.c", "select.c", "uniforms.c"}
    assert sorted(p.name for p in library.SOURCES.iterdir() if p.suffix == ".h") == ["kernels.h"]
    assert set(library.LIBRARY.sources) == set(units)
    declared, defined, written = set(_prototypes()), [], set()
    for unit in units:
        text = _code(unit)
        assert '#include "kernels.h"' in unit.read_text(), unit.name
        assert not re.search(r"\b(max2|min2)\s*\(float", text), f"{unit.name} defines max2/min2 again"
        written |= {name for name, _ in re.findall(TOP_LEVEL + r"\s*;", text, flags=re.M)}
        defined += [name for name, _ in re.findall(TOP_LEVEL + r"\s*\{", text, flags=re.M)]
    assert sorted(defined) == sorted(set(defined)) and set(defined) == declared  # each exported once, all declared
    assert not written & declared, f"prototypes written again in a unit: {sorted(written & declared)}"


# the best ISA here in the default run, every ISA in the slow set (a compile of all units each)
@pytest.mark.parametrize(
    "isa", [isa if isa == build.best_isa() else pytest.param(isa, marks=pytest.mark.slow) for isa in build.ISAS]
)
def test_units_compile_clean(isa, tmp_path):
    """-Wall -Wextra -Wmissing-prototypes, as errors, with the library's own flags for ``isa``."""
    cc = build._compiler()
    if cc is None:
        pytest.skip("no C compiler")
    if isa not in build.runnable_isas():
        pytest.skip(f"this CPU does not run {isa}")
    flags = [*build.FLAGS, *build.isa_flags(isa), "-Wall", "-Wextra", "-Wmissing-prototypes", "-Werror"]
    for unit in library.LIBRARY.sources:
        extra = ["-ffast-math"] if unit == library.LIBRARY.fast_math else []
        out = subprocess.run(
            [cc, *flags, *extra, "-c", str(unit), "-o", str(tmp_path / (unit.stem + ".o"))],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, f"{unit.name} ({isa}):\n{out.stderr[-3000:]}"


def test_the_library_has_every_declared_function():
    lib = library.library()
    if lib is None:
        pytest.skip("the C kernels are turned off or unbuildable")
    for name in library.FUNCTIONS:
        assert getattr(lib, name).argtypes is not None
