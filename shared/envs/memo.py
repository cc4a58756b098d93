"""Hot-path helpers: work derived from a spec object done once, results built cheaply.

Specs and typed configs are treated as immutable once built (EnvironmentSpec.typed_config
caches the same way), so what the engine derives from them on every step or score (compiled
templates, parsed verifier params) is built on first use and kept until the object is gone.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

T = TypeVar("T")

# id(obj) -> (weak reference to obj, {builder: value}); the reference's callback drops the
# entry when obj is collected, before its id can be reused.
_CACHE: dict[int, tuple[weakref.ref[Any], dict[Callable[[Any], Any], Any]]] = {}


def per_object(obj: Any, build: Callable[[Any], T]) -> T:
    """`build(obj)`, computed once per live `obj` (objects without weak references: every call).

    `build`'s result must not refer to `obj` itself (it would keep obj alive forever).
    """
    key = id(obj)
    entry = _CACHE.get(key)
    if entry is not None and entry[0]() is obj:
        values = entry[1]
        if build in values:
            return values[build]
    else:
        try:
            # The cache goes in as an argument: at interpreter exit this module's globals may
            # already be None when the last objects are collected.
            ref = weakref.ref(obj, functools.partial(_drop, _CACHE, key))
        except TypeError:  # not weak-referenceable (a dict): nothing to hang the cache on
            return build(obj)
        values = {}
        _CACHE[key] = (ref, values)
    value = build(obj)
    values[build] = value
    return value


def _drop(cache: dict[int, Any], key: int, ref: weakref.ref[Any]) -> None:
    entry = cache.get(key)
    if entry is not None and entry[0] is ref:
        del cache[key]


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], data: dict[str, Any]) -> M:
    """`model(**data)` through the same pydantic validator, minus `BaseModel.__init__`'s
    Python overhead (half the cost of a small model): for results built on every step."""
    return model.__pydantic_validator__.validate_python(data)
