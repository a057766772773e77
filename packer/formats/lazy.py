"""Names a package exports from its modules, imported on first use (PEP 562).

A format package re-exports its writer and reader classes this way, so importing the package
(or its reader) never imports its writer.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

__all__ = ["resolve", "lazy_exports"]


def resolve(dotted: str) -> Any:
    """``"package.module:name"`` -> that object (importing the module)."""
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


def lazy_exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``names`` (name -> module that defines it) on demand."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
