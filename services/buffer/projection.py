"""The buffer's store, fed from the events stream: runs, then generated rollouts, then verdicts.

Applied by a ProjectionRunner, so each event's effect and the stream position commit in one
transaction (exactly once on at-least-once delivery). Trajectories larger than
`inline_bytes` go to the object store under a content-addressed key (a retried put of the
same bytes is a no-op) and the row keeps only their URI and sha256.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from rollout.shared import subjects
from rollout.shared.contracts import events as ev
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.objectstore import (
    DEFAULT_INLINE_LIMIT,
    ObjectStore,
    content_key,
    sha256_bytes,
    to_json_bytes,
)
from rollout.shared.observability import get_logger
from rollout.shared.settings import env_number
from rollout.shared.store.rollout_batch import RolloutBatch, apply_events, columns

NAME = "buffer"
TRAJECTORY_PREFIX = "buffer/trajectories"
# The platform's one claim-check threshold (defined in shared/objectstore/claimcheck.py).
DEFAULT_INLINE_BYTES = DEFAULT_INLINE_LIMIT
_NUL_JSON = b"\\u0000"
# The only events the buffer reads; everything else just advances its position unparsed,
# so event types added by other services never stop it.
WANTED = {subjects.event_name(t) for t in ("run.requested", "rollout.generated", "rollout.scored")}

# Trajectories whose JSON is larger than this many bytes go to the object store.
INLINE_BYTES_ENV = "ROLLOUT_BUFFER_INLINE_BYTES"

log = get_logger(__name__)


def inline_bytes_from_env(env: dict[str, str] | None = None) -> int:
    """The trajectory size threshold from ROLLOUT_BUFFER_INLINE_BYTES (default: the platform's)."""
    return int(env_number(INLINE_BYTES_ENV, DEFAULT_INLINE_BYTES, whole=True, unit="bytes",
                          low=0, env=env))  # fmt: skip


def wanted(subject: str) -> bool:
    """True when the buffer applies events on this subject."""
    try:
        aggregate, _, name = subjects.parse_event_subject(subject)
    except subjects.SubjectError:
        return False
    return aggregate == "run" and name in WANTED


class BufferProjection:
    """Scored rollouts with their trajectories, indexed by run, task, policy version and env."""

    name = NAME
    tables = ("buffer_runs", "buffer_rollouts")

    def __init__(self, store: ObjectStore, *, inline_bytes: int = DEFAULT_INLINE_BYTES) -> None:
        self.store = store
        self.inline_bytes = inline_bytes

    async def apply(self, conn: asyncpg.Connection, event: EventEnvelope, position: int) -> None:
        """Apply one event inside the caller's transaction."""
        await self.apply_batch(conn, [(event, position)])

    async def apply_batch(
        self, conn: asyncpg.Connection, items: list[tuple[EventEnvelope, int]]
    ) -> None:
        """Apply a batch in stream order: runs of rollout events as one statement per type."""
        handlers = {"run.requested": self._run_requested}
        await apply_events(conn, items, handlers=handlers, flush=self._flush)

    async def _run_requested(
        self, conn: asyncpg.Connection, e: EventEnvelope, p: ev.RunRequested, position: int
    ) -> None:
        await conn.execute(
            "insert into buffer_runs(run_id, env_slug, env_version, env_hash, model, split, n,"
            " policy_version, requested_at, source) values ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)"
            " on conflict do nothing",
            p.run_id, p.env_slug, p.env_version, p.env_hash, p.model, p.split, p.n,
            p.policy_version, e.time, p.source,
        )  # fmt: skip

    async def _flush(self, conn: asyncpg.Connection, batch: RolloutBatch) -> None:
        """Apply a batch: one lookup of its runs, one insert, one update."""
        if batch.generated:
            runs = {
                r["run_id"]: r
                for r in await conn.fetch(
                    "select run_id, env_slug, env_version, env_hash from buffer_runs"
                    " where run_id = any($1::text[])",
                    sorted({p.run_id for _, p, _ in batch.generated}),
                )
            }
            unknown = sorted({p.run_id for _, p, _ in batch.generated} - set(runs))
            for run_id in unknown:
                # A run's request always precedes its rollouts on the stream; without it the
                # rows could not be indexed by env, so say so instead of storing half a record.
                log.warning("rollouts of an unknown run skipped", run_id=run_id)
            known = RolloutBatch()
            for e, p, position in batch.generated:
                if p.run_id in runs:
                    known.add(e, p, position)
            stored: dict[str, tuple] = {}
            for _, p, _ in known.generated:
                for r in p.rollouts:
                    if r.rollout_id not in stored:  # the first occurrence wins, as one by one
                        stored[r.rollout_id] = await self._trajectory(r)

            def row(e: EventEnvelope, p: ev.RolloutsGenerated, r: Any, position: int) -> tuple:
                run = runs[p.run_id]
                return (
                    r.rollout_id, p.run_id, run["env_slug"], run["env_version"],
                    run["env_hash"], r.task_index, r.sample_index, r.model,
                    r.policy_version, r.seed, *stored[r.rollout_id], _text(r.error), position,
                    e.time,
                )  # fmt: skip

            if rows := known.generated_rows(row):
                await conn.execute(_GENERATED_SQL, *columns(rows, 18))
        if rows := batch.scored_rows(_scored_row):
            await conn.execute(_SCORED_SQL, *columns(rows, 9))

    async def _trajectory(
        self, r: ev.GeneratedRollout
    ) -> tuple[str | None, str | None, str | None, int | None, bool | None]:
        """(inline json, uri, sha256, size, has_tokens) for one rollout's trajectory."""
        if r.trajectory is None:
            # Already a claim check from the actor (or no trajectory at all): keep the ref.
            return None, r.trajectory_uri, r.trajectory_sha256, None, None
        has_tokens = bool(r.trajectory.get("token_ids")) and bool(r.trajectory.get("logprobs"))
        data = to_json_bytes(r.trajectory)
        # jsonb cannot hold "\u0000" (a babbling model emits NUL bytes): such a trajectory
        # goes to the object store whatever its size, kept exactly as sampled.
        if len(data) <= self.inline_bytes and _NUL_JSON not in data:
            return data.decode(), None, None, len(data), has_tokens
        sha = sha256_bytes(data)
        ref = await self.store.put(content_key(TRAJECTORY_PREFIX, sha), data)
        return None, ref.uri, ref.sha256, ref.size, has_tokens


_GENERATED_SQL = (
    "insert into buffer_rollouts(rollout_id, run_id, env_slug, env_version, env_hash,"
    " task_index, sample_index, model, policy_version, seed, trajectory, trajectory_uri,"
    " trajectory_sha256, trajectory_bytes, has_tokens, generation_error, generated_seq,"
    " generated_at) select u.id, u.run, u.slug, u.version, u.hash, u.task, u.sample, u.model,"
    " u.policy, u.seed, u.trajectory::jsonb, u.uri, u.sha, u.size, u.tokens, u.error, u.seq, u.at"
    " from unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::int[],"
    " $7::int[], $8::text[], $9::int[], $10::bigint[], $11::text[], $12::text[], $13::text[],"
    " $14::int[], $15::bool[], $16::text[], $17::bigint[], $18::timestamptz[])"
    " as u(id, run, slug, version, hash, task, sample, model, policy, seed, trajectory, uri,"
    " sha, size, tokens, error, seq, at)"
    " on conflict (rollout_id) do nothing"
)
# Only the first verdict per rollout counts: a re-scored batch changes nothing. A rollout
# generated twice keeps its first trajectory, and only a verdict of that trajectory (the one
# at its generated_seq): another's would label it with what a different trajectory did.
_SCORED_SQL = (
    "update buffer_rollouts b set score = u.score, passed = u.passed,"
    " primitives = u.primitives::jsonb, error = u.error, scored_seq = u.seq, scored_at = u.at"
    " from unnest($1::text[], $2::float8[], $3::bool[], $4::text[], $5::text[], $6::bigint[],"
    " $7::timestamptz[], $8::text[], $9::bigint[])"
    " as u(id, score, passed, primitives, error, seq, at, run, judged)"
    " where b.rollout_id = u.id and b.run_id = u.run and b.scored_at is null"
    " and (u.judged is null or b.generated_seq = u.judged)"
)


def _scored_row(e: EventEnvelope, p: ev.RolloutsScored, r: Any, position: int) -> tuple:
    return (
        r.rollout_id, r.score, r.passed, _json([x.model_dump() for x in r.primitives]),
        _text(r.error), position, e.time, p.run_id, p.generated_seq,
    )  # fmt: skip


def _json(value: Any) -> str:
    # Postgres text and jsonb refuse NUL; a verdict's reason may quote model output.
    return json.dumps(value, sort_keys=True).replace("\\u0000", "\\ufffd")


def _text(value: str | None) -> str | None:
    return None if value is None else value.replace("\x00", "\ufffd")
