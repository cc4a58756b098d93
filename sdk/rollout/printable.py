"""What the CLI prints is shown, never obeyed: control characters become visible escapes.

Run and model names, model errors, verifier reasons and trajectories come from other people
and from models; an escape sequence among them (a clear-screen, a window title, an OSC-8 link,
a bidi override) would act on the terminal of whoever runs `rollout show`. The streams are
wrapped once, at the CLI's entry point; the CLI's own progress lines redraw themselves through
`redraw`, on the raw stream.
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

# C0 controls but tab and newline, DEL, C1 controls, zero-width and bidi formatting marks,
# and the Unicode line and paragraph separators.
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2028\u2029\u2066-\u2069]"
)


def shown(text: str) -> str:
    """`text` with each control character written out (`\\u001b`, `\\u202e`)."""
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    # JSON's own escape: inside `--json` output (whose strings may hold C1 controls and line
    # separators, which JSON leaves raw) it stays valid JSON that decodes to the same text.
    return f"\\u{ord(match.group()):04x}"


class Printable:
    """A text stream that writes `shown(text)` to the stream it wraps."""

    def __init__(self, stream: TextIO) -> None:
        self.raw = stream

    def write(self, text: str) -> int:
        """Write `text`, its control characters escaped."""
        self.raw.write(shown(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        """Write each of `lines`."""
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def install() -> None:
    """Wrap stdout and stderr (once)."""
    if not isinstance(sys.stdout, Printable):
        sys.stdout = Printable(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, Printable):
        sys.stderr = Printable(sys.stderr)  # type: ignore[assignment]


def raw_stderr() -> TextIO:
    """stderr itself, for the CLI's own terminal control (its progress line)."""
    err = sys.stderr
    return err.raw if isinstance(err, Printable) else err  # type: ignore[return-value]


def redraw(line: str) -> None:
    """Write `line` over the current line of stderr (the CLI's progress bars)."""
    err = raw_stderr()
    err.write("\r" + shown(line))
    err.flush()
