"""`rollout events`: print events from the log, optionally following new ones."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import pydantic

from rollout.cli._common import client_settings_or_error
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.settings import connect_nats


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `events` verb."""
    p = sub.add_parser("events", help="print events from the log (--follow to tail it)")
    p.add_argument(
        "--subject-filter", default=None, help="NATS subject filter, e.g. rollout.evt.run.>"
    )
    p.add_argument("--run", default=None, help="only this run's events")
    p.add_argument("--plan", default=None, help="only this experiment plan's events")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    p.add_argument("--since", type=int, default=1, metavar="SEQ", help="start at this sequence")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=_events)


def _format(seq: int, event: EventEnvelope) -> str:
    body = json.dumps(event.payload, default=str)
    if len(body) > 160:
        body = body[:157] + "..."
    when = event.time.strftime("%H:%M:%S.%f")[:-3]
    return f"{seq:>7} {when} {event.type:<20} {event.subject}  {body}"


async def _tail(args: argparse.Namespace) -> int:
    filter_subject = args.subject_filter or subjects.ALL_EVENTS
    if args.run:
        filter_subject = subjects.run_events(subjects.token(args.run, "run id"))
    if args.plan:
        filter_subject = subjects.aggregate_events("plan", subjects.token(args.plan, "plan id"))
    nc = await connect_nats(client_settings_or_error())
    try:
        js = nc.jetstream()
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
    finally:
        await nc.close()
    return 0


def _events(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_tail(args))
    except KeyboardInterrupt:
        sys.stdout.flush()
        return 0
