"""Where probmoe keeps what it builds: compiled circuits (``circuits.compiler.cache``) and the fused C
kernels' C library (``circuits.kernels.library``), each in its own folder under this root."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$PROBMOE_CACHE``, else ``$XDG_CACHE_HOME/probmoe``, else ``~/.cache/probmoe``."""
    if os.environ.get("PROBMOE_CACHE"):
        return Path(os.environ["PROBMOE_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "probmoe"
    return Path.home() / ".cache" / "probmoe"
