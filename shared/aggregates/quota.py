"""A key's budgets a UTC day: rollouts its runs plan and training jobs, charged as it asks.

The operator sets a key's limits with `rollout keys limit` (or `keys create --max-...`): a
`key.limits_set` event on the key's own subject, which only the admin user may append, so it
reaches every service replica of a cluster through the log, as the services read it. Each
admitted request is a `quota.charged` event on the key's day (`<key id>-<YYYYMMDD>`, UTC), and
the admission is decided from that day's charges and appended expecting them unchanged: of two
requests racing for the last of a budget, the second reads the first's charge and is refused.
A charge names its run or job, so a retried request (the same client request id: the same run
or job id) finds it and pays nothing. An unlimited key's charges are appended unread (there is
nothing to decide), so a busy one does not read its growing day at each request. Days, not a rolling window: a day's history is small and
is all a decision reads, and when room frees up is plain (00:00 UTC).

Only API keys are charged: the admin and the services act for the platform (a job's round runs
are its owner's job, counted in the jobs budget, not again as rollouts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rollout.shared import subjects
from rollout.shared.aggregates.append import decide_and_append
from rollout.shared.auth.keys import key_id_of_user
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import KeyLimitsSet, QuotaCharged, QuotaKind
from rollout.shared.errors import RolloutError

# How each budget is named: the limit's field (and `rollout keys` flag) and its unit.
LIMIT_FIELDS: dict[str, str] = {"rollouts": "max_rollouts_per_day", "jobs": "max_jobs_per_day"}
# Decisions made again after another of the key's charges got in first: each replica handles
# up to 8 of a key's run requests at once (a plan's sweep), and each loses at most one race to
# every other in flight.
CHARGE_RETRIES = 32
_UNITS = {"rollouts": ("rollout", "rollouts"), "jobs": ("training job", "training jobs")}


def day_of(now: datetime) -> str:
    """The UTC day a moment counts in: `20261207`."""
    return now.astimezone(UTC).strftime("%Y%m%d")


def next_day(day: str) -> datetime:
    """When the day's budget is renewed: its next 00:00 UTC."""
    return datetime.strptime(day, "%Y%m%d").replace(tzinfo=UTC) + timedelta(days=1)


def limits_subject(key_id: str) -> str:
    """Where a key's limits are set."""
    return subjects.event("key", key_id, subjects.event_name(KeyLimitsSet.event_type))


def day_subject(key_id: str, day: str) -> str:
    """Where a key's charges of one UTC day are."""
    return subjects.event("quota", f"{key_id}-{day}", subjects.event_name(QuotaCharged.event_type))


async def key_limits(js: JetStreamContext, key_id: str) -> tuple[KeyLimitsSet, int]:
    """The key's limits now (none set: unlimited) and the stream sequence they were set at."""
    try:
        raw = await js.get_last_msg(subjects.EVENTS_STREAM, limits_subject(key_id))
    except NotFoundError:
        return KeyLimitsSet(key_id=key_id), 0
    body = EventEnvelope.from_bytes(raw.data).body()
    assert isinstance(body, KeyLimitsSet)
    return body, raw.seq


@dataclass
class KeyDay:
    """What a key was charged on one UTC day, and the history's newest sequence."""

    key_id: str
    day: str
    used: dict[str, int] = field(default_factory=lambda: {"rollouts": 0, "jobs": 0})
    refs: set[tuple[str, str]] = field(default_factory=set)
    last_seq: int = 0


async def key_day(js: JetStreamContext, key_id: str, day: str) -> KeyDay:
    """Fold a key's charges of `day` from the log."""
    state = KeyDay(key_id, day)
    async for msg in read_events(js, day_subject(key_id, day)):
        state.last_seq = max(state.last_seq, msg.seq)
        body = EventEnvelope.from_bytes(msg.data).body()
        if isinstance(body, QuotaCharged) and (body.kind, body.ref) not in state.refs:
            state.refs.add((body.kind, body.ref))
            state.used[body.kind] += body.amount
    return state


