"""The example environments the scripted teacher and the tiny agent learn from."""

from __future__ import annotations

import os
from pathlib import Path

from rollout.shared.errors import RolloutError


def examples_dir() -> Path:
    """The example environments: `ROLLOUT_EXAMPLES_DIR`, else the repo's `examples/`."""
    chosen = os.environ.get("ROLLOUT_EXAMPLES_DIR")
    if chosen:
        return Path(chosen).expanduser()
    # The repository's examples/ beside shared/ (this file is shared/learning/examples.py).
    return Path(__file__).resolve().parents[2] / "examples"


def example_files(directory: Path | None = None) -> list[Path]:
    """The example env files the tiny agent learns from."""
    folder = directory or examples_dir()
    files = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if not files:
        raise RolloutError(
            f"no example environments in {folder} (set ROLLOUT_EXAMPLES_DIR to the "
            "repo's examples/ folder)"
        )
    return files
