"""Run lifecycle: create (validate, append), fan out into work items, complete, time out."""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict
from collections.abc import Iterable
from contextlib import suppress
from datetime import UTC, datetime
from typing import TypeGuard

import asyncpg
import nats.errors
from faststream.nats import NatsBroker, NatsMessage
from nats.aio.client import Client
from nats.js import JetStreamContext, api

from rollout.services.tracker.servable import actors_problem
from rollout.services.tracker.trained_names import trained_model_problem
from rollout.shared import subjects
from rollout.shared.aggregates import append, quota
from rollout.shared.aggregates.append import append_unless
from rollout.shared.aggregates.run import (
    STATE_EVENTS,
    Ending,
    RunState,
    append_to_run,
    decide_and_append,
    load_run,
    load_run_head,
    recorded_request,
    rollout_id,
)
from rollout.shared.aggregates.run_options import (
    MAX_BATCH,
    REFUSED,
    option_problems,
    total_problem,
)
from rollout.shared.auth.ownership import check_may_change, owner_for
from rollout.shared.bus.broker import jetstream
from rollout.shared.bus.deadletter import describe
from rollout.shared.bus.publisher import ACK_TIMEOUT_S, ConcurrencyConflict, EventPublisher
from rollout.shared.contracts.envelope import EventEnvelope, deterministic_id, new_id
from rollout.shared.contracts.events import (
    RunCompleted,
    RunFailed,
    RunRequested,
    RunStarted,
    SamplingParams,
    WorkReleased,
)
from rollout.shared.contracts.requests import (
    CancelRun,
    CreateRun,
    owned_request_key,
    request_fingerprint,
)
from rollout.shared.contracts.work import RolloutItem, RolloutWork
from rollout.shared.envs.verifiers.ruler import judged_in_groups
from rollout.shared.errors import RetrySignal, RolloutError
from rollout.shared.models.catalog import backend_forms, has_backend_form
from rollout.shared.models.openai_compat import check_endpoint_policy
from rollout.shared.objectstore import ObjectStore
from rollout.shared.observability import event_context, get_logger
from rollout.shared.service import durables
from rollout.shared.settings import env_number
from rollout.shared.store import env_versions

QUEUE = "tracker"
FANOUT_DURABLE = durables.TRACKER_FANOUT.name
# Unfinished runs whose aggregate the leader keeps in memory (least recently moved go first).
RUN_STATES_LIMIT = 4096
_STATE_NAMES = frozenset(subjects.event_name(t) for t in STATE_EVENTS)
# Tries of a cancel: another is needed only when the run completed meanwhile.
CANCEL_RETRIES = 3
# Rollouts of one run in the shared queue at a time, in whole work items (0: all at once).
# The actors take work first come, first served: without a window, a run of thousands of
# rollouts queued ahead holds every later run, anyone's, until its last item is taken. The
# window is in rollouts, not items, because a rollout is the unit of time another run waits
# for, and small items need more of them in flight to keep the actors busy. Raise it on a
# big actor pool, so that one run alone still fills every slot.
RUN_WINDOW_ENV = "ROLLOUT_RUN_WINDOW"
DEFAULT_RUN_WINDOW = 256
# Runs of one owner with work in the shared queue at a time (0: no cap); the rest wait,
# first come first served, and each starts as one of the owner's earlier runs ends. Without
# it a key starting thousands of runs holds at least an item of each ahead of everyone's.
RUNS_PER_OWNER_ENV = "ROLLOUT_RUNS_PER_OWNER"
DEFAULT_RUNS_PER_OWNER = 8
# How long a run being fanned out counts in its owner's share before its state holds it.
STARTING_KEPT_S = 60.0
# A release that fails on these is left to the next check (RunStates.release_all_due).
RELEASE_RETRIED = (OSError, RolloutError, RetrySignal, nats.errors.Error)

log = get_logger(__name__)


def check_model_name(model: str) -> str | None:
    """A problem with the model name, or None when some backend accepts its form."""
    name = (model or "").strip()
    if has_backend_form(name):
        # The operator's endpoint policy: no credential options, no endpoint nobody allowed.
        return check_endpoint_policy(name)
    forms = ", ".join(f"{f.prefix}... (e.g. {f.example})" for f in backend_forms())
    return f"model: unknown model backend {model!r}; valid forms: {forms}"


