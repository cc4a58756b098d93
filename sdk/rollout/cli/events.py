"""`rollout events`: print events from the log, optionally following new ones."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from rollout.cli._common import client_settings_or_error
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.settings import connect_nats

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from rollout.shared.contracts.envelope import EventEnvelope


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `events` verb."""
    p = sub.add_parser("events", help="print events from the log (--follow to tail it)")
    p.add_argument(
        "--subject-filter", default=None, help="NATS subject filter, e.g. rollout.evt.run.>"
    )
    p.add_argument("--run", default=None, help="only this run's events")
    p.add_argument("--plan", default=None, help="only this experiment plan's events")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    p.add_argument(
        "--since", type=int, default=1, metavar="SEQ", help="start at this sequence (>= 1)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=_events)


def _format(seq: int, event: EventEnvelope) -> str:
    body = json.dumps(event.payload, default=str)
    if len(body) > 160:
        body = body[:157] + "..."
    when = event.time.strftime("%H:%M:%S.%f")[:-3]
    return f"{seq:>7} {when} {event.type:<20} {event.subject}  {body}"


def subject_problem(value: str) -> str | None:
    """Why `value` is not a NATS subject filter (dot-separated tokens, `*` and a last `>`)."""
    tokens = value.split(".")
    if not value or any(not t for t in tokens):
        return "not a NATS subject (empty token)"
    if any(c.isspace() or not c.isprintable() for c in value):
        return "not a NATS subject (spaces and control characters are not allowed)"
    if ">" in tokens[:-1]:
        return "not a NATS subject ('>' may only be the last token)"
    if not _overlaps(tokens, subjects.ALL_EVENTS.split(".")):
        # A typo (`rollout.evts.>`) would otherwise print nothing, or wait forever with -f.
        return f"matches no event (the events stream holds {subjects.ALL_EVENTS})"
    return None


def _overlaps(tokens: list[str], pattern: list[str]) -> bool:
    """Whether some subject matches both filters (token lists, with `*` and a last `>`)."""
    for i, theirs in enumerate(pattern):
        if theirs == ">":
            return len(tokens) > i
        if i >= len(tokens):
            return False
        if tokens[i] == ">":
            return True
        if "*" not in (tokens[i], theirs) and tokens[i] != theirs:
            return False
    return len(tokens) == len(pattern)


def _filter(args: argparse.Namespace) -> tuple[str, str | None]:
    """The subject filter to read, and what to call the run or plan asked for (else None)."""
    given = [f for f in ("subject_filter", "run", "plan") if getattr(args, f) is not None]
    if len(given) > 1:
        flags = " and ".join("--" + f.replace("_", "-") for f in given)
        raise RolloutError(f"{flags}: give one of them")
    if args.since < 1:
        raise RolloutError(f"--since: must be a sequence number >= 1, got {args.since}")
    try:
        if args.run is not None:
            token = subjects.token(args.run, "run id")
            return subjects.run_events(token), f"no run {args.run!r} (see `rollout runs`)"
        if args.plan is not None:
            token = subjects.token(args.plan, "plan id")
            return subjects.aggregate_events("plan", token), f"no plan {args.plan!r}"
    except subjects.SubjectError as exc:
        raise RolloutError(str(exc)) from None
    if args.subject_filter is None:
        return subjects.ALL_EVENTS, None
    if problem := subject_problem(args.subject_filter):
        raise RolloutError(f"--subject-filter {args.subject_filter!r}: {problem}")
    return args.subject_filter, None


async def _tail(args: argparse.Namespace) -> int:
    from nats.js.errors import BadRequestError, NotFoundError

    filter_subject, missing = _filter(args)
    nc = await connect_nats(client_settings_or_error())
    try:
        js = nc.jetstream()
        if missing is not None:
            # An id with no event on the log is no run (plan): say so, as `show` does,
            # rather than print nothing.
            try:
                await js.get_last_msg(subjects.EVENTS_STREAM, filter_subject)
            except NotFoundError:
                raise RolloutError(missing) from None
        try:
            await _print_events(js, filter_subject, args)
        except BadRequestError as exc:
            # What the server refuses of a valid-looking filter (e.g. one outside the events
            # stream's subjects), in its words.
            raise RolloutError(
                f"the events stream refused the read of {filter_subject!r}: {exc.description}"
            ) from None
    finally:
        await nc.close()
    return 0


async def _print_events(
    js: JetStreamContext, filter_subject: str, args: argparse.Namespace
) -> None:
    import pydantic

    from rollout.shared.bus.reader import read_events
    from rollout.shared.contracts.envelope import EventEnvelope

    async for msg in read_events(js, filter_subject, start_seq=args.since, follow=args.follow):
        seq = msg.metadata.sequence.stream
        try:
            event = EventEnvelope.from_bytes(msg.data)
        except pydantic.ValidationError as exc:
            print(f"{seq:>7} <invalid event on {msg.subject}: {exc.error_count()} error(s)>")
            continue
        if args.json:
            print(json.dumps({"seq": seq, **event.model_dump(mode="json")}), flush=True)
        else:
            print(_format(seq, event), flush=True)


def _events(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_tail(args))
    except KeyboardInterrupt:
        sys.stdout.flush()
        return 0
