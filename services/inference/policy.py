"""The served policy: one loaded version at a time, batched, switched on `policy.updated`.

Concurrent HTTP requests queue on the loaded version and go to its backend in batches (the
backend samples a batch together, so concurrent clients share forward passes). A new version
is loaded beside the one being served; only once it is ready do new requests go to it, while
requests already queued on the old version finish there; then the old weights are dropped.
No request fails or waits for a load, and each answer knows the version that produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from nats.js import JetStreamContext
from pydantic import ValidationError

from rollout.services.inference.defaults import DEFAULT_MAX_BATCH as DEFAULT_MAX_BATCH
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import PolicyUpdated
from rollout.shared.errors import RolloutError
from rollout.shared.models import trained
from rollout.shared.models.base import ChatRequest, ChatResponse, ModelBackend, close_backend
from rollout.shared.observability import get_logger

log = get_logger(__name__)


@dataclass
class _Item:
    requests: list[ChatRequest]
    future: asyncio.Future[list[ChatResponse]]
    # Per request, who hears its tokens as they are sampled (streamed requests only).
    listeners: list[Any] | None = None


@dataclass
class Slot:
    """One loaded policy version and the requests queued for it."""

    backend: ModelBackend
    version: int | None
    max_batch: int = DEFAULT_MAX_BATCH
    queue: asyncio.Queue[_Item | None] = field(default_factory=asyncio.Queue)
    worker: asyncio.Task[None] | None = None
    served: int = 0
    batches: int = 0
    # Streamed requests whose client went away before the end (their generation stopped).
    cancelled: int = 0
    retired: bool = False

    def start(self) -> None:
        """Start taking requests."""
        self.worker = asyncio.create_task(self._work(), name=f"policy-v{self.version}")

    @property
    def streams(self) -> bool:
        """Whether this version's backend can tell tokens as they are sampled."""
        return callable(getattr(self.backend, "generate_streaming", None))

    def enqueue(
        self, requests: list[ChatRequest], listeners: list[Any] | None = None
    ) -> asyncio.Future[list[ChatResponse]]:
        """Queue `requests` for this version's next batch now; the future holds their answers.

        Synchronous on purpose: a caller that read this slot as current queues on it before
        any switch can retire it (a retired slot fails the request instead of dropping it).
        """
        future: asyncio.Future[list[ChatResponse]] = asyncio.get_running_loop().create_future()
        if self.retired:
            future.set_exception(_retired_error(self.version))
        else:
            self.queue.put_nowait(_Item(requests, future, listeners))
        return future

    async def submit(
        self, requests: list[ChatRequest], listeners: list[Any] | None = None
    ) -> list[ChatResponse]:
        """Generate for `requests` in the next batch of this version (tokens to `listeners`)."""
        return await self.enqueue(requests, listeners)

    def retire(self) -> None:
        """Take no more requests: finish the queued ones, then drop the weights."""
        if not self.retired:
            self.retired = True
            self.queue.put_nowait(None)

    async def _work(self) -> None:
        closing = False
        try:
            while not closing:
                item = await self.queue.get()
                if item is None:
                    break
                batch = [item]
                size = len(item.requests)
                if self.max_batch > 1:
                    # Let requests that arrived together reach the queue: one batch for them.
                    await asyncio.sleep(0)
                while size < self.max_batch and not self.queue.empty():
                    more = self.queue.get_nowait()
                    if more is None:
                        closing = True
                        break
                    batch.append(more)
                    size += len(more.requests)
                await self._run(batch)
        finally:
            # Whatever is still queued would never be served: fail it now rather than hang it.
            while not self.queue.empty():
                left = self.queue.get_nowait()
                if left is not None and not left.future.done():
                    left.future.set_exception(_retired_error(self.version))
            await close_backend(self.backend)

    async def _run(self, batch: list[_Item]) -> None:
        flat = [r for item in batch for r in item.requests]
        heard = [
            listener
            for item in batch
            for listener in (item.listeners or [None] * len(item.requests))
        ]
        try:
            if self.streams and any(h is not None for h in heard):
                responses = await self.backend.generate_streaming(flat, heard)  # type: ignore[attr-defined]
            else:
                responses = await self.backend.generate(flat)
        except Exception as exc:  # handed to every waiting request; the worker goes on
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        start = 0
        for item in batch:
            part = responses[start : start + len(item.requests)]
            start += len(item.requests)
            if not item.future.done():  # a client that went away no longer waits
                item.future.set_result(part)
        self.served += len(flat)
        self.batches += 1
        self.cancelled += sum(1 for r in responses if r.finish_reason == "cancelled")


