"""JSON text Postgres jsonb accepts: it refuses the NUL character, which model output can hold."""

from __future__ import annotations

import json
import re

# An escaped NUL (\u0000) that is not itself part of an escaped backslash (\\u0000).
_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def jsonb_text(value: object) -> str:
    """Deterministic JSON for a jsonb column, with NUL characters dropped."""
    text = json.dumps(value, sort_keys=True)
    return _NUL.sub(r"\1", text) if "\\u0000" in text else text
