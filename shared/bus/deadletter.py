"""Failed messages: retry with backoff, then a dead-letter event with the reason, then move on."""

from __future__ import annotations

import asyncio
import json
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

import nats.errors
import pydantic
from fast_depends.exceptions import ValidationError as DependsValidationError
from faststream import BaseMiddleware
from faststream.exceptions import HandlerException
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from rollout.shared import subjects
from rollout.shared.bus.attempts import DEFAULT_MAX_DELIVER, gave_up
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.contracts.envelope import (
    UNSUPPORTED_SCHEMA_VERSION,
    EventEnvelope,
    deterministic_id,
)
from rollout.shared.contracts.events import DeadLettered
from rollout.shared.contracts.requests import Reply
from rollout.shared.errors import RetrySignal, RolloutError
from rollout.shared.observability import get_logger

_PREVIEW_BYTES = 2048
# A hostile request may carry a megabyte in one field, and an exception may quote it: a reason,
# a reply's error and each of its problems keep this many characters (and say how many there
# were), and a reply lists problems up to this many characters in all (and counts the rest),
# so every reply fits the server's max payload and every log line stays small.
_REASON_CHARS = 1000
_PROBLEMS_CHARS = 50_000
# A logged traceback keeps this many characters of its start and of its end.
_TRACEBACK_CHARS = 8000
# Errors that no retry can fix: the message itself is malformed.
_POISON = (
    pydantic.ValidationError,
    DependsValidationError,
    json.JSONDecodeError,
    UnicodeDecodeError,
)
# Decoding errors that count as poison only when the message's own bytes fail to decode: the
# handler's work may decode other things (a reply, a file) whose failure a retry can fix.
_DECODING = (json.JSONDecodeError, UnicodeDecodeError)

log = get_logger(__name__)


def retry_delay(deliveries: int) -> float:
    """Backoff before the next attempt: 0.5 s, 1 s, 2 s ... capped at 30 s."""
    return min(30.0, 0.5 * 2 ** max(0, deliveries - 1))


def capped(text: str, limit: int = _REASON_CHARS) -> str:
    """`text`, or its first `limit` characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def _capped_problems(problems: list[str]) -> list[str]:
    shown: list[str] = []
    total = 0
    for i, problem in enumerate(problems):
        problem = capped(problem)
        total += len(problem)
        if total > _PROBLEMS_CHARS and shown:
            shown.append(f"... and {len(problems) - i} more")
            break
        shown.append(problem)
    return shown


def error_reply(exc: BaseException) -> Reply:
    """The reply a failed request gets: the user error's problems, or a one-line reason."""
    if isinstance(exc, RolloutError | RetrySignal):
        # A retry signal that outlived its retries reads as what it is, without its type.
        return Reply.failure(capped(exc.message), _capped_problems(exc.problems))
    if isinstance(exc, pydantic.ValidationError):
        problems = [
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'request'}: {e.get('msg')}"
            for e in exc.errors(include_url=False, include_input=False)
        ]
        return Reply.failure("invalid request", _capped_problems(problems))
    if isinstance(exc, subjects.SubjectError):
        # An id or a slug of the request that cannot be a subject token: the message names it.
        return Reply.failure(capped(str(exc)))
    return Reply.failure(describe(exc))


def is_refusal(exc: BaseException) -> bool:
    """True when a request failed on what it asked (a user error): no traceback to keep."""
    return isinstance(
        exc, RolloutError | RetrySignal | pydantic.ValidationError | subjects.SubjectError
    )


def format_traceback(exc: BaseException) -> str:
    """`exc`'s traceback as text, without locals, its middle cut when long.

    Logged as text rather than as `exc_info`: a renderer that shows each frame's locals (the
    default console renderer of an unconfigured structlog does) would spend seconds on a
    megabyte of hostile input held by a frame.
    """
    text = "".join(traceback.format_exception(exc))
    if len(text) <= 2 * _TRACEBACK_CHARS:
        return text
    cut = len(text) - 2 * _TRACEBACK_CHARS
    return f"{text[:_TRACEBACK_CHARS]}\n... ({cut} characters cut) ...\n{text[-_TRACEBACK_CHARS:]}"


# Failures of the bus or of a dependency that passes (NATS reconnecting, a stream with no
# leader, a refused publish, a retry asked for): the message itself is fine.
_TRANSIENT = (nats.errors.Error, OSError, TimeoutError, RetrySignal)


def is_transient(exc: BaseException) -> bool:
    """True when `exc` says the bus or a dependency is away for now (a later try may pass)."""
    return isinstance(exc, _TRANSIENT)


def is_poison(exc: BaseException, data: bytes) -> bool:
    """True when `exc` says the message itself is malformed (no retry can help)."""
    if not isinstance(exc, _POISON):
        return False
    if isinstance(exc, _DECODING):
        try:
            json.loads(data)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
            return True
        return False
    return True


def _is_event(subject: str) -> bool:
    try:
        subjects.parse_event_subject(subject)
    except subjects.SubjectError:
        return False
    return True


