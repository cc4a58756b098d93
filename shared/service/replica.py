"""What a worker replica keeps between messages: spec cache, object store, keepalive interval."""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext

from rollout.shared.objectstore import ObjectStore
from rollout.shared.settings import Settings
from rollout.shared.store.spec_cache import SpecCache
from rollout.shared.store.trajectories import object_store


@dataclass(kw_only=True)
class ReplicaState:
    """A replica's caches, opened on first use (a service adds its own fields)."""

    settings: Settings
    # How often a long handler tells JetStream it is still working (a share of the AckWait).
    keepalive_s: float
    _specs: SpecCache | None = None
    _store: ObjectStore | None = None

    def specs(self, js: JetStreamContext) -> SpecCache:
        """The environment specs, cached by version."""
        if self._specs is None:
            self._specs = SpecCache(js)
        return self._specs

    def store(self) -> ObjectStore:
        """The platform's object store (opened on first use)."""
        if self._store is None:
            self._store = object_store(self.settings)
        return self._store
