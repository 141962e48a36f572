"""The C build machinery's public face (``circuits.kernels.build``): ``NativeLibrary`` (a library of
C sources loaded with ctypes: the one a wheel ships prebuilt for the CPU's ISA when it matches the
sources, else one built with the system's cc on first use, cached per CPU and compiler;
PROBMOE_NATIVE=0 turns every library off), ``build_dir``, and the paths of the shared units other
packages may link (``VMATH``, ``SCRATCH``). The kernels' own library is ``circuits.kernels.library``.
No torch."""

from .kernels.build import SCRATCH, VMATH, NativeLibrary, build_dir

__all__ = ["SCRATCH", "VMATH", "NativeLibrary", "build_dir"]
