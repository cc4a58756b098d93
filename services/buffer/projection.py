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

NAME = "buffer"
TRAJECTORY_PREFIX = "buffer/trajectories"
# The platform's one claim-check threshold (defined in shared/objectstore/claimcheck.py).
DEFAULT_INLINE_BYTES = DEFAULT_INLINE_LIMIT
_NUL_JSON = b"\\u0000"
# The only events the buffer reads; everything else just advances its position unparsed,
# so event types added by other services never stop it.
WANTED = {subjects.event_name(t) for t in ("run.requested", "rollout.generated", "rollout.scored")}

log = get_logger(__name__)


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
        body = event.body()
        if isinstance(body, ev.RunRequested):
            await self._run_requested(conn, event, body)
        elif isinstance(body, ev.RolloutsGenerated):
            await self._generated(conn, event, body, position)
        elif isinstance(body, ev.RolloutsScored):
            await self._scored(conn, event, body, position)

    async def _run_requested(
        self, conn: asyncpg.Connection, e: EventEnvelope, p: ev.RunRequested
    ) -> None:
        await conn.execute(
            "insert into buffer_runs(run_id, env_slug, env_version, env_hash, model, split, n,"
            " policy_version, requested_at) values ($1,$2,$3,$4,$5,$6,$7,$8,$9)"
            " on conflict do nothing",
            p.run_id, p.env_slug, p.env_version, p.env_hash, p.model, p.split, p.n,
            p.policy_version, e.time,
        )  # fmt: skip

    async def _generated(
        self, conn: asyncpg.Connection, e: EventEnvelope, p: ev.RolloutsGenerated, position: int
    ) -> None:
        run = await conn.fetchrow(
            "select env_slug, env_version, env_hash from buffer_runs where run_id = $1", p.run_id
        )
        if run is None:
            # A run's request always precedes its rollouts on the stream; without it the rows
            # could not be indexed by env, so say so instead of storing half a record.
            log.warning("rollouts of an unknown run skipped", run_id=p.run_id)
            return
        rows = []
        for r in p.rollouts:
            stored = await self._trajectory(r)
            rows.append(
                (
                    r.rollout_id, p.run_id, run["env_slug"], run["env_version"], run["env_hash"],
                    r.task_index, r.sample_index, r.model, r.policy_version, r.seed, *stored,
                    _text(r.error), position, e.time,
                )
            )  # fmt: skip
        await conn.executemany(
            "insert into buffer_rollouts(rollout_id, run_id, env_slug, env_version, env_hash,"
            " task_index, sample_index, model, policy_version, seed, trajectory, trajectory_uri,"
            " trajectory_sha256, trajectory_bytes, has_tokens, generation_error, generated_seq,"
            " generated_at) values ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11::jsonb,$12,$13,$14,$15,"
            "$16,$17,$18) on conflict (rollout_id) do nothing",
            rows,
        )

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

    async def _scored(
        self, conn: asyncpg.Connection, e: EventEnvelope, p: ev.RolloutsScored, position: int
    ) -> None:
        # Only the first verdict per rollout counts: a re-scored batch changes nothing.
        await conn.executemany(
            "update buffer_rollouts set score = $2, passed = $3, primitives = $4::jsonb,"
            " error = $5, scored_seq = $6, scored_at = $7"
            " where rollout_id = $1 and run_id = $8 and scored_at is null",
            [
                (
                    r.rollout_id, r.score, r.passed, _json([x.model_dump() for x in r.primitives]),
                    _text(r.error), position, e.time, p.run_id,
                )
                for r in p.rollouts
            ],
        )  # fmt: skip


def _json(value: Any) -> str:
    # Postgres text and jsonb refuse NUL; a verdict's reason may quote model output.
    return json.dumps(value, sort_keys=True).replace("\\u0000", "\\ufffd")


def _text(value: str | None) -> str | None:
    return None if value is None else value.replace("\x00", "\ufffd")
