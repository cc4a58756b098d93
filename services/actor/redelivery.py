"""A work item delivered again: what an earlier delivery already put on the log, and when to
stop trying.

A replica that dies after publishing part of an item (each task's rollouts go out as soon as
they are done) leaves its item unacked, and JetStream delivers it again. Generating the whole
item again would put a second trajectory of those rollouts on the log, under part ids that
need not match the first (a different split), so nothing would drop it: consumers keep the
first trajectory and the first verdict, which could then be of different generations. So a
redelivery reads what the item already published and generates only the rest.

A replica that dies on every delivery (the item kills it: out of memory, a crashing model)
would otherwise be retried until JetStream's delivery limit and then silently dropped, its run
waiting for its deadline. The actors' consumer delivers without limit; past `Delivery.limit`
the item's missing rollouts are recorded as errored (infra), saying why, without a model call.
"""

from __future__ import annotations

from contextlib import aclosing

import pydantic
from nats.js import JetStreamContext

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import RolloutsGenerated
from rollout.shared.contracts.work import RolloutWork


async def already_generated(js: JetStreamContext, work: RolloutWork) -> set[str]:
    """The rollouts of `work` an earlier delivery of it published (read from the run's log)."""
    wanted = {item.rollout_id for item in work.items}
    subject = subjects.event("run", work.run_id, subjects.event_name(RolloutsGenerated.event_type))
    found: set[str] = set()
    async with aclosing(read_events(js, subject)) as messages:
        async for msg in messages:
            try:
                body = EventEnvelope.from_bytes(msg.data).body()
            except pydantic.ValidationError:
                continue  # dead-lettered by its consumers: no part of the run
            if isinstance(body, RolloutsGenerated) and body.work_item_id == work.work_item_id:
                found.update(r.rollout_id for r in body.rollouts if r.rollout_id in wanted)
    return found


def remaining(work: RolloutWork, done: set[str]) -> RolloutWork:
    """`work` less the rollouts in `done`."""
    return work.model_copy(
        update={"items": [item for item in work.items if item.rollout_id not in done]}
    )
