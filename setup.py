"""The wheel's build step (pyproject.toml holds everything else): the kernels' C library compiled
for each instruction set the runtime dispatch knows, into ``circuits/kernels/prebuilt/<isa>/``
of the wheel, by the code the first-use build runs (``NativeLibrary.ship``: x86-64-v4, -v3 and -v2
on x86-64, the base architecture on 64-bit Arm; tuned for any CPU of the ISA). The wheel is then
tagged for the platform and any Python 3 (``py3-none-<platform>``: the libraries are loaded with
ctypes, not through Python's C API). An editable install ships nothing (the library is built on
first use from the sources it points at), and neither does a build with ``PROBMOE_NATIVE=0`` (a
pure wheel: the first-use build, or the torch code, at run time). docs/install.md says more.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the build machinery, from this tree (no torch)
from circuits.kernels import build as native
from circuits.kernels.library import LIBRARY

SHIP = os.environ.get("PROBMOE_NATIVE", "1") != "0" and bool(native.shipped_isas())


class BuildPy(build_py):
    """Copy the packages, then compile the kernels' library for every ISA into the build folder."""

    def run(self):
        super().run()
        if SHIP and not self.editable_mode:
            folder = Path(self.build_lib) / LIBRARY.prebuilt.relative_to(LIBRARY.prebuilt.parents[2])
            try:
                built = LIBRARY.ship(folder)
            except (RuntimeError, OSError) as err:  # no compiler, or a failed build (BuildError: its log's path)
                raise SystemExit(
                    f"probmoe's wheel ships its C kernels compiled: {err} (PROBMOE_NATIVE=0 builds a pure "
                    "wheel instead, its kernels built on first use)"
                ) from None
            for path in built:
                print(f"built {path.relative_to(self.build_lib)}")


class PlatformDistribution(Distribution):
    """A distribution with compiled code, when it ships the libraries: installed as platform files,
    its wheel not pure."""

    def has_ext_modules(self):
        return SHIP


class PlatformWheel(bdist_wheel):
    """Tagged for this platform and any Python 3 when it holds the compiled libraries."""

    def get_tag(self):
        python, abi, platform = super().get_tag()
        return ("py3", "none", platform) if SHIP else (python, abi, platform)


setup(distclass=PlatformDistribution, cmdclass={"build_py": BuildPy, "bdist_wheel": PlatformWheel})
