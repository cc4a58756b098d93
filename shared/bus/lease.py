"""A leader lease in a JetStream KV bucket: one replica of a service holds it, the others wait.

The lease is one key (the service's name) in the leases bucket, whose TTL is the lease's:
a holder that stops renewing is forgotten by the server itself, and a standby's next
`create` takes the key. Every write names the revision it expects (`kv.create` expects
none, `kv.update(..., last=revision)` the holder's own), so of two replicas racing for it one
wins, and a holder whose key expired and was taken cannot renew it: it learns it was deposed.

The lease says who *should* act; it is not what makes acting safe. A deposed holder may still
have a decision in flight when the new one starts (a stalled event loop, a slow network); that
late write is refused because each decision is appended with the aggregate's expected
sequence (see services/tracker/runs.py). The holder also counts itself deposed as soon as its
last successful renewal could have expired (`held`: measured from before that renewal was
sent, less a safety margin), and `lead` bounds every wait, renewal included, by that moment:
a holder whose renewals stall stops its duty before the server can have let a standby in.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from rollout.shared import subjects
from rollout.shared.bus.cancels import cancelling, raise_if_cancelled
from rollout.shared.bus.streams import retry_api
from rollout.shared.observability import get_logger

log = get_logger(__name__)

BUCKET = subjects.LEASES_BUCKET
DEFAULT_TTL_S = 3.0
# Renewals per TTL: a holder may miss two in a row (a busy loop, a reconnect) and keep it.
RENEWALS_PER_TTL = 3
# How often a standby tries to take the lease: a fraction of the TTL, so failover takes about
# one TTL after the holder's last renewal.
POLLS_PER_TTL = 10
# The part of a TTL a holder gives up early: the duty's cancellation and clock drift between
# us and the server must fit in it before a standby's create can succeed.
SAFETY_MARGIN = 0.1

# Errors of a write that may not have reached the server: the lease is neither won nor lost.
_TRANSIENT = (nats.errors.Error, TimeoutError, nats.js.errors.APIError)


async def lease_bucket(js: JetStreamContext, ttl_s: float, replicas: int = 1) -> KeyValue:
    """The leases bucket, created with TTL `ttl_s` when missing (a later replica adopts the
    TTL it was created with: see Lease.ttl_s)."""
    try:
        return await retry_api(lambda: js.key_value(BUCKET), BUCKET)
    except nats.js.errors.BucketNotFoundError:
        pass
    config = KeyValueConfig(bucket=BUCKET, history=1, ttl=ttl_s, replicas=replicas, direct=True)
    try:
        return await retry_api(lambda: js.create_key_value(config), BUCKET)
    except nats.js.errors.BadRequestError:
        # Another replica created it between our lookup and our create.
        return await js.key_value(BUCKET)


async def bucket_ttl(kv: KeyValue) -> float:
    """The TTL the leases bucket was created with, in seconds."""
    status = await kv.status()
    ttl = status.stream_info.config.max_age
    if not ttl:
        raise RuntimeError(f"the {BUCKET} bucket has no TTL: a crashed holder would keep its lease")
    return float(ttl)


async def current_holder(kv: KeyValue, name: str) -> str | None:
    """Who holds lease `name` now (None: nobody, or it just expired)."""
    try:
        entry = await kv.get(name)
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return None
    return entry.value.decode() if entry.value else None


class Lease:
    """Lease `name` as seen by one replica (`holder`): acquire, renew, release."""

    def __init__(self, kv: KeyValue, name: str, holder: str, ttl_s: float) -> None:
        self.kv = kv
        self.name = name
        self.holder = holder
        self.ttl_s = ttl_s
        # The key's revision our last write made; None while we do not hold it.
        self.revision: int | None = None
        self._valid_until = 0.0
        # Times this replica won the lease (a test and the benchmark read it).
        self.terms = 0

    @property
    def held(self) -> bool:
        """True while our last successful write cannot have expired on the server."""
        return self.revision is not None and time.monotonic() < self._valid_until

    def valid_for(self) -> float:
        """Seconds the lease is still surely ours (0 when it is not held)."""
        if self.revision is None:
            return 0.0
        return max(0.0, self._valid_until - time.monotonic())

    async def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; True when we hold it now."""
        sent = time.monotonic()
        try:
            revision = await self.kv.create(self.name, self.holder.encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            return False  # held by another replica
        except _TRANSIENT as exc:
            log.warning("lease acquire failed", lease=self.name, error=str(exc) or repr(exc))
            return False
        self._won(revision, sent)
        self.terms += 1
        return True

    async def renew(self) -> bool:
        """Extend the lease by a TTL; False once it is lost (taken, or expired meanwhile)."""
        if self.revision is None:
            return False
        sent = time.monotonic()
        try:
            revision = await asyncio.wait_for(
                self.kv.update(self.name, self.holder.encode(), last=self.revision),
                self._answer_limit(),
            )
        except nats.js.errors.KeyWrongLastSequenceError:
            # Either an earlier renewal whose reply was lost did land (the key still names
            # us), or the key expired and a standby took it: then we are deposed.
            self.revision = await self._own_revision()
            return self.held
        except _TRANSIENT as exc:
            # Unknown outcome: keep acting only while the last known renewal is valid.
            log.warning("lease renew failed", lease=self.name, error=str(exc) or repr(exc))
            return self.held
        self._won(revision, sent)
        return True

    async def release(self) -> None:
        """Give the lease up (a clean stop), so a standby takes it at its next try."""
        revision, self.revision = self.revision, None
        if revision is None:
            return
        try:
            await asyncio.wait_for(self.kv.delete(self.name, last=revision), self.ttl_s)
        except nats.js.errors.KeyWrongLastSequenceError:
            pass  # already someone else's
        except _TRANSIENT as exc:
            log.warning("lease release failed; it expires", lease=self.name, error=repr(exc))

    async def _own_revision(self) -> int | None:
        """The key's revision if its value is still ours, else None."""
        try:
            entry = await asyncio.wait_for(self.kv.get(self.name), self._answer_limit())
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        except _TRANSIENT as exc:
            log.warning("lease read failed", lease=self.name, error=str(exc) or repr(exc))
            return None  # unsure: count it as lost, the safe side
        return entry.revision if entry.value == self.holder.encode() else None

    def _answer_limit(self) -> float:
        """How long to wait for the server: a renewal's share of the TTL, and while we hold
        the lease never past the moment it may expire (`lead` steps down then)."""
        limit = self.ttl_s / RENEWALS_PER_TTL
        return min(limit, max(self.valid_for(), 0.001)) if self.held else limit

    def _won(self, revision: int, sent: float) -> None:
        self.revision = revision
        # From before the write was sent: the server's clock starts the TTL later than that.
        self._valid_until = sent + self.ttl_s * (1 - SAFETY_MARGIN)


async def lead(lease: Lease, duty: Callable[[], Awaitable[None]]) -> None:
    """Until cancelled: wait for the lease, run `duty` while it is held, stop it once lost.

    `duty` runs until cancelled; if it fails, the lease is released first (a standby takes
    over at once) and the error propagates (the service crashes and is restarted).
    """
    renew_every = lease.ttl_s / RENEWALS_PER_TTL
    poll = lease.ttl_s / POLLS_PER_TTL
    while True:
        acquired = await lease.try_acquire()
        if acquired and cancelling():
            # Won in the same moment as the cancel: give it back, or it blocks a standby a TTL.
            await asyncio.shield(lease.release())
        raise_if_cancelled()
        if not acquired:
            await asyncio.sleep(poll)  # a standby's pace: about one try per tenth of a TTL
            continue
        log.info("leader elected", lease=lease.name, holder=lease.holder, term=lease.terms)
        task = asyncio.create_task(duty(), name=f"{lease.name}-leader")
        try:
            while True:
                # Never past the moment the last successful renewal may expire: a holder whose
                # renewals stall (each timing out) stops there, before a standby can get in.
                remaining = lease.valid_for()
                if remaining > 0:
                    done, _ = await asyncio.wait({task}, timeout=min(renew_every, remaining))
                    if done:
                        break
                if not lease.held:
                    log.warning("leadership expired unrenewed; stepping down", lease=lease.name)
                    break
                renewed = await lease.renew()
                raise_if_cancelled()
                if not renewed:
                    log.warning("leadership lost; stepping down", lease=lease.name)
                    break
        finally:
            task.cancel()
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            finally:
                # Also on a clean stop or a failed duty: the standby need not wait out the TTL.
                await asyncio.shield(lease.release())
