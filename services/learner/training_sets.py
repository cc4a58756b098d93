"""Training data from the buffer: SFT examples, preference pairs (DPO, RM), labelled rollouts
(KTO) and GRPO groups over request/reply.

The buffer keeps every scored rollout with its trajectory (large ones in the object store)
and builds the sets; its answer may itself be a claim check, which is fetched and verified by
sha256 here. Every question names the stream sequence at which the run ended, so the buffer
answers only once it holds all of that run's verdicts. A buffer that is not running is said
so at once (no responders), and one that does not answer is given up on after a bounded wait.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import nats.errors
from nats.aio.client import Client

from rollout.shared.bus.requests import service_subject
from rollout.shared.contracts.buffer import (
    BEHIND,
    SERVICE,
    BufferData,
    BufferQuery,
    DpoPairsQuery,
    GrpoGroupsQuery,
    SftSetQuery,
)
from rollout.shared.contracts.requests import Reply
from rollout.shared.contracts.snapshot import (
    DatasetSource,
    SnapshotRow,
    lineage_of,
    rows_from_jsonl,
)
from rollout.shared.errors import RetrySignal, RolloutError
from rollout.shared.learning import datasets
from rollout.shared.learning.methods import DataKind
from rollout.shared.learning.trainer_rows import TrainingSet
from rollout.shared.objectstore import ObjectRef, ObjectStore
from rollout.shared.objectstore.errors import ObjectStoreError

# Below the CLI's request timeout (30 s), so a job request gets the buffer's problem back.
BUFFER_TIMEOUT_S = 25.0
_START_IT = (
    "training data comes from the buffer: start it with `rollout up` (or `rollout serve buffer`)"
)


class BufferUnavailable(RetrySignal):
    """The buffer could not give the data now (not running, too slow, or behind the log)."""


async def ask(
    nc: Client,
    store: ObjectStore,
    verb: str,
    query: BufferQuery,
    *,
    timeout_s: float = BUFFER_TIMEOUT_S,
) -> TrainingSet:
    """One buffer question; items fetched from the store (sha256-verified) when a ref comes."""
    # As the learner's own user, which its permissions let it publish under (and which the
    # buffer exempts from the keys' budgets: shared/service/throttle.py).
    subject = service_subject(nc, SERVICE, verb)
    try:
        msg = await nc.request(subject, query.model_dump_json().encode(), timeout=timeout_s)
    except nats.errors.NoRespondersError:
        raise BufferUnavailable(
            f"the buffer service is not running (no one answers {subject})", problems=[_START_IT]
        ) from None
    except nats.errors.TimeoutError:
        raise BufferUnavailable(
            f"the buffer service did not answer {verb} within {timeout_s:.0f}s",
            problems=["check its health with `rollout status`", _START_IT],
        ) from None
    reply = Reply.model_validate_json(msg.data)
    if not reply.ok and (reply.error or "").startswith(BEHIND):
        # Lagging, not wrong: a job asking this is retried (from its checkpoint) later.
        raise BufferUnavailable(reply.error or BEHIND, problems=reply.problems)
    if not reply.ok:
        raise RolloutError(reply.error or f"the buffer refused {verb}", problems=reply.problems)
    data = BufferData.model_validate(reply.data)
    items, meta = await data.load(store)
    if data.next_offset is not None and data.next_offset > query.offset:
        # A paged answer: the rest follows from where this page ended.
        rest = await ask(
            nc,
            store,
            verb,
            query.model_copy(update={"offset": data.next_offset}),
            timeout_s=timeout_s,
        )
        items, meta = items + rest.items, meta + rest.meta
    return TrainingSet(items=items, meta=meta, stats=dict(data.stats))


async def sft_set(
    nc: Client, store: ObjectStore, run_id: str, rollout_ids: list[str] | None, *, after_seq: int
) -> TrainingSet:
    """The run's passing rollouts (of `rollout_ids`, when given) as chat examples with tools."""
    query = SftSetQuery(run_id=run_id, rollout_ids=rollout_ids, after_seq=after_seq)
    return await ask(nc, store, "sft_set", query)


