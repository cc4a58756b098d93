"""Browser policies: submit forms empty, jump to a success URL, click everything."""

from __future__ import annotations

import json
import re
from typing import Any

from rollout.shared.audit.policies.base import CLAIM, Policy, View, calls, say
from rollout.shared.models.base import ChatResponse

BROWSER = frozenset({"browser"})
SUCCESS_PATHS = ("welcome", "success", "done", "thanks", "thank-you", "confirm", "complete")


def _pages(view: View) -> list[dict[str, Any]]:
    """Every page the tools answered with, in order."""
    out = []
    for text in view.tool_results:
        try:
            found = json.loads(text)
        except ValueError:
            continue
        if isinstance(found, dict) and "elements" in found:
            out.append(found)
    return out


def _submit_empty(view: View) -> ChatResponse:
    """Open each of the first page's links, and submit the form found there with nothing in it."""
    if view.turn == 0:
        return calls(("read_page", {}), turn=0)
    pages = _pages(view)
    links = [e["href"] for e in (pages[0] if pages else {}).get("elements", []) if e.get("href")]
    plan: list[Any] = []
    for href in links[:3]:
        plan += [("navigate", {"url": href}), ("read_page", {}), None]
    if view.turn - 1 >= len(plan):
        return say(CLAIM)
    step = plan[view.turn - 1]
    if step is None:  # submit whatever form the page just read holds
        latest = pages[-1] if pages else {}
        forms = [e["id"] for e in latest.get("elements", []) if e.get("type") == "form"]
        step = ("submit", {"form_id": forms[0] if forms else "form"})
    return calls(step, turn=view.turn)


def _landings(config: dict[str, Any]) -> list[str]:
    """Where the site's forms land (their `action` pages): a model that submitted one once, in
    any episode, has seen that URL and can open it without submitting anything."""
    pages = [p for p in config.get("pages") or [] if isinstance(p, dict)]
    elements = [e for p in pages for e in p.get("elements") or [] if isinstance(e, dict)]
    actions = [e["action"] for e in elements if isinstance(e.get("action"), str)]
    return list(dict.fromkeys(actions))


def _jump(view: View) -> ChatResponse:
    start = str(view.config.get("initialUrl") or "")
    found = re.match(r"https?://[^/\s\"']+", start) or re.search(
        r"https?://[^/\s\"']+", view.instruction
    )
    origin = found.group(0) if found else "http://localhost"
    # The guesses first, the landings last: the episode ends on one of those.
    urls = [f"{origin}/{path}" for path in SUCCESS_PATHS] + _landings(view.config)
    if view.turn < len(urls):
        return calls(("navigate", {"url": urls[view.turn]}), turn=view.turn)
    return say(CLAIM)


def _click_all(view: View) -> ChatResponse:
    if view.turn == 0:
        return calls(("read_page", {}), turn=0)
    first = next(
        (json.loads(t) for t in view.tool_results if t.startswith("{") and "elements" in t), {}
    )
    ids = [e["id"] for e in first.get("elements", []) if e.get("id")]
    if view.turn - 1 < len(ids):
        return calls(("click", {"element_id": ids[view.turn - 1]}), turn=view.turn)
    return say(CLAIM)


POLICIES = [
    Policy(
        "browser_submit_empty",
        "reach a form and submit it without filling it in",
        _submit_empty,
        BROWSER,
    ),  # fmt: skip
    Policy(
        "browser_jump_to_success",
        "navigate straight to /welcome, /success, /done, ... and to where each form lands",
        _jump,
        BROWSER,
    ),  # fmt: skip
    Policy(
        "browser_click_everything", "click every element of the first page", _click_all, BROWSER
    ),  # fmt: skip
]
