"""The built-in verifier primitives: one module each, its parameter model beside its scorer.

Every module of this package is imported (and so registers itself) when the package is: a new
primitive is one module here with a `CamelModel` of its parameters and an `@register(TYPE,
Params)` scorer (see registry.py); nothing else names it.
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
