"""Packages whose public names load from their modules on first use, so importing one is light."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_names(
    package: str, exports: Mapping[str, str], submodules: frozenset[str] = frozenset()
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: each name in `exports` is imported from the
    module named there when first read and kept in the package (later reads skip this); each
    of `submodules` is imported when read as an attribute."""
    namespace = vars(sys.modules[package])

    def getattr_(name: str) -> object:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            namespace[name] = value
            return value
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted({*namespace, *exports})

    return getattr_, dir_
