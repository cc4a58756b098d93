"""What every job handler needs: the bus, the object store and a working folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext

from rollout.shared.objectstore import ObjectStore


@dataclass
class LearnerContext:
    """Connections and places shared by the learner's handlers."""

    nc: Any
    js: JetStreamContext
    store: ObjectStore
    work_dir: Path

    def job_dir(self, job_id: str) -> Path:
        """Where one job's local checkpoints and final model are written."""
        return self.work_dir / job_id
