"""Follow a run's or a training job's events until it ends, with a progress bar on stderr."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from nats.js.errors import NotFoundError

from rollout.client import AsyncClient
from rollout.printable import redraw
from rollout.shared import subjects
from rollout.shared.aggregates.run import RunState
from rollout.shared.aggregates.run import follow_run as follow_run_events
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.errors import RolloutError

_FINAL = ("completed", "failed")


def num(value: float | None, fmt: str = ".4f") -> str:
    """A number for a progress line, `-` when unknown."""
    return "-" if value is None else format(value, fmt)


def eta(seconds: float | None) -> str:
    """Seconds left as `3m05s`, `-` when unknown."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def bar(step: int, total: int, width: int = 30) -> str:
    """A text progress bar."""
    filled = int(width * step / total) if total else 0
    return "█" * filled + "░" * (width - filled)


async def follow_job(
    client: AsyncClient, job_id: str, *, quiet: bool = False, timeout_s: float | None = None
) -> dict[str, Any]:
    """Follow a job's events (progress bar on stderr) until it ends; return the job."""
    js = await client.jetstream()
    requested = subjects.event("job", job_id, subjects.event_name("job.requested"))
    try:  # a clear error for an unknown id, before waiting (the log knows a new job first)
        await js.get_last_msg(subjects.EVENTS_STREAM, requested)
    except NotFoundError:
        raise RolloutError(f"no training job {job_id!r} (see `rollout jobs`)") from None

    async def follow() -> None:
        async for msg in read_events(js, subjects.aggregate_events("job", job_id), follow=True):
            event = EventEnvelope.from_bytes(msg.data)
            body: Any = event.body()
            if event.type == "job.started" and not quiet:
                # Minutes may pass before the first step: say the job is under way meanwhile.
                redraw("  started: loading the model and its data (online: the first round)  ")
            if event.type == "job.progress" and not quiet:
                redraw(
                    f"  [{bar(body.step, body.total_steps)}] step {body.step}/"
                    f"{body.total_steps}  loss {num(body.loss)}  reward {num(body.reward)}"
                    f"  tok/s {num(body.tokens_per_s, '.0f')}  ETA {eta(body.eta_s)}  "
                )
            if event.type in ("job.completed", "job.failed"):
                return

    try:
        await asyncio.wait_for(follow(), timeout=timeout_s)
    except TimeoutError:
        raise RolloutError(f"job {job_id} did not finish within {timeout_s:.0f}s") from None
    if not quiet:
        sys.stderr.write("\n")
    # The event is on the log; the read model follows it within moments.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        try:
            job = await client.get_training_job(job_id)
        except RolloutError:
            if loop.time() > deadline:
                raise
            job = {"status": None}
        if job["status"] in _FINAL or loop.time() > deadline:
            return job
        await asyncio.sleep(0.1)


async def follow_run(client: AsyncClient, run_id: str, *, quiet: bool = False) -> None:
    """Follow a run's events with a progress bar until it completes or fails."""

    def show(event: EventEnvelope, state: RunState) -> None:
        if not quiet:
            verdicts = state.verdicts.values()
            passed = sum(1 for v in verdicts if v.outcome == "passed")
            errored = sum(1 for v in verdicts if v.outcome == "errored")
            _progress(len(state.verdicts), state.total or 0, passed, errored)

    await follow_run_events(await client.jetstream(), run_id, on_event=show)
    if not quiet:
        sys.stderr.write("\n")


def _progress(done: int, total: int, passed: int, errored: int = 0) -> None:
    # The rate is over verdicts, as `rollout show`'s: an errored rollout has none.
    judged = done - errored
    rate = f"{passed / judged:.0%}" if judged else "-"
    errors = f", errored {errored}" if errored else ""
    redraw(f"  [{bar(done, total)}] {done}/{total or '?'} scored, pass {rate}{errors}  ")