def _retired_error(version: int | None) -> RolloutError:
    return RolloutError(
        f"policy version {version} was retired before this request ran",
        problems=["ask again: new requests go to the version now served"],
    )


def version_of(backend: ModelBackend) -> int | None:
    """The policy version a backend serves (None: a fixed model with no versions)."""
    return getattr(backend, "policy_version", None)


def lineage_of(backend: ModelBackend) -> str | None:
    """The trained name whose new versions this backend should follow (None: none)."""
    if isinstance(backend, trained.FollowsPolicy):
        return backend.model_name
    return None


class ServedPolicy:
    """The model behind the API: the version being served, and switching to newer ones."""

    def __init__(self, backend: ModelBackend, *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self.lineage = lineage_of(backend)
        self.max_batch = max_batch
        self.slot = Slot(backend, version_of(backend), max_batch)
        self.switches = 0
        self._switching = asyncio.Lock()
        self._retired: list[Slot] = []

    def start(self) -> None:
        """Start serving the loaded version."""
        self.slot.start()

    @property
    def version(self) -> int | None:
        """The version new requests go to."""
        return self.slot.version

    @property
    def backend(self) -> ModelBackend:
        """The backend new requests go to."""
        return self.slot.backend

    async def generate(self, requests: list[ChatRequest]) -> tuple[list[ChatResponse], Slot]:
        """Responses from the current version, and the slot (version) that produced them."""
        slot = self.slot
        return await slot.submit(requests), slot

    def current(self) -> Slot:
        """The slot (version) new requests go to."""
        return self.slot

    async def switch_to(self, record: trained.PolicyRecord) -> bool:
        """Load `record` beside the served version, then serve it; True when it switched."""
        async with self._switching:
            current = self.slot.version
            if record.model != self.lineage or (current is not None and record.version <= current):
                return False
            backend = await asyncio.to_thread(trained.backend_for, record)
            new = Slot(backend, record.version, self.max_batch)
            new.start()
            old, self.slot = self.slot, new
            old.retire()
            self._retired.append(old)
            self.switches += 1
            log.info("policy switched", model=record.model, version=record.version, old=current)
            return True

    async def apply(self, update: PolicyUpdated) -> bool:
        """Switch to the version a `policy.updated` event announces, when newer."""
        if update.model != self.lineage:
            return False
        record = await _with_default_store(lambda s: trained.latest_record(s, update.model))
        if record is None or record.version < update.version:
            # The event is the announcement; the store's record may lag or be elsewhere.
            record = trained.PolicyRecord(
                model=update.model,
                version=update.version,
                uri=update.checkpoint_uri,
                sha256=update.sha256,
                job_id=update.job_id,
            )
        return await self.switch_to(record)

    async def follow(self, js: JetStreamContext) -> None:
        """Apply every `policy.updated` of this lineage, from the log's start, until cancelled."""
        if self.lineage is None:
            return
        subject = subjects.event(
            "policy",
            trained.policy_key(self.lineage),
            subjects.event_name(PolicyUpdated.event_type),
        )
        async for msg in read_events(js, subject, follow=True):
            if msg.metadata.num_pending:
                continue  # a newer announcement of this lineage follows: go straight to it
            try:
                body = EventEnvelope.from_bytes(msg.data).body()
            except ValidationError as exc:
                log.warning("unreadable policy event", subject=msg.subject, error=str(exc))
                continue
            if not isinstance(body, PolicyUpdated):
                continue
            try:
                await self.apply(body)
            except RolloutError as exc:  # a version that cannot load: keep serving this one
                log.error(
                    "policy version not loaded; still serving the previous one",
                    model=body.model,
                    version=body.version,
                    serving=self.version,
                    error=str(exc),
                )

    async def aclose(self) -> None:
        """Finish queued requests and drop every loaded version."""
        self.slot.retire()
        for slot in [*self._retired, self.slot]:
            if slot.worker is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await slot.worker


async def _with_default_store(fn: Any) -> Any:
    store = trained.default_store()
    try:
        return await fn(store)
    finally:
        await store.close()