def over_budget(
    key_id: str, kind: str, limit: int, used: int, asked: int, day: str, now: datetime
) -> RolloutError:
    """The refusal of a request past a key's budget: the limit, what was used and asked, and
    when room frees up."""
    one, many = _UNITS[kind]
    frees = next_day(day)
    left = max(0, limit - used)
    wait = int((frees - now).total_seconds()) // 60
    asks = f"{asked} {one if asked == 1 else many}"
    return RolloutError(
        f"key {key_id} is over its budget of {limit} {one if limit == 1 else many} a day ({LIMIT_FIELDS[kind]}): "
        f"it used {used} today (UTC) and this request asks {asks}; room frees up at "
        f"{frees.isoformat().replace('+00:00', 'Z')} (in {wait // 60}h {wait % 60:02d}m)",
        problems=[
            f"ask for at most {left} {many} today"
            if left
            else f"no {many} are left to this key today",
            f"or ask the operator to raise it: `rollout keys limit {key_id} "
            f"--{LIMIT_FIELDS[kind].replace('_', '-')} N`",
        ],
    )


async def charge(
    js: JetStreamContext, caller: str, kind: QuotaKind, amount: int, ref: str
) -> QuotaCharged | None:
    """Count `amount` of `kind` for `ref` (a run or job id) against the calling key's day.

    RolloutError (over_budget) when it would pass the key's limit. None for a caller that is
    no API key, and for a `ref` already charged today (a retry) under a limit. Every key's
    use is recorded, limited or not, so `rollout keys list` shows it and a limit set mid-day
    counts it; only a limited key's charge reads and expects the day's history.
    """
    key_id = key_id_of_user(caller)
    if key_id is None:
        return None
    now = datetime.now(UTC)
    day = day_of(now)
    limits, _ = await key_limits(js, key_id)
    limit = getattr(limits, LIMIT_FIELDS[kind])

    charged = QuotaCharged(key_id=key_id, day=day, kind=kind, amount=amount, ref=ref)
    if limit is None:
        # Nothing to decide: recorded for `keys list` (and for a limit set later today) without
        # reading the day, which grows with every request a busy unlimited key makes. Its id
        # derives from the ref, so a resend within the stream's dedup window is dropped.
        await EventPublisher(js).publish(_envelope(charged))
        return charged

    def decide(state: KeyDay) -> QuotaCharged | None:
        if (kind, ref) in state.refs:
            return None
        used = state.used[kind]
        if used + amount > limit:
            raise over_budget(key_id, kind, limit, used, amount, day, now)
        return charged

    async def append(state: KeyDay, decided: QuotaCharged) -> None:
        await EventPublisher(js).publish(
            _envelope(decided), expected_last_subject_seq=state.last_seq
        )

    _, appended = await decide_and_append(
        lambda: key_day(js, key_id, day),
        decide,
        append,
        what=f"key {key_id}'s budget",
        retries=CHARGE_RETRIES,
    )
    return appended


def _envelope(charged: QuotaCharged) -> EventEnvelope:
    """A charge's event; its id derives from the key, day, kind and ref."""
    return EventEnvelope.new(
        charged,
        aggregate_id=f"{charged.key_id}-{charged.day}",
        id_parts=(charged.key_id, charged.day, charged.kind, charged.ref),
    )


async def set_limits(
    js: JetStreamContext, key_id: str, changes: dict[str, int | None]
) -> KeyLimitsSet:
    """Set some of a key's limits (`changes`: field -> limit, None lifting it); the others
    stay as they are. The operator's act: only the admin user may append it.

    Appended expecting the limits read, so two operators at once cannot undo each other's
    other limit unseen.
    """

    def decide(state: tuple[KeyLimitsSet, int]) -> KeyLimitsSet:
        return state[0].model_copy(update=changes)

    async def append(state: tuple[KeyLimitsSet, int], limits: KeyLimitsSet) -> None:
        envelope = EventEnvelope.new(
            KeyLimitsSet.model_validate(limits.model_dump()),
            aggregate_id=key_id,
            id_parts=(key_id, "limits", state[1]),
        )
        await EventPublisher(js).publish(envelope, expected_last_subject_seq=state[1])

    _, limits = await decide_and_append(
        lambda: key_limits(js, key_id), decide, append, what=f"key {key_id}'s limits"
    )
    assert limits is not None
    return limits
