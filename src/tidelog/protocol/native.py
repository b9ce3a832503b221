"""Loads tidelog's C accelerators: each is optional, and every one has a pure-Python twin."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def load_native(module: str) -> ModuleType | None:
    """The compiled `module`, or None when it was not built (no C compiler at install) or when
    ``TIDELOG_PURE_PYTHON=1`` asks for the Python paths."""
    if os.environ.get("TIDELOG_PURE_PYTHON") == "1":
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
