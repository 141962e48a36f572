"""The torchtitan release this package supports, checked before any torchtitan module is imported.

torchtitan changes its model API between releases (0.3.0 routes (B, L, D) hidden states; its main
branch has moved to (T, D) token tensors), so the pin is exact: ``SUPPORTED``, the ``torchtitan``
extra's pin in pyproject.toml. Anything else is one ImportError naming the found and the supported
release.
"""

from __future__ import annotations

from importlib import metadata

SUPPORTED = ("0.3.0",)


def installed() -> str | None:
    """The installed torchtitan's version string, None if it is not installed."""
    try:
        return metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        return None


def check(version: str | None) -> None:
    """ImportError unless ``version`` (an installed torchtitan's) is one of ``SUPPORTED``."""
    pin = " or ".join(f"torchtitan=={v}" for v in SUPPORTED)
    if version is None:
        raise ImportError(
            f"probmoe.integrations.torchtitan needs {pin} (not installed): pip install --no-deps "
            f"{pin} and pip install 'probmoe[torchtitan]' (docs/scale-out.md: its own requirements "
            "pin datasets<4.8; it imports triton, also on CPU)"
        )
    if version not in SUPPORTED:
        raise ImportError(
            f"probmoe.integrations.torchtitan supports {pin} only, found torchtitan {version}: "
            "its router and MoE API change between releases (docs/scale-out.md)"
        )
