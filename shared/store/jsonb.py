"""JSON text Postgres jsonb accepts: it refuses the NUL character, which model output can hold."""

from __future__ import annotations

import re

from pydantic_core import to_json

# An escaped NUL (\u0000) that is not itself part of an escaped backslash (\\u0000).
_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def jsonb_text(value: object) -> str:
    """JSON for a jsonb column, with NUL characters dropped.

    Key order is left as it comes: jsonb keeps its own order, so equal values store equal.
    pydantic-core's encoder is several times faster than json.dumps on trajectories.
    """
    text = to_json(value).decode()
    return _NUL.sub(r"\1", text) if "\\u0000" in text else text
