"""The plugin host's RPC: one JSON object per line each way over the worker's stdin/stdout.

Request: ``{"id": n, "op": "load"|"reset"|"tools"|"step"|"state"|"close", ...}``.
Reply: ``{"id": n, "ok": true, "result": {...}}`` or
``{"id": n, "ok": false, "kind": "config"|"episode"|"tool", "error": "...", "type": "..."}``.

- ``load {entrypoint, sources, max_result_bytes, step_timeout_s}``: once per host; imports the
  plugin. ``step_timeout_s``: the worker stops a step still running then (a ``tool`` error).
- ``reset {options, task}`` -> ``{tools, cpu_s}``: a fresh env object for a new episode;
  with ``probe: true`` (validation) only the fresh env's tools, no episode.
- ``step {name, arguments}`` -> ``{output}``; ``state`` -> ``{state}``; ``close`` -> ``{cpu_s}``.
- Every episode call may carry ``ep`` (default 0): the episode's slot on a host that several
  episodes of one batch share.
- ``batch {calls: [{op, ep, ...}, ...]}`` -> ``{replies: [reply, ...]}``: the calls of one turn
  of several episodes in one message (one process switch for all); each reply is shaped as
  above (its ``id`` null), capped on its own, in order.

Kinds: ``config`` the env itself is broken (import, factory, protocol, tools()); ``episode``
this episode cannot go on (reset raised); ``tool`` the step raised or ran past its deadline
(the model sees it).
Replies over the size limit are replaced by a ``tool`` error saying so.
"""

from __future__ import annotations

import json
from typing import Any

OPS = ("load", "reset", "tools", "step", "state", "close", "batch")
KINDS = ("config", "episode", "tool")
# A reply line longer than the result limit plus this is not from an honest worker.
LINE_SLACK = 64 * 1024


# One encoder for every request (json.dumps with options builds a new one per call).
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def encode(rid: int, op: str, payload: dict[str, Any]) -> bytes:
    """One request line."""
    return _ENCODE({"id": rid, "op": op, **payload}).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """One reply (ValueError when it is not a reply object)."""
    reply = json.loads(line)
    if not isinstance(reply, dict) or not isinstance(reply.get("id"), int):
        raise ValueError("reply is not an object with an integer id")
    return reply
