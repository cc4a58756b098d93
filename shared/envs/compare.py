"""Value comparison for verifiers: numbers by value (100 == 100.0), bools never equal numbers."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def values_equal(expected: Any, actual: Any, *, partial: bool = False) -> bool:
    """Deep equality; with `partial`, dicts in `expected` need only be a subset of `actual`."""
    kind = type(expected)
    if (kind is int or kind is str) and type(actual) is kind:  # the usual leaf: plain ==
        return expected == actual
    if _is_number(expected) and _is_number(actual):
        if isinstance(expected, float) and math.isnan(expected):
            return isinstance(actual, float) and math.isnan(actual)
        return expected == actual
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return False
        if not partial and set(expected) != set(actual):
            return False
        return all(
            k in actual and values_equal(v, actual[k], partial=partial) for k, v in expected.items()
        )
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(expected) != len(actual):
            return False
        return all(
            values_equal(e, a, partial=partial) for e, a in zip(expected, actual, strict=True)
        )
    return type(expected) is type(actual) and expected == actual


def normalise(value: Any) -> Any:
    """A JSON-ready form where integral floats become ints, so 100 and 100.0 canonicalise alike."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def canonical(value: Any) -> str:
    """Canonical JSON text of a value, for hashing and multiset comparison."""
    return json.dumps(normalise(value), sort_keys=True, separators=(",", ":"), default=str)


def multiset_equal(expected: list[Any], actual: list[Any]) -> bool:
    """Same items with the same multiplicities, order ignored."""
    return Counter(canonical(v) for v in expected) == Counter(canonical(v) for v in actual)


def short(value: Any, limit: int = 120) -> str:
    """A compact one-line rendering for reasons and errors."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
