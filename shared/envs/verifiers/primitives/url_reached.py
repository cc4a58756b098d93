"""`url_reached`: the browser visited (or ended on) the URL."""

from __future__ import annotations

import re
from typing import Literal

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.compare import short
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


@register("url_reached", UrlReachedParams, templates=("browser",))
def url_reached(p: UrlReachedParams, ctx: ScoreContext) -> Outcome:
    """The browser visited (or ended on) the URL."""
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    url = p.url or gt.get("url")
    if not url:
        return binary(False, "no url to check (params.url or ground truth `url`)")
    state = ctx.state
    urls = [state.get("url")] if p.mode == "final" else list(state.get("history") or [])
    urls = [u for u in urls if isinstance(u, str)]

    def hit(u: str) -> bool:
        if p.match == "prefix":
            return u.startswith(url)
        if p.match == "regex":
            return re.search(url, u) is not None
        return u.rstrip("/") == url.rstrip("/")

    ok = any(hit(u) for u in urls)
    where = "final page" if p.mode == "final" else "visited pages"
    return binary(ok, f"{url} {'in' if ok else 'not in'} {where} {short(urls, 100)}")
