"""Checkpoint discovery and the step log: what makes resume-after-SIGKILL exact.

Layout of a training output directory:

    out_dir/checkpoints/checkpoint-<step>/   TRL/HF Trainer checkpoints (SFT, DPO)
    out_dir/checkpoints/policy-<version>/    GRPO learner checkpoints
    out_dir/steps.jsonl                      one line per optimizer step (step, loss, ...)
    out_dir/model/                           the final model (HFBackend-loadable)

A checkpoint counts only once its completion marker is written (HF writes trainer_state.json
last; the GRPO learner renames a finished temp dir into place), so a kill mid-save leaves an
incomplete directory that is ignored and removed. On resume the step log is cut back to the
checkpoint's step: steps redone after the checkpoint are logged once, never twice.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

CHECKPOINTS = "checkpoints"
STEP_LOG = "steps.jsonl"
FINAL_MODEL = "model"
HF_MARKER = "trainer_state.json"
GRPO_MARKER = "learner_state.json"
_NAME = re.compile(r"^(checkpoint|policy)-(\d+)$")


class CheckpointState(BaseModel):
    """The newest complete checkpoint of a training output directory."""

    path: Path
    step: int
    kind: Literal["trainer", "grpo"]


def _complete(path: Path, marker: str) -> bool:
    try:
        json.loads((path / marker).read_text())
    except (OSError, ValueError):
        return False
    return True


def checkpoint_dirs(out_dir: Path) -> list[tuple[int, Path, bool]]:
    """(step, path, complete) for every checkpoint-like dir, oldest first."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _NAME.match(child.name)
        if match and child.is_dir():
            marker = HF_MARKER if match.group(1) == "checkpoint" else GRPO_MARKER
            found.append((int(match.group(2)), child, _complete(child, marker)))
    return sorted(found)


def load_checkpoint_state(out_dir: str | Path) -> CheckpointState | None:
    """The newest complete checkpoint under `out_dir`, or None when there is none."""
    for step, path, complete in reversed(checkpoint_dirs(Path(out_dir))):
        if complete:
            kind = "grpo" if path.name.startswith("policy-") else "trainer"
            return CheckpointState(path=path, step=step, kind=kind)
    return None


def prepare_resume(out_dir: Path, resume: bool) -> CheckpointState | None:
    """Drop incomplete checkpoints (or all, without resume); cut the step log to match."""
    state = load_checkpoint_state(out_dir) if resume else None
    for step, path, complete in checkpoint_dirs(out_dir):
        newer = state is not None and step > state.step
        if not resume or not complete or newer:
            shutil.rmtree(path, ignore_errors=True)
    truncate_step_log(out_dir, state.step if state else 0)
    return state


def truncate_step_log(out_dir: Path, last_step: int) -> None:
    """Keep only step-log lines for steps <= last_step (atomically)."""
    log = Path(out_dir) / STEP_LOG
    if not log.exists():
        return
    kept = []
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line torn by the kill
        if isinstance(entry, dict) and int(entry.get("step", 0)) <= last_step:
            kept.append(json.dumps(entry))
    tmp = log.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(log)


def append_step_log(out_dir: Path, entry: dict[str, Any]) -> None:
    """Append one step's record (flushed, so a kill loses at most the line being written)."""
    with (Path(out_dir) / STEP_LOG).open("a") as fh:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()


def read_step_log(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every step record of a training output directory, in order."""
    log = Path(out_dir) / STEP_LOG
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def replace_dir(tmp: Path, final: Path) -> Path:
    """Move a fully written `tmp` dir to `final`, replacing what was there."""
    if final.exists():
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    return final
