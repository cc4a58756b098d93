"""Names of trained policies: `BASE:SUFFIX`, checked and split."""

from __future__ import annotations

import re

from rollout.shared.errors import RolloutError

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


def unknown_local(name: str, rest: str) -> RolloutError:
    """The error for `name` + `rest`, a local model's name with something after it."""
    full = f"{name}{rest}"
    if rest.startswith(":") and split_trained_name(full) is not None:
        # A trained name no job published (a typo'd suffix): not the base with junk after it.
        return RolloutError(
            f"no trained model {full!r}",
            problems=["see `rollout jobs` for finished jobs and the model names they produced"],
        )
    return RolloutError(f"unknown model {full!r}: did you mean {name!r}?")
