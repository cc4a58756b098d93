"""structlog, configured once per entry point; run/trace/span ids bound from the event in hand."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from rollout.shared.contracts.envelope import EventEnvelope

_configured = False


def configure_logging(service: str, *, level: str = "INFO", json: bool | None = None) -> None:
    """Configure structlog for this process: console on a TTY, JSON otherwise. Idempotent."""
    global _configured
    if _configured:
        return
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    _configured = True


def get_logger(name: str | None = None) -> Any:
    """A structlog logger; context ids come from the bound contextvars."""
    return structlog.get_logger(name)


@contextmanager
def event_context(envelope: EventEnvelope) -> Iterator[None]:
    """Bind the event's run/trace/span ids to every log line inside the block."""
    with structlog.contextvars.bound_contextvars(
        run_id=envelope.run_id,
        trace_id=envelope.trace_id,
        span_id=envelope.span_id,
        event_id=envelope.id,
        event_type=envelope.type,
    ):
        yield
