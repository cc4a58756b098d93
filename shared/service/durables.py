"""Every durable consumer of the platform, declared once.

Each service subscribes with, and the bootstrap ensures, the declaration here; the service
roles (rollout.shared.auth.services) grant exactly these objects. Renaming a durable or
changing its filter here changes all three together. Delivery settings that a deployment
tunes at start (AckWait, fetch size) are the defaults; the service applies its override with
`Consumer.tuned`.
"""

from __future__ import annotations

from faststream import AckPolicy

from rollout.shared import subjects
from rollout.shared.service.consumer import Consumer

_EVENTS = subjects.EVENTS_STREAM
_WORK = subjects.WORK_STREAM

# --- tracker ---------------------------------------------------------------------------

# Batches commit in milliseconds; a short AckWait lets a restarted tracker get a crashed
# predecessor's unacked events back quickly (later events wait for them: stream order).
# Unlimited deliveries: a read model must never skip an event because Postgres was down.
TRACKER_READ_MODELS = Consumer(
    _EVENTS,
    "tracker-read-models",
    subjects.ALL_EVENTS,
    title="tracker/read-models",
    description="Applies every event to the Postgres read models, in stream order.",
    ack_wait_s=5.0,
    max_deliver=-1,
    max_ack_pending=256,
    batch_size=128,
    pull_timeout_s=0.2,
    batch=True,
    ack_policy=AckPolicy.MANUAL,
)
# Unlimited deliveries: a fan-out the bus refused (the work queue or the log unavailable) is
# retried with backoff for as long as it takes (the dead-letter policy gives up on a transient
# failure only where deliveries are limited); given up on, its run would sit started with
# nothing queued until its deadline.
TRACKER_FANOUT = Consumer(
    _EVENTS,
    "tracker-fanout",
    subjects.event_filter("run", "run.requested"),
    title="runs/fan-out",
    batch_size=8,
    max_deliver=-1,
)

# --- actor -----------------------------------------------------------------------------

# The items of one fetch are handled concurrently (each acked on its own); the service sets
# the fetch size to its concurrency and the AckWait from its settings.
# Unlimited deliveries: the handler counts them (an item that kills every replica is recorded
# as errored past its limit, services/actor/redelivery.py) rather than JetStream dropping it.
ACTORS = Consumer(
    _WORK,
    "actors",
    subjects.work_filter("rollouts"),
    title="actor/generate",
    description="Generates a batch of rollouts and emits them as one rollout.generated event.",
    batch_size=4,
    max_deliver=-1,
)

# --- verifier --------------------------------------------------------------------------

VERIFIER = Consumer(
    _EVENTS,
    "verifier",
    subjects.event_filter("run", "rollout.generated"),
    title="verifier/score",
    description="Scores a generated batch with the environment's verifier.",
    ack_wait_s=60.0,
    batch_size=4,
    # Unlimited: the handler counts deliveries (a batch every replica dies on is recorded as
    # errored past the limit, rather than JetStream dropping it and its run never completing).
    max_deliver=-1,
)

# --- buffer ----------------------------------------------------------------------------

# A short AckWait: a delivered batch that never reached the handler (a pull request that
# expired with messages in flight) comes back in seconds, not half a minute. A batch being
# applied is kept alive with in-progress acks. Unlimited deliveries: the buffer must never
# skip an event because Postgres was down.
BUFFER = Consumer(
    _EVENTS,
    "buffer",
    subjects.ALL_EVENTS,
    title="buffer/ingest",
    description="Stores generated rollouts and their verdicts, in stream order, exactly once.",
    ack_wait_s=5.0,
    max_deliver=-1,
    max_ack_pending=256,
    batch_size=128,
    pull_timeout_s=1.0,
    batch=True,
    ack_policy=AckPolicy.MANUAL,
)

# --- learner ---------------------------------------------------------------------------

# Unlimited at the JetStream level: the learner counts deliveries itself, so a job whose
# replicas keep dying is dead-lettered with a reason, never dropped.
LEARNER_JOBS = Consumer(
    _WORK,
    "learner",
    subjects.work_filter("jobs"),
    title="learner/run-job",
    description="Runs one training job to its end (resuming from its last checkpoint).",
    ack_wait_s=60.0,
    max_deliver=-1,
    max_ack_pending=64,
)
# Only the dead letters the job consumer itself recorded: every service may record dead
# letters, but only under its own consumers' names, so no other credential can fail a job.
LEARNER_DEADLETTERS = Consumer(
    _EVENTS,
    "learner-deadletters",
    subjects.dead_letter(LEARNER_JOBS.name),
    title="learner/dead-lettered-jobs",
    description="Ends a job whose work item was dead-lettered with job.failed and the reason.",
    # A job.failed the bus refuses for a while is retried until it lands: given up on, the
    # job would never end.
    max_deliver=-1,
)

# --- read models -----------------------------------------------------------------------

# The projections that write Postgres read models, by the service that runs them: `rollout
# status` shows how far each is behind the events stream (a read model that cannot be written
# falls silently behind while every service still beats).
PROJECTIONS: dict[str, Consumer] = {"tracker": TRACKER_READ_MODELS, "buffer": BUFFER}
