"""Files the stack writes under ROLLOUT_HOME: atomic, and private where they hold secrets."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError


def write_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write `text` to `path` via a temp file and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp creates the file 0600 from the start: a secret never exists world-readable.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_private(path: Path, text: str) -> None:
    """Write a secret-bearing file with mode 0600, atomically."""
    write_atomic(path, text, mode=0o600)


def write_json(path: Path, data: dict[str, Any], *, private: bool = False) -> None:
    """Write a JSON object atomically (0600 when `private`)."""
    write_atomic(
        path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=0o600 if private else 0o644
    )


def ensure_home(home: Path) -> Path:
    """Create ROLLOUT_HOME and its logs folder, owner-only (Postgres later gets o+x to traverse)."""
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (home / "logs").mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise RolloutError(
            f"ROLLOUT_HOME={str(home)!r} cannot be used: {exc.strerror}",
            problems=["set ROLLOUT_HOME to a writable directory"],
        ) from exc
    return home
