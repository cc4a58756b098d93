"""Who may reach a served model: its API keys, and no listening beyond loopback without them."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

from rollout.services.inference.app import KeyRing
from rollout.services.inference.defaults import DEFAULT_HOST as DEFAULT_HOST
from rollout.shared.errors import RolloutError


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname may resolve to anything


def load_keys(
    key_env: str | None, keys_file: Path | None, env: Mapping[str, str] | None = None
) -> KeyRing | None:
    """The keys given by `--api-key-env VAR` and/or `--api-keys-file FILE` (None: no keys)."""
    env = os.environ if env is None else env
    keys: list[str] = []
    if key_env:
        value = env.get(key_env, "").strip()
        if not value:
            raise RolloutError(
                f"--api-key-env {key_env}: the variable {key_env} is not set or empty"
            )
        keys.append(value)
    if keys_file is not None:
        try:
            text = Path(keys_file).read_text()
        except OSError as exc:
            raise RolloutError(f"--api-keys-file {keys_file}: {exc.strerror}") from None
        found = [
            line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
        ]
        if not found:
            raise RolloutError(f"--api-keys-file {keys_file}: no key in the file (one per line)")
        keys.extend(found)
    return KeyRing(keys) if keys else None


def check_exposure(host: str, keys: KeyRing | None) -> None:
    """Refuse to listen beyond loopback without keys."""
    if keys is None and not is_loopback(host):
        raise RolloutError(
            f"refusing to serve on {host} without an API key: anyone who can reach it could "
            "use the model",
            problems=[
                "give --api-key-env VAR (a variable holding the key) or --api-keys-file FILE",
                f"or listen on {DEFAULT_HOST} (the default)",
            ],
        )