async def plan_run(
    js: JetStreamContext,
    cmd: CreateRun,
    store: ObjectStore | None = None,
    pool: asyncpg.Pool | None = None,
    nc: Client | None = None,
) -> RunRequested:
    """Validate a run request against the registered environment; every problem is listed.

    With the object store (and the jobs read model), a trained model the name can only mean
    (a job id, a local model's `BASE:SUFFIX`) must have been published. With a connection
    (`nc`), the actors are asked whether they can generate with the model (servable.py).
    """
    problems = option_problems(cmd)
    if (problem := check_model_name(cmd.model)) is not None:
        problems.append(problem)
    elif (problem := await trained_model_problem(cmd.model, store, pool)) is not None:
        problems.append(problem)
    try:
        subjects.token(cmd.env_slug, "environment slug")
    except subjects.SubjectError as exc:
        raise RolloutError(REFUSED, problems=[f"env_slug: {exc}", *problems]) from None
    if cmd.env_version is None:
        env, _ = await env_versions.latest(js, cmd.env_slug)
    else:
        env = await env_versions.version(js, cmd.env_slug, cmd.env_version)
    if env is None:
        what = f"version {cmd.env_version} of " if cmd.env_version is not None else ""
        problems.append(
            f"env_slug: no {what}environment {cmd.env_slug!r} (push it with `rollout push`)"
        )
        raise RolloutError(REFUSED, problems=problems)
    tasks = env.spec.get("tasks", [])
    indices = list(range(len(tasks)))
    if cmd.split is not None:
        indices = [i for i in indices if tasks[i].get("split", "train") == cmd.split]
        if not indices:
            splits = sorted({t.get("split", "train") for t in tasks})
            problems.append(f"split: no tasks in split {cmd.split!r} (splits: {', '.join(splits)})")
    if cmd.task_indices is not None:
        bad = [i for i in cmd.task_indices if i not in indices]
        if bad:
            problems.append(f"task_indices: {bad} not among the selected tasks {indices}")
        indices = [i for i in indices if i in set(cmd.task_indices)]
    if not indices and not problems:
        problems.append(f"environment {cmd.env_slug!r} has no tasks")
    if (too_big := total_problem(len(indices), cmd.n)) is not None:
        problems.append(too_big)
    if not problems and (problem := await actors_problem(nc, cmd.model)) is not None:
        # Asked last: only a request otherwise accepted loads a model at the actors.
        problems.append(problem)
    if problems:
        raise RolloutError(REFUSED, problems=problems)
    grouped = judged_in_groups(env.spec)
    if grouped and cmd.n > MAX_BATCH:
        # One judge call sees a whole group, and a group must fit in one work item.
        problems.append(
            f"n: a `ruler` verifier judges a task's {cmd.n} samples together, but a batch "
            f"holds at most {MAX_BATCH}: use n <= {MAX_BATCH}"
        )
        raise RolloutError(REFUSED, problems=problems)
    batch_size = cmd.batch_size
    if grouped:
        # A `ruler` verifier judges the n samples of a task together in one call: a work item
        # (one generated batch) then holds whole groups, never part of one; rounded down
        # instead of up where up would pass the largest batch.
        batch_size = -(-batch_size // cmd.n) * cmd.n
        if batch_size > MAX_BATCH:
            batch_size = MAX_BATCH // cmd.n * cmd.n
    return RunRequested(
        run_id=new_id()[:16],
        env_slug=env.slug,
        env_version=env.version,
        env_hash=env.spec_hash,
        model=cmd.model,
        n=cmd.n,
        sampling=SamplingParams(
            temperature=cmd.temperature,
            top_p=cmd.top_p,
            max_tokens=cmd.max_tokens,
            seed=cmd.seed,
        ),
        max_tool_calls=cmd.max_tool_calls,
        budgets=cmd.budgets,
        split=cmd.split,
        name=cmd.name,
        parent_run_id=cmd.parent_run_id,
        task_indices=indices,
        batch_size=batch_size,
        deadline_s=cmd.deadline_s,
    )


# The runs a leader must hold to release their work: windowed runs under way, and each
# owner's oldest waiting runs (as many as may start: $1, the cap).
_RELEASING_SQL = (
    "select run_id from runs where status = 'running' and released < work_items"
    " union all select run_id from (select run_id, row_number() over (partition by owner"
    " order by created_at, run_id) as k from runs where status = 'queued' and released = 0"
    " and released < work_items) w where k <= $1"
)


def run_window() -> int | None:
    """Rollouts of a run queued at a time (ROLLOUT_RUN_WINDOW, else 256); None: no limit."""
    window = int(env_number(RUN_WINDOW_ENV, DEFAULT_RUN_WINDOW, whole=True, low=0))
    return window or None


def runs_per_owner() -> int | None:
    """Runs of one owner with work queued at a time (ROLLOUT_RUNS_PER_OWNER, else 8); None:
    no cap."""
    cap = int(env_number(RUNS_PER_OWNER_ENV, DEFAULT_RUNS_PER_OWNER, whole=True, low=0))
    return cap or None


def window_items(window: int | None, batch_size: int, items: int) -> int | None:
    """The window in work items (at least one; 0 for a run that waits), or None when the run
    fits in it whole."""
    if window is None:
        return None
    count = max(1 if window else 0, -(-window // batch_size))
    return count if count < items else None


async def queue_work(js: JetStreamContext, batches: list[RolloutWork]) -> None:
    """Publish work items; each id is its message id, so queuing one again is a no-op."""
    futures = [
        await js.publish_async(
            subjects.work("rollouts", w.run_id),
            w.model_dump_json().encode(),
            headers={api.Header.MSG_ID: w.work_item_id},
        )
        for w in batches
    ]
    await asyncio.wait_for(asyncio.gather(*futures), ACK_TIMEOUT_S)


class Seeds:
    """A run's rollout seeds in order, each drawn once: a slice continues where the last one
    ended, so releasing a big run item by item costs each seed once (a seed's draw takes a
    variable number of random bits: there is no skipping ahead without drawing)."""

    def __init__(self, run: RunRequested) -> None:
        self._run = run
        self._restart()

    def _restart(self) -> None:
        run = self._run
        self._rng = random.Random(
            run.sampling.seed if run.sampling.seed is not None else run.run_id
        )
        self._drawn = 0

    def slice(self, first: int, last: int) -> list[int]:
        """The seeds of rollouts `first` (inclusive) to `last` (exclusive), in run order."""
        if first < self._drawn:
            self._restart()  # an earlier slice again (a re-queue): drawn anew from the start
        for _ in range(first - self._drawn):
            self._rng.randrange(2**31)
        seeds = [self._rng.randrange(2**31) for _ in range(first, last)]
        self._drawn = last
        return seeds


def run_size(run: RunRequested) -> tuple[int, int]:
    """(rollouts, work items) of a run, without building them."""
    total = len(run.task_indices) * run.n
    return total, -(-total // run.batch_size)


def work_items(
    event: EventEnvelope,
    run: RunRequested,
    start: int = 0,
    stop: int | None = None,
    seeds: Seeds | None = None,
    requeued: bool = False,
) -> list[RolloutWork]:
    """Split a run into batches of rollouts (those from `start` to `stop`); ids and seeds are
    derived, so a retried fan-out dedups and a later slice matches the whole. `seeds` carries
    a run's draws from one slice to the next; `requeued` marks items queued before."""
    total = len(run.task_indices) * run.n
    first = min(total, start * run.batch_size)
    last = total if stop is None else min(total, stop * run.batch_size)
    drawn = (seeds or Seeds(run)).slice(first, last)
    items = [
        RolloutItem(
            rollout_id=rollout_id(run.run_id, t, s),
            task_index=t,
            sample_index=s,
            seed=drawn[i - first],
        )
        for i in range(first, last)
        for t, s in [divmod(i, run.n)]
        for t in [run.task_indices[t]]
    ]
    batches = [items[i : i + run.batch_size] for i in range(0, len(items), run.batch_size)]
    return [
        RolloutWork(
            work_item_id=deterministic_id("work", run.run_id, index)[:24],
            run_id=run.run_id,
            env_slug=run.env_slug,
            env_version=run.env_version,
            env_hash=run.env_hash,
            model=run.model,
            sampling=run.sampling,
            max_tool_calls=run.max_tool_calls,
            budgets=run.budgets,
            policy_version=run.policy_version,
            items=batch,
            trace_id=event.trace_id,
            correlation_id=event.correlation_id,
            causation_id=event.id,
            requeued=requeued,
        )
        for index, batch in enumerate(batches, start=start)
    ]


async def fan_out(
    js: JetStreamContext,
    event: EventEnvelope,
    position: int | None = None,
    share: int | None = None,
) -> RunStarted | None:
    """Mark a run started and queue its work items; None when the run already ended.

    `position` is the request's stream sequence, when the caller has it: the request is its
    run's first event, so a run whose history still ends there is one the request alone
    makes, and it is started expecting exactly that, without reading the history first.
    `share` is the run's window in rollouts (None: all at once); the leader passes its
    owner's share of ROLLOUT_RUN_WINDOW (RunStates.reserve).
    """
    run = event.body()
    assert isinstance(run, RunRequested)
    if run.source is not None:
        # An imported run's rollouts and verdicts are on its history already (imports.py).
        log.info("imported run; nothing to generate", run_id=run.run_id, source=run.source)
        return None
    total, items = run_size(run)
    started = RunStarted(
        run_id=run.run_id,
        work_items=items,
        total_rollouts=total,
        window=window_items(share, run.batch_size, items),
    )
    # Started first, so the total is known before any verdict can arrive. A redelivered
    # request (a crash between the two steps) finds it started and queues the items again:
    # their derived ids make that a no-op where they were queued.
    fresh = position is not None and await _start_fresh(js, event, run, started, position)
    if not fresh and not await _start_from_history(js, run, started):
        log.info("run already ended; not fanned out", run_id=run.run_id)
        return None
    if not fresh:
        # A redelivered request: the window its history records is the run's (what releases
        # the rest), whichever share or replica's setting made this attempt's.
        recorded = await load_run_head(js, run.run_id)
        window = recorded.window if recorded is not None else None
        started = started.model_copy(update={"window": window})
    await queue_work(js, work_items(event, run, 0, started.window, requeued=not fresh))
    return started


async def _start_fresh(
    js: JetStreamContext,
    event: EventEnvelope,
    run: RunRequested,
    started: RunStarted,
    position: int,
) -> bool:
    """Append run.started to a run whose history is its request alone; False if it is not."""
    state = RunState(run.run_id, requested=run, requested_event=event, version=position)
    try:
        await append_to_run(js, state, started)
    except ConcurrencyConflict:
        return False  # started already (a redelivery), or ended, or failed: look at it
    return True


async def _start_from_history(js: JetStreamContext, run: RunRequested, started: RunStarted) -> bool:
    """Append run.started unless the run's history has it; False when the run already ended."""

    def decide(state: RunState) -> RunStarted | None:
        return started if state.ended is None and state.total is None else None

    # Its deadline, or another tracker, may get in first: decided again from a fresh read.
    state, appended = await decide_and_append(js, run.run_id, decide)
    return appended is not None or state.ended is None


async def settle(
    js: JetStreamContext, run_id: str, *, now: datetime | None = None
) -> Ending | None:
    """Load the run, decide whether it ends now, append that ending; None while it goes on.

    The append expects the run's history to be where it was read: if a verdict, or another
    tracker's ending, got in first, the run is read again and decided again. So a last
    rollout racing the deadline ends the run once, never as both completed and failed.
    """
    try:
        _, ending = await decide_and_append(
            js, run_id, lambda state: state.decide(now or datetime.now(UTC))
        )
    except ConcurrencyConflict:
        # Verdicts keep landing: the next one triggers this again (or the next deadline check).
        log.info("run busy; its ending is decided on the next trigger", run_id=run_id)
        return None
    if isinstance(ending, RunCompleted):
        log.info("run completed", run_id=run_id, pass_rate=ending.pass_rate)
    elif isinstance(ending, RunFailed):
        log.warning("run failed", run_id=run_id, reason=ending.reason)
    return ending if isinstance(ending, RunCompleted | RunFailed) else None


class RunStates:
    """The runs' aggregates, folded from the events the leader's projection reads in order.

    The projection reads the whole events stream in stream order, so it sees every event of
    a run, from its first (`run.requested`, appended expecting an empty history), in the
    order `load_run` would read them: folding them gives the same state at the same version,
    without a read of the run's history per decision. A run this tracker did not see from
    its start (a leader taking over mid-run) is loaded from its events once, then folded.
    A decision is appended expecting the run's history to end at the folded version, as
    every decision is: if anything of the run landed since, the append is refused and the
    run is decided the usual way (`settle`, from a fresh load).
    """

    def __init__(self, limit: int = RUN_STATES_LIMIT) -> None:
        self._states: OrderedDict[str, RunState] = OrderedDict()
        self._limit = limit
        # Runs this leader is fanning out (owner, since, request order, waits), until their
        # state holds the start: so one owner's runs fanned out together already count each
        # other in the share and the cap.
        self._starting: dict[str, tuple[str | None, float, tuple[datetime, str], bool]] = {}
        # Each windowed run's seeds, drawn once across its releases.
        self._seeds: dict[str, Seeds] = {}

    def __len__(self) -> int:
        return len(self._states)

    def get(self, run_id: str) -> RunState | None:
        """The folded state of `run_id`, or None when it is not kept."""
        return self._states.get(run_id)

    def fold(self, items: Iterable[tuple[str, EventEnvelope | None, int]]) -> None:
        """Fold settled events (subject, event, stream position), in stream order, none skipped.

        The subject is the one the message was stored under, as `load_run` selects by it,
        never the envelope's own claim.
        """
        for subject, event, position in items:
            if event is None:
                continue  # dead-lettered: no part of the run's state, as in load_run
            try:
                aggregate, run_id, name = subjects.parse_event_subject(subject)
            except subjects.SubjectError:
                continue
            if aggregate != "run":
                continue
            state = self._states.get(run_id)
            if state is None:
                if event.type != RunRequested.event_type or name not in _STATE_NAMES:
                    continue  # not seen from its start: loaded when a decision needs it
                state = self._keep(RunState(run_id))
            if position <= state.version:
                continue  # already in the state (a redelivery, or a load that read ahead)
            if name in _STATE_NAMES:
                state.apply(event, position)
            # Any event of the run moves its version: the guard of the next append.
            state.version = position
            self._states.move_to_end(run_id)
            if state.ended is not None:
                del self._states[run_id]
                self._starting.pop(run_id, None)
                self._seeds.pop(run_id, None)

    def _keep(self, state: RunState) -> RunState:
        self._states[state.run_id] = state
        while len(self._states) > self._limit:
            self._states.popitem(last=False)
        return state

    def forget(self, run_id: str) -> None:
        """Drop a run's state (it ended, or its history moved past what was folded)."""
        self._states.pop(run_id, None)
        self._seeds.pop(run_id, None)

    def reserve(self, event: EventEnvelope) -> int | None:
        """The requested run's share of its owner's window (0: it waits for the owner's earlier
        runs), counting it among the owner's runs from now (before the fan-out's first await),
        so runs fanned out together split the window and the cap."""
        run = event.body()
        assert isinstance(run, RunRequested)
        key = (event.time, run.run_id)
        share = self._share(run.owner, run.run_id, key)
        self._starting[run.run_id] = (run.owner, time.monotonic(), key, share == 0)
        return share

    def owner_share(self, owner: str | None, run_id: str) -> int | None:
        """`run_id`'s part of its owner's window now, in rollouts (0: it still waits)."""
        state = self._states.get(run_id)
        event = state.requested_event if state is not None else None
        return self._share(owner, run_id, (event.time, run_id) if event else None)

    def _share(
        self, owner: str | None, run_id: str, key: tuple[datetime, str] | None
    ) -> int | None:
        """ROLLOUT_RUN_WINDOW split between the owner's runs under way, so one key starting many
        runs holds one window of the shared queue, not one per run (None: no window); 0 when
        `run_id` (requested at `key`) is not under way and the owner already has
        ROLLOUT_RUNS_PER_OWNER runs under way or waiting ahead of it.

        Counted from the runs this leader holds (all it saw start; after a takeover, those it
        has loaded since) and those it is fanning out, so a new leader's first shares may be
        larger: a share only decides when items are queued, never which or how often.
        """
        window = run_window()
        if window is None:
            return None
        under_way: set[str] = set()
        waiting: set[tuple[datetime, str]] = set()
        for state in self._states.values():
            request, event = state.requested, state.requested_event
            if request is None or event is None or request.owner != owner:
                continue
            if state.ended is not None or state.total is None:
                continue
            if state.waiting:
                waiting.add((event.time, state.run_id))
            else:
                under_way.add(state.run_id)
        now = time.monotonic()
        for other, (whose, since, at, waits) in list(self._starting.items()):
            state = self._states.get(other)
            if now - since > STARTING_KEPT_S or (state is not None and state.total is not None):
                del self._starting[other]  # its state holds its start now (or it never will)
            elif whose == owner and waits:
                waiting.add(at)
            elif whose == owner:
                under_way.add(other)
        if run_id in under_way:
            under_way.discard(run_id)
        elif (cap := runs_per_owner()) is not None and key is not None:
            ahead = sum(1 for at in waiting if at < key)
            if len(under_way) + ahead >= cap:
                return 0
        return max(1, window // (len(under_way) + 1))

    async def release_all_due(self, js: JetStreamContext, pool: asyncpg.Pool) -> int:
        """`release_due` for every windowed run held, and for those waiting that may start,
        oldest first: what a failed release or an ending left undone (the deadline check runs
        it every few seconds); items queued.

        Runs this leader does not hold yet (after a takeover) are found in the read model:
        the windowed runs under way, and each owner's oldest waiting runs."""
        cap = runs_per_owner() or 0
        try:
            rows = await pool.fetch(_RELEASING_SQL, cap)
        except (asyncpg.PostgresError, OSError) as exc:
            log.warning("runs to release not read", error=describe(exc))
            rows = []
        for row in rows:
            if row["run_id"] not in self._states:
                with suppress(*RELEASE_RETRIED):
                    await self._load(js, pool, row["run_id"])
        held = [
            s
            for s in self._states.values()
            if s.window is not None and not s.ended and s.requested_event is not None
        ]
        # Waiting runs after those under way, oldest first: the order they start in.
        held.sort(key=lambda s: (s.waiting, s.requested_event.time, s.run_id))  # type: ignore[union-attr]
        return sum([await self.release_due(js, pool, s.run_id) for s in held])

    async def release_due(self, js: JetStreamContext, pool: asyncpg.Pool, run_id: str) -> int:
        """Queue a windowed run's next work items as earlier ones are scored; how many.

        Not appended with an expected sequence, unlike the run's other decisions: verdicts
        land every few milliseconds while a run is busy, so a guarded append would rarely get
        in. It needs none: what is due only grows with the verdicts, each item's id is its
        message id (queued again, it is dropped), and the record of it (`run.work_released`,
        its id derived from the count) is what a new leader starts from. A crash between the
        two steps queues those items again; a rollout generated twice is counted once.

        A release that fails is logged and left to the next check, never raised: the
        projection retrying its batch for it would hold every run's read models.
        """
        try:
            return await self._release_due(js, pool, run_id)
        except RELEASE_RETRIED as exc:
            log.warning("work release failed", run_id=run_id, error=describe(exc))
            return 0

    async def _release_due(self, js: JetStreamContext, pool: asyncpg.Pool, run_id: str) -> int:
        state = self._states.get(run_id)
        if state is None:
            state = await self._load(js, pool, run_id)
        if state is None or state.window is None or state.requested is None:
            return 0
        batch, items = state.requested.batch_size, state.work_items
        # Nothing due even with the whole window (the usual answer): skip counting the owner's
        # runs, which reads every run held.
        if state.to_release(window_items(run_window(), batch, items) or items) is None:
            return 0
        share = self.owner_share(state.requested.owner, run_id)
        window = window_items(share, batch, items)  # 0: it still waits
        due = state.to_release(items if window is None else window)
        if due is None:
            return 0
        assert state.requested_event is not None
        before = state.released or 0
        seeds = self._seeds.setdefault(run_id, Seeds(state.requested))
        await queue_work(js, work_items(state.requested_event, state.requested, before, due, seeds))
        released = WorkReleased(run_id=run_id, released=due)
        envelope = EventEnvelope.new(
            released, aggregate_id=run_id, id_parts=(run_id, due), parent=state.requested_event
        )
        await EventPublisher(js).publish(envelope)
        state.released = due  # folded again when the projection reaches it: a no-op then
        log.info("work released", run_id=run_id, released=due, of=state.work_items)
        return due - before

    async def complete_if_done(self, js: JetStreamContext, pool: asyncpg.Pool, run_id: str) -> bool:
        """End the run once its folded state has every rollout scored (completed, or failed
        when none got a verdict); True when it did."""
        state = self._states.get(run_id)
        if state is None:
            state = await self._load(js, pool, run_id)
            if state is None:
                return False
        ending = state.decide(datetime.now(UTC))
        if not _all_scored(ending):
            return False  # still going (a passed deadline is the deadline check's to act on)
        try:
            await append_to_run(js, state, ending)
        except ConcurrencyConflict:
            # Something of the run landed after the folded version: decide from a fresh load.
            self.forget(run_id)
            return _all_scored(await settle(js, run_id))
        self.forget(run_id)
        if isinstance(ending, RunCompleted):
            log.info("run completed", run_id=run_id, pass_rate=ending.pass_rate)
        else:
            log.warning("run failed", run_id=run_id, reason=ending.reason)
        return True

    async def _load(self, js: JetStreamContext, pool: asyncpg.Pool, run_id: str) -> RunState | None:
        """A run not folded from its start: load it once (if it may still complete) and keep it."""
        async with pool.acquire() as conn:
            row = await conn.fetchrow("select status from runs where run_id = $1", run_id)
        if row is None:
            # The projection is past this event, so it is past the run's first event too:
            # with no row the run was never requested (and now never can be, its history not
            # being empty). Kept as such, so its later events cost no read.
            return self._keep(RunState(run_id))
        if row["status"] in ("completed", "failed"):
            return None
        state = await load_run(js, run_id)
        if state.ended is not None:
            return None
        return self._keep(state)


def _all_scored(ending: Ending | None) -> TypeGuard[Ending]:
    """True for the endings of a run with every rollout scored (not its deadline's)."""
    return isinstance(ending, RunCompleted) or (
        isinstance(ending, RunFailed) and ending.cause == "errored"
    )


async def fail_overdue(js: JetStreamContext, pool: asyncpg.Pool) -> list[str]:
    """Fail every unfinished run past its deadline, saying how far it got; return their ids.

    Candidates come from the read model; each run's own events decide (one that turns out to
    be complete is completed instead).
    """
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "select run_id from runs where status in ('queued', 'running')"
            " and deadline_from + make_interval(secs => deadline_s) < now()"
        )
    failed = []
    for row in rows:
        if isinstance(await settle(js, row["run_id"]), RunFailed):
            failed.append(row["run_id"])
    return failed


def run_id_for(cmd: CreateRun) -> str:
    """The run's id: derived from its owner's client request id (a retry names the same run)."""
    if cmd.client_request_id is None:
        return new_id()[:16]
    return deterministic_id("run-request", *owned_request_key(cmd.owner, cmd.client_request_id))[
        :16
    ]


def same_request(recorded: RunRequested, cmd: CreateRun) -> RunRequested:
    """The recorded run if `cmd` is a retry of the command that made it, else a clear error."""
    if recorded.request_hash == request_fingerprint(cmd):
        return recorded
    raise RolloutError(
        f"client_request_id: {cmd.client_request_id!r} was already used for another run "
        f"request (run {recorded.run_id}); send a fresh id with each new command"
    )


async def create_run(
    js: JetStreamContext,
    cmd: CreateRun,
    store: ObjectStore | None = None,
    pool: asyncpg.Pool | None = None,
    caller: str = subjects.ANONYMOUS,
    nc: Client | None = None,
) -> RunRequested:
    """Plan and append run.requested once per client request id; a retry gets the same run.

    The first append for a run id expects an empty history, so of two attempts racing (a
    retry overtaking a slow first try, two replicas) one records the run and the other reads
    it back: never two runs, never an orphan. The run belongs to `caller` (the request's
    subject names it), or to whom a service starts it for; its id derives from the owner's
    request id, so another user's same request id names another run.
    """
    cmd = cmd.model_copy(update={"owner": owner_for(caller, cmd.owner, "a run")})
    run_id = run_id_for(cmd)
    if cmd.client_request_id is not None and (found := await recorded_request(js, run_id)):
        return same_request(found, cmd)
    planned = await plan_run(js, cmd, store, pool, nc)
    run = planned.model_copy(
        update={
            "run_id": run_id,
            "request_id": cmd.client_request_id,
            "request_hash": request_fingerprint(cmd),
            "owner": cmd.owner,
        }
    )
    # Charged before it is recorded, once per run id (a retry's charge is found: no second);
    # a key past its budget of rollouts a day is refused here (shared/aggregates/quota.py).
    await quota.charge(js, caller, "rollouts", run_size(run)[0], run_id)
    event = EventEnvelope.new(run, aggregate_id=run_id, id_parts=(run_id,), run_id=run_id)
    try:
        result = await EventPublisher(js).publish(event, expected_last_subject_seq=0)
    except ConcurrencyConflict:
        result = None
    if result is None or result.duplicate:
        found = await recorded_request(js, run_id)
        if found is None:
            raise RolloutError(f"run {run_id} could not be recorded; retry the request")
        return same_request(found, cmd)
    log.info("run requested", run_id=run_id, env=run.env_slug, model=run.model)
    return run


async def cancel_run(
    js: JetStreamContext, pool: asyncpg.Pool, cmd: CancelRun, caller: str = subjects.ANONYMOUS
) -> RunFailed:
    """End a running run as cancelled; the actors stop its generation.

    Decided from the run's head (its request, start and endings) and appended on the condition
    that the run has no completion: the one decision it could race with. The condition is not
    on the whole run, whose rollouts keep landing every few milliseconds while it is busy (no
    cancel would ever get in), and its id is the run's one `run.failed` id, so a deadline
    failing it meanwhile makes the cancel a duplicate that JetStream drops, told as such.
    A run that completes while the cancel is on its way keeps its completion.
    """
    subjects.token(cmd.run_id, "run id")
    # How far it got, for the reason only (the read model's count; the decision is the log's).
    scored = await pool.fetchval("select scored from runs where run_id = $1", cmd.run_id) or 0
    completion = subjects.event("run", cmd.run_id, subjects.event_name(RunCompleted.event_type))

    async def load() -> RunState:
        return await load_run_head(js, cmd.run_id) or RunState(cmd.run_id)

    async def append_cancel(state: RunState, ending: RunFailed) -> None:
        envelope = EventEnvelope.new(
            ending, aggregate_id=cmd.run_id, id_parts=(cmd.run_id,), parent=state.requested_event
        )
        await append_unless(js, envelope, completion)

    def decide(state: RunState) -> RunFailed | None:
        if state.requested is not None:
            check_may_change(caller, state.requested.owner, f"run {cmd.run_id}")
        return state.cancel(cmd.reason, scored)

    state, ending = await append.decide_and_append(
        load, decide, append_cancel,
        what=f"run {cmd.run_id}", retries=CANCEL_RETRIES,
    )  # fmt: skip
    if isinstance(ending, RunFailed):
        log.warning("run cancelled", run_id=cmd.run_id, reason=ending.reason)
        return ending
    if state.requested is None:
        raise RolloutError(f"run_id: no run {cmd.run_id!r} (see `rollout runs`)")
    how = "completed" if isinstance(state.ended, RunCompleted) else "failed"
    detail = f" ({state.ended.reason})" if isinstance(state.ended, RunFailed) else ""
    raise RolloutError(f"run {cmd.run_id} already {how}{detail}: nothing to cancel")


def register_fan_out(broker: NatsBroker, states: RunStates) -> None:
    """Attach the fan-out consumer (the leader's: see tracker/main.py) to `broker`; a run's
    window is its owner's share among the runs `states` holds."""

    @durables.TRACKER_FANOUT.subscriber(broker)
    async def on_run_requested(event: EventEnvelope, message: NatsMessage) -> None:
        """Queue a requested run's work items, then mark it started."""
        with event_context(event):
            position = message.raw_message.metadata.sequence.stream
            # Before the first await: a fetch's requests are handled concurrently.
            share = states.reserve(event) if isinstance(event.body(), RunRequested) else None
            # A step the bus refuses (no stream leader, a full store) raises: the broker's
            # dead-letter policy retries it with backoff for as long as it takes, this
            # consumer's deliveries being unlimited; each step is idempotent (see fan_out).
            started = await fan_out(jetstream(broker), event, position, share)
            if started is not None and started.window == 0:
                log.info("run waits for its owner's earlier runs", work_items=started.work_items)
            elif started is not None:
                log.info("run fanned out", work_items=started.work_items)
