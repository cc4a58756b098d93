"""Names of trained policies: `BASE:SUFFIX`, checked and split."""

from __future__ import annotations

import re

_SUFFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def check_suffix(suffix: str) -> str | None:
    """A problem with a suffix, or None when it is usable in `BASE:SUFFIX`."""
    if not _SUFFIX.match(suffix or ""):
        return (
            f"suffix {suffix!r}: 1-64 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return None


def trained_name(base_model: str, suffix: str) -> str:
    """The name a trained policy is addressed by: `BASE:SUFFIX`."""
    return f"{base_model}:{suffix}"


def split_trained_name(name: str) -> tuple[str, str] | None:
    """(base, suffix) when `name` has the `BASE:SUFFIX` shape, else None."""
    base, sep, suffix = name.rpartition(":")
    if not sep or not base or check_suffix(suffix) is not None:
        return None
    return base, suffix
