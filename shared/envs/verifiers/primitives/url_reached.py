"""`url_reached`: the browser visited (or ended on) the URL."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Literal

import regex

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.compare import short
from rollout.shared.envs.verifiers.patterns import (
    BoundedPattern,
    PatternTooSlow,
    pattern_problem,
    search_any,
)
from rollout.shared.envs.verifiers.primitives.common import binary
from rollout.shared.envs.verifiers.registry import (
    Outcome,
    ScoreContext,
    register,
)


class UrlReachedParams(CamelModel):
    """`url_reached`: the browser visited (or ended on) a URL."""

    url: str | None = None
    mode: Literal["visited", "final"] = "visited"
    match: Literal["exact", "prefix", "regex"] = "exact"


def _check(p: UrlReachedParams) -> list[tuple[str, str]]:
    """A regex `url` must compile (a wrong one would fail every rollout)."""
    if p.match == "regex" and p.url:
        if (problem := pattern_problem(p.url)) is not None:
            return [("url", problem)]
    return []


@register(
    "url_reached",
    UrlReachedParams,
    templates=("browser",),
    check=_check,
    truth_fields={"url": "url"},
)
def url_reached(p: UrlReachedParams, ctx: ScoreContext) -> Outcome | Awaitable[Outcome]:
    """The browser visited (or ended on) the URL."""
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    url = p.url or gt.get("url")
    if not url:
        return binary(False, "no url to check (params.url or ground truth `url`)")
    state = ctx.state
    urls = [state.get("url")] if p.mode == "final" else list(state.get("history") or [])
    urls = [u for u in urls if isinstance(u, str)]

    where = "final page" if p.mode == "final" else "visited pages"
    if p.match == "regex":
        try:
            pattern = BoundedPattern(url)
        except regex.error as exc:
            return binary(False, f"bad regex {url!r}: {exc}")
        return _regex_outcome(pattern, urls, where)
    if p.match == "prefix":
        ok = any(u.startswith(url) for u in urls)
    else:
        ok = any(u.rstrip("/") == url.rstrip("/") for u in urls)
    return binary(ok, f"{url} {'in' if ok else 'not in'} {where} {short(urls, 100)}")


async def _regex_outcome(pattern: BoundedPattern, urls: list[str], where: str) -> Outcome:
    try:
        ok = await search_any(pattern, urls)
    except PatternTooSlow as exc:
        return binary(False, str(exc))
    return binary(ok, f"{pattern.pattern} {'in' if ok else 'not in'} {where} {short(urls, 100)}")
