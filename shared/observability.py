"""structlog, configured once per entry point; run/trace/span ids bound from the event in hand."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from rollout.shared.contracts.envelope import EventEnvelope

_configured = False


class _StderrLogger(structlog.PrintLogger):
    """Writes to whatever sys.stderr is now (pytest swaps it between tests)."""

    def __init__(self) -> None:
        super().__init__(file=sys.stderr)

    def msg(self, message: str) -> None:
        """Write one line; a line that cannot be written (a full disk) is lost, never raised."""
        # As the standard library's handlers do: logging must not fail the code that logs.
        with suppress(OSError, ValueError):
            print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg


def configure_logging(
    service: str, *, level: str | None = None, json: bool | None = None, force: bool = False
) -> None:
    """Configure structlog for this process: console on a TTY, JSON otherwise.

    Once per entry point: later calls are no-ops unless `force` (a verb that becomes a
    long-running service reconfigures). Level: `level`, else ROLLOUT_LOG_LEVEL, else INFO.
    """
    global _configured
    if _configured and not force:
        return
    level = level or os.environ.get("ROLLOUT_LOG_LEVEL") or "INFO"
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
        logger_factory=lambda *args: _StderrLogger(),
        cache_logger_on_first_use=False,
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
