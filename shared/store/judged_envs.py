"""Which env versions judge nothing, read from the environments read model and kept per process.

The tracker's run replies (`noVerdict`) and the viewer's pages both ask it, so a run of a prompts
file without answers is decided where its env is, once per env version, and no client fetches
specs to find out (rollout.shared.envs.judged says what "judges nothing" is).
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from rollout.shared.envs.judged import judges_nothing

# Whether each env version (slug, version, spec hash) judges nothing: a registered version
# never changes, so its spec is read once per process, not on every reply or page.
_JUDGED: dict[tuple[str, int, str], bool] = {}
_JUDGED_MAX = 4096


async def envs_judging_nothing(
    conn: asyncpg.Connection, versions: set[tuple[str, int, str]]
) -> set[tuple[str, int, str]]:
    """Of these env versions (slug, version, hash), those whose verdicts measure nothing.

    Unknown ones in one query, where only `custom` envs' config and verifier are read (the
    template column filters out the rest before their spec is), never their tasks.
    """
    unknown = sorted(v for v in versions if v not in _JUDGED)
    if unknown:
        slugs, numbers, hashes = (list(c) for c in zip(*unknown, strict=True))
        rows = await conn.fetch(
            "select e.slug, e.version, e.spec_hash, e.template,"
            " case when e.template = 'custom' then e.spec -> 'config' end as config,"
            " case when e.template = 'custom' then e.spec -> 'verifier' end as verifier"
            " from environments e join unnest($1::text[], $2::int[], $3::text[])"
            " as v(slug, version, hash) on e.slug = v.slug and e.version = v.version"
            " and e.spec_hash = v.hash",
            slugs, numbers, hashes,
        )  # fmt: skip
        if len(_JUDGED) + len(rows) > _JUDGED_MAX:
            _JUDGED.clear()
        for r in rows:
            # A version not registered (yet, or its run imported) is asked again next time.
            spec = {"template": r["template"], "config": _decoded(r["config"]),
                    "verifier": _decoded(r["verifier"])}  # fmt: skip
            _JUDGED[(r["slug"], r["version"], r["spec_hash"])] = judges_nothing(spec)
    return {v for v in versions if _JUDGED.get(v)}


def _decoded(value: Any) -> Any:
    """A jsonb value as asyncpg gives it (text unless a codec is set), decoded."""
    return json.loads(value) if isinstance(value, str) else value
