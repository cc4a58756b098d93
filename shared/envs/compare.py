"""Value comparison for verifiers: numbers by value (100 == 100.0), bools never equal numbers."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from rollout.shared.jsondepth import compact


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def values_equal(expected: Any, actual: Any, *, partial: bool = False) -> bool:
    """Deep equality; with `partial`, dicts in `expected` need only be a subset of `actual`.

    Walked with a stack, not recursion: a state or ground truth nested thousands deep (made
    anywhere but the tool results the depth cut guards) is compared, never a RecursionError.
    """
    kind = type(expected)
    if (kind is int or kind is str) and type(actual) is kind:  # the usual leaf: plain ==
        return expected == actual
    pending = [(expected, actual)]
    # Container pairs already compared or under way: a cycle (not JSON, but a Python value
    # may hold one) is not walked forever.
    seen: set[tuple[int, int]] = set()
    while pending:
        e, a = pending.pop()
        if isinstance(e, dict | list | tuple):
            pair = (id(e), id(a))
            if pair in seen:
                continue
            seen.add(pair)
            if isinstance(e, dict):
                if not isinstance(a, dict):
                    return False
                if not partial and set(e) != set(a):
                    return False
                for k, v in e.items():
                    if k not in a:
                        return False
                    pending.append((v, a[k]))
            else:
                if not isinstance(a, list | tuple) or len(e) != len(a):
                    return False
                pending.extend(zip(e, a, strict=True))
        elif not _leaf_equal(e, a):
            return False
    return True


def _leaf_equal(expected: Any, actual: Any) -> bool:
    """`values_equal` of a value that is no dict, list or tuple."""
    kind = type(expected)
    if (kind is int or kind is str) and type(actual) is kind:
        return expected == actual
    if _is_number(expected) and _is_number(actual):
        if isinstance(expected, float) and math.isnan(expected):
            return isinstance(actual, float) and math.isnan(actual)
        return expected == actual
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
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
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except RecursionError:  # nested too deep for json's encoder: its start, written without
        return compact(value, limit - 3)
    return text if len(text) <= limit else text[: limit - 3] + "..."
