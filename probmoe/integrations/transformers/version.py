"""The transformers versions this package runs on, checked when it is imported.

``REQUIRES`` is the range of the ``transformers`` extra in pyproject.toml (a test keeps the two
equal); ``TESTED`` the releases the test suite was run against (docs/transformers.md). A version
outside ``REQUIRES`` is an ImportError naming both; a newer one inside it (a 5.x minor release
not yet tried) imports with a warning: the layout checks of ``families`` then say precisely
what moved, if anything did.
"""

from __future__ import annotations

import warnings

REQUIRES = ">=5.23,<6"
LOWEST, BELOW = (5, 23), (6,)  # REQUIRES as release tuples
TESTED = ("5.23.0", "5.24.0")


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string ("5.24.0.dev0" -> (5, 24, 0)); ImportError if none."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release
    except InvalidVersion:
        raise ImportError(
            f"cannot read the transformers version {version!r}; probmoe.integrations.transformers "
            f"needs transformers{REQUIRES}"
        ) from None


def check(version: str) -> None:
    """ImportError unless ``version`` is in ``REQUIRES``; a warning if it is newer than ``TESTED``."""
    numbers = release(version)
    if not LOWEST <= numbers < BELOW:
        raise ImportError(
            f"probmoe.integrations.transformers needs transformers{REQUIRES} (tested with "
            f"{' and '.join(TESTED)}), found {version}; install probmoe[transformers]"
        )
    if numbers[:2] > release(TESTED[-1])[:2]:
        warnings.warn(
            f"transformers {version} is newer than the releases probmoe.integrations.transformers was "
            f"tested with ({', '.join(TESTED)}); patching checks the model layout it relies on and "
            "stops with a message naming anything that moved",
            stacklevel=3,
        )