def describe(exc: BaseException) -> str:
    """A one-line reason for a failure."""
    if isinstance(exc, DependsValidationError) and isinstance(
        exc.original_error, pydantic.ValidationError
    ):
        exc = exc.original_error  # a typed handler argument: the model's own reason
    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors(include_url=False, include_input=False)[0]
        if first.get("type") == UNSUPPORTED_SCHEMA_VERSION:
            return str(first.get("msg"))
        where = ".".join(str(p) for p in first.get("loc", ())) or "message"
        return capped(
            f"invalid payload: {where}: {first.get('msg')} ({exc.error_count()} error(s))"
        )
    return capped(f"{type(exc).__name__}: {exc}")


def recorder_id(consumer: str) -> str:
    """The dead letter's aggregate id: the recording consumer (see subjects.dead_letter)."""
    try:
        return subjects.token(consumer, "consumer")
    except subjects.SubjectError:
        # No service durable is named so; such a name still gets a stable subject of its own.
        return f"unnamed-{deterministic_id('consumer', consumer)[:16]}"


async def record_dead_letter(js: JetStreamContext, msg: Msg, reason: str) -> EventEnvelope:
    """Append a dead-letter event for `msg` under its consumer's name (one per position)."""
    meta = msg.metadata
    payload = DeadLettered(
        consumer=meta.consumer or "",
        stream=meta.stream or "",
        stream_seq=meta.sequence.stream,
        subject=msg.subject,
        deliveries=meta.num_delivered,
        reason=reason,
        data_preview=msg.data[:_PREVIEW_BYTES].decode("utf-8", errors="replace"),
    )
    envelope = EventEnvelope.new(
        payload,
        aggregate_id=recorder_id(payload.consumer),
        # Per consumer too: two services giving up on one event record two dead letters.
        id_parts=(meta.stream, meta.sequence.stream, payload.consumer),
    )
    await EventPublisher(js).publish(envelope)
    return envelope


class DeadLetterPolicy:
    """Broker middleware factory: retries failed messages, dead-letters the hopeless ones."""

    def __init__(
        self,
        js_provider: Callable[[], JetStreamContext],
        *,
        max_deliver: int = DEFAULT_MAX_DELIVER,
    ) -> None:
        self._js_provider = js_provider
        self.max_deliver = max_deliver
        # Whether each consumer redelivers without limit: asked of JetStream once, and only
        # when a transient failure reaches `max_deliver`.
        self._unlimited: dict[tuple[str, str], bool] = {}

    async def unlimited(self, msg: Msg) -> bool:
        """Whether the message's consumer redelivers without limit (False when unknown: its
        own limit may be near, so the message is dead-lettered as usual)."""
        meta = msg.metadata
        key = (meta.stream, meta.consumer)
        if key not in self._unlimited:
            try:
                info = await self._js_provider().consumer_info(*key)
            except (nats.errors.Error, OSError, TimeoutError):
                return False
            self._unlimited[key] = info.config.max_deliver in (None, -1)
        return self._unlimited[key]

    def __call__(self, msg: Any, /, *, context: Any) -> _DeadLetterMiddleware:
        return _DeadLetterMiddleware(msg, context=context, policy=self)


class _DeadLetterMiddleware(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: Any, policy: DeadLetterPolicy) -> None:
        super().__init__(msg, context=context)
        self.policy = policy

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        if exc_val is None or isinstance(exc_val, HandlerException | asyncio.CancelledError):
            return False
        if not isinstance(self.msg, Msg) or not self.msg.reply:
            return False  # core NATS message without a reply: nothing to redeliver
        msg = self.msg
        if not msg.reply.startswith("$JS.ACK."):
            if _is_event(msg.subject):
                # An event seen by a core subscriber: its reply subject is the publisher's
                # wait for JetStream's ack, which an answer from us would stand in for.
                log.warning("event handler failed", subject=msg.subject, error=describe(exc_val))
                return True
            # A request: the caller gets the reason instead of a timeout.
            await msg.respond(error_reply(exc_val).model_dump_json().encode())
            # A refusal is its message; anything else is a bug: keep its traceback (as text:
            # see format_traceback).
            log.warning(
                "request failed",
                subject=msg.subject,
                error=describe(exc_val),
                **({} if is_refusal(exc_val) else {"exception": format_traceback(exc_val)}),
            )
            return True
        deliveries = msg.metadata.num_delivered
        poison = is_poison(exc_val, msg.data)
        # A transient failure never dead-letters a message its consumer may redeliver for as
        # long as it takes: a run's fan-out or a job's dead letter given up on after a few
        # seconds of a stream without a leader would strand the run or the job.
        give_up = poison or (
            deliveries >= self.policy.max_deliver
            and not (is_transient(exc_val) and await self.policy.unlimited(msg))
        )
        if give_up:
            reason = describe(exc_val)
            if not poison:
                reason = gave_up(deliveries, reason)
            await record_dead_letter(self.policy._js_provider(), msg, reason)
            await msg.term()
            log.error("message dead-lettered", subject=msg.subject, reason=reason)
        else:
            delay = retry_delay(deliveries)
            await msg.nak(delay=delay)
            log.warning(
                "handler failed; will retry",
                subject=msg.subject,
                attempt=deliveries,
                retry_in_s=delay,
                error=describe(exc_val),
            )
        # Handled here: the acknowledgement middleware sees the message already settled.
        return True
