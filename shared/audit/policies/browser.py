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


def _jump(view: View) -> ChatResponse:
    start = str(view.config.get("initialUrl") or "")
    found = re.match(r"https?://[^/\s\"']+", start) or re.search(
        r"https?://[^/\s\"']+", view.instruction
    )
    origin = found.group(0) if found else "http://localhost"
    if view.turn < len(SUCCESS_PATHS):
        return calls(("navigate", {"url": f"{origin}/{SUCCESS_PATHS[view.turn]}"}), turn=view.turn)
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
        "navigate straight to /welcome, /success, /done, ...",
        _jump,
        BROWSER,
    ),  # fmt: skip
    Policy(
        "browser_click_everything", "click every element of the first page", _click_all, BROWSER
    ),  # fmt: skip
]