async def dpo_pairs(
    nc: Client,
    store: ObjectStore,
    run_id: str,
    rollout_ids: list[str] | None,
    *,
    min_margin: float,
    after_seq: int,
) -> TrainingSet:
    """Best-vs-worst preference pairs per task of the run."""
    query = DpoPairsQuery(
        run_ids=[run_id], rollout_ids=rollout_ids, min_margin=min_margin, after_seq=after_seq
    )
    return await ask(nc, store, "dpo_pairs", query)


async def grpo_groups(
    nc: Client,
    store: ObjectStore,
    run_id: str,
    *,
    current_version: int,
    max_staleness: int,
    after_seq: int,
    min_group_size: int = 2,
) -> TrainingSet:
    """The run's groups with sampled tokens and rewards, none older than `max_staleness`."""
    query = GrpoGroupsQuery(
        run_ids=[run_id],
        current_policy_version=current_version,
        max_staleness=max_staleness,
        min_group_size=min_group_size,
        require_tokens=True,
        after_seq=after_seq,
    )
    return await ask(nc, store, "grpo_groups", query)


async def labelled_set(
    nc: Client, store: ObjectStore, run_id: str, rollout_ids: list[str] | None, *, after_seq: int
) -> TrainingSet:
    """Every scored rollout of the run, grouped by task, each with `passed` (what KTO learns)."""
    query = GrpoGroupsQuery(
        run_ids=[run_id], min_group_size=1, require_tokens=False, after_seq=after_seq
    )
    found = await ask(nc, store, "grpo_groups", query)
    if rollout_ids is None:
        return found
    wanted = set(rollout_ids)
    items = []
    for group in found.items:
        kept = [c for c in group["completions"] if c["rollout_id"] in wanted]
        if kept:
            items.append({**group, "completions": kept})
    return TrainingSet(items=items, meta=[{} for _ in items], stats=found.stats)


async def dataset_set(
    store: ObjectStore,
    source: DatasetSource,
    kind: DataKind,
    *,
    min_margin: float,
    leave_out: Callable[[list[SnapshotRow]], Awaitable[list[SnapshotRow]]] | None = None,
) -> TrainingSet:
    """A dataset snapshot's training set of `kind`, built as the buffer builds a run's, of the
    rows `leave_out` keeps (all without it).

    The bytes are fetched by claim check (sha256-verified) and every row is checked again:
    a job records only what it can train on, and a replayed job gets the very same rows.
    """
    where = f"source_dataset {source.name}"
    ref = ObjectRef(uri=source.uri, sha256=source.sha256, size=source.size)
    try:
        data = await store.get(ref)
    except ObjectStoreError as exc:
        raise RolloutError(f"{where}: {exc.message}", problems=exc.problems) from None
    try:
        rows = rows_from_jsonl(data, where)
    except ValueError as exc:
        raise RolloutError(str(exc)) from None
    if not rows:
        raise RolloutError(f"{where}: no rows")
    expected = lineage_of(rows)
    if not source.lineage.sources:  # sent by a client from before lineages named sources
        expected = expected.model_copy(update={"sources": {}})
    if expected != source.lineage:
        raise RolloutError(f"{where}: the lineage sent does not match the dataset's rows")
    if leave_out is not None:
        rows = await leave_out(rows)
    buffer_rows = [r.buffer_row() for r in rows]
    if kind == "sft":
        items, meta, stats = datasets.sft_set(buffer_rows)
    elif kind == "labelled":
        query = GrpoGroupsQuery(
            run_ids=source.lineage.run_ids, min_group_size=1, require_tokens=False
        )
        items, meta, stats = datasets.grpo_groups(buffer_rows, query)
    else:
        items, meta, stats = datasets.dpo_pairs(buffer_rows, min_margin)
    return TrainingSet(items=items, meta=meta, stats=stats)
