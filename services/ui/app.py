"""The viewer's ASGI app: pages over the read models, a login, and server-sent live updates."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import asyncpg
import jinja2
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rollout.services.ui import events as ev_reads
from rollout.services.ui import plots, queries
from rollout.services.ui.auth import COOKIE, SESSION_S, Authenticator, SessionSigner, Viewer
from rollout.services.ui.live import Change, EventHub, drain
from rollout.shared import subjects
from rollout.shared.errors import RolloutError
from rollout.shared.jsondepth import bounded
from rollout.shared.models.weights_proof import proven
from rollout.shared.objectstore import ObjectStore, ObjectStoreError
from rollout.shared.objectstore.claimcheck import get_json
from rollout.shared.observability import get_logger
from rollout.shared.replay import replay_run, reverify
from rollout.shared.service import durables
from rollout.shared.settings import NatsUnreachable, Settings, connect_nats
from rollout.shared.stack.lag_probe import LagProbe
from rollout.shared.stale import stale_note
from rollout.shared.store.db import create_pool
from rollout.shared.store.trajectories import load_trajectory

log = get_logger(__name__)
HERE = Path(__file__).parent
KEEPALIVE_S = 15.0
# Live pages one key may follow at once (browser tabs; each is one server-sent-events stream).
LIVE_PER_KEY = 32
PUBLIC = ("/login", "/static/")
# Trajectories hold model-written text: nothing on a page may load or run code from elsewhere.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'"
    " 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Every page but the login form shows what a key may read: no browser or proxy keeps a
    # copy (for the back button after a logout, or for the next person on a shared cache).
    "Cache-Control": "no-store",
}


@dataclass
class UiState:
    """What the pages share: the database, the bus, the signer and the live hub."""

    settings: Settings
    store: ObjectStore | None = None
    signer: SessionSigner = field(default_factory=SessionSigner)
    auth: Authenticator | None = None
    pool: asyncpg.Pool | None = None
    js: Any = None
    hub: EventHub | None = None
    # One re-verification at a time: it scores a whole run in this process, so a viewer key
    # asking for many at once would hold the viewer for everyone.
    reverifying: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Live streams open per key's user: each holds a queue of up to 10,000 changes while its
    # client does not read, so one key must not open them without end.
    live_open: collections.Counter[str] = field(default_factory=collections.Counter)
    # The tracker's projection lag, read at most once a moment for all the pages.
    read_models: LagProbe = field(default_factory=lambda: LagProbe(durables.TRACKER_READ_MODELS))


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
    )
    env.filters["pct"] = lambda v: "–" if v is None else f"{100 * v:.1f}%"
    env.filters["num"] = _num
    # Cut at a depth: an indented dump recurses, and a value may come from anywhere.
    env.filters["tojson_pretty"] = lambda v: json.dumps(bounded(v), indent=1, default=str)
    env.filters["clip"] = _clip
    env.filters["short"] = lambda v, n=12: "" if v is None else str(v)[:n]
    env.filters["shade"] = _shade
    env.filters["adv_shade"] = _advantage_shade
    env.filters["signed"] = _signed
    env.globals["wilson_text"] = _wilson_text
    return env


# A page shows at most this much of one text (a message, a tool call's arguments or result,
# the final answer or state) and this many shaded tokens of one turn: a model that writes
# megabytes still gets a page a browser opens at once (8.7 MB of trajectory was a 19.7 MB page).
TEXT_SHOWN = 20_000
TOKENS_SHOWN = 2_000


def _clip(text: Any) -> str:
    """`text` up to TEXT_SHOWN characters, then how many more there are and where to read them."""
    text = str(text)
    if len(text) <= TEXT_SHOWN:
        return text
    left = len(text) - TEXT_SHOWN
    return f"{text[:TEXT_SHOWN]}\n… {left:,} more characters (all of it: rollout export --run RUN)"


def _num(value: Any, digits: int = 3) -> str:
    """A number to `digits` places; a dash for none (or for what is not a number)."""
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "–"


def _shade(logprob: float | None) -> str:
    """Background for a token: the less likely it was, the redder (none when unknown)."""
    # A NaN logprob from a model endpoint is stored as null: no shade, not a failed page.
    if not isinstance(logprob, int | float) or not math.isfinite(logprob):
        return "transparent"
    p = math.exp(min(0.0, logprob))
    return f"rgba(220, 40, 40, {0.85 * (1 - p):.2f})"


def _advantage_shade(advantage: float | None) -> str:
    """Background for a trained token: green pushed up, red pushed down, by how much."""
    if not isinstance(advantage, int | float):
        return "transparent"
    alpha = min(abs(float(advantage)) / 2.0, 1.0) * 0.8
    colour = "40, 160, 70" if advantage > 0 else "220, 40, 40"
    return f"rgba({colour}, {alpha:.2f})"


def _signed(value: float | None, digits: int = 3) -> str:
    return "–" if not isinstance(value, int | float) else f"{value:+.{digits}f}"


def _wilson_text(interval: tuple[float, float] | None) -> str:
    if interval is None:
        return ""
    return f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


TEMPLATES = _templates()


def render(name: str, request: Request, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A page from its template, with the viewer and the current path."""
    viewer: Viewer | None = request.scope.get("viewer")
    html = TEMPLATES.get_template(name).render(viewer=viewer, path=request.url.path, **context)
    return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)


def part(macro: str, *args: Any) -> str:
    """One macro of _parts.html rendered alone (a live update's fragment)."""
    return str(getattr(TEMPLATES.get_template("_parts.html").module, macro)(*args))


# Pages and task indexes are Postgres integers, stream positions 63-bit: a number past them
# (or below 0) would reach the database or the stream as an error, not a page.
INT_MAX = 2**31 - 1
SEQ_MAX = 2**63 - 1


def _int(request: Request, name: str, default: int | None = None, hi: int = INT_MAX) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HTTPException(400, f"query parameter {name!r} must be a whole number") from None
    if not 0 <= value <= hi:
        raise HTTPException(400, f"query parameter {name!r} must be from 0 to {hi}")
    return value


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    return value.strip() or None if value else None


def _state(request: Request) -> UiState:
    return request.app.state.ui


def _id(value: str, what: str) -> str:
    try:
        return subjects.token(value, what)
    except subjects.SubjectError as exc:
        raise HTTPException(400, str(exc)) from None


# --- auth -------------------------------------------------------------------------------------


class AuthMiddleware:
    """Every path but the login page and assets needs a valid session cookie."""

    def __init__(self, app: Any, state: UiState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].startswith(PUBLIC):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        viewer = self.state.signer.verify(request.cookies.get(COOKIE))
        auth = self.state.auth
        if viewer is not None and auth is not None and not await auth.still_valid(viewer):
            viewer = None  # its key was revoked (or this viewer restarted since)
        if viewer is None:
            if scope["path"] == "/live":
                response: Response = Response("log in first", status_code=401)
            else:
                target = scope["path"] + (f"?{scope['query_string'].decode()}"
                                          if scope.get("query_string") else "")  # fmt: skip
                response = RedirectResponse(f"/login?next={quote(target)}", status_code=303)
            await response(scope, receive, send)
            return
        scope["viewer"] = viewer
        await self.app(scope, receive, send)


def _safe_next(value: str | None) -> str:
    # Only local paths: a login link must not bounce the browser to another site. Browsers
    # read `\` as `/` and drop tabs and newlines, so `/\host` and `/<TAB>/host` are other sites.
    if not value or not value.startswith("/") or value[1:2] in ("/", "\\"):
        return "/"
    if "\\" in value or any(ch.isspace() or not ch.isprintable() for ch in value):
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return "/"
    return value


def _cross_site(request: Request) -> bool:
    """Whether a form was posted from another page than this viewer's own (a login CSRF: the
    attacker's key planted in the victim's browser)."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        # Same-site is not enough: another port on this host is the same site.
        return fetch_site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return False  # no browser (they send Origin with every POST)
    # (Our no-referrer policy makes Chromium send Origin "null"; it sends Sec-Fetch-Site too.)
    return origin != f"{request.url.scheme}://{request.url.netloc}"


def _unnamed_tls_proxy(request: Request) -> bool:
    """Whether the page was this viewer's own, over https, yet the request arrived as http: a
    TLS proxy whose forwarded headers the viewer was not told to believe."""
    origin = request.headers.get("origin")
    return request.url.scheme == "http" and origin == f"https://{request.url.netloc}"


def _logged_in(request: Request, viewer: Viewer, target: str) -> Response:
    # An HTML hop instead of a redirect: a SameSite=Strict cookie set while following a link
    # from elsewhere is then sent on the next, same-site navigation.
    html = TEMPLATES.get_template("hop.html").render(target=target)
    response = HTMLResponse(html, headers=SECURITY_HEADERS)
    # Served over https (behind the TLS proxy the operator named, whose X-Forwarded-Proto
    # uvicorn then believes): the cookie is Secure, so no plain-http request carries it.
    response.set_cookie(
        COOKIE, _state(request).signer.sign(viewer), max_age=SESSION_S, httponly=True,
        samesite="strict", secure=request.url.scheme == "https",
    )  # fmt: skip
    return response


async def login_page(request: Request) -> Response:
    """The login form; `?token=` (the link `rollout ui` prints) logs the local key in once."""
    state = _state(request)
    target = _safe_next(request.query_params.get("next"))
    token = request.query_params.get("token")
    if token and state.auth is not None:
        try:
            viewer = state.auth.redeem(token)
        except RolloutError as exc:
            return render("login.html", request, 401, error=str(exc), next=target)
        return _logged_in(request, viewer, target)
    return render("login.html", request, error=None, next=target)


async def login_submit(request: Request) -> Response:
    """Check the posted key against NATS; a session cookie when the server accepts it."""
    state = _state(request)
    form = parse_qs((await request.body()).decode(errors="replace"))
    key = (form.get("key") or [""])[0]
    target = _safe_next((form.get("next") or ["/"])[0])
    if _cross_site(request):
        error = "a login posted from another site is refused: open this viewer's /login"
        if _unnamed_tls_proxy(request):
            error = (
                "a login posted over https reached the viewer as plain http: name the TLS"
                " proxy in front (`rollout ui --behind-proxy ADDRESS` or ROLLOUT_UI_PROXY)"
            )
        return render("login.html", request, 403, error=error, next="/")
    if not key.strip():
        return render("login.html", request, 401, error="paste an API key", next=target)
    assert state.auth is not None
    throttle = state.auth.throttle
    address = request.client.host if request.client else "unknown"
    wait = throttle.wait_s(address)
    if wait > 0:
        log.info("ui login throttled", address=address)
        error = f"too many refused keys from this address: try again in {math.ceil(wait)} s"
        page = render("login.html", request, 429, error=error, next=target)
        page.headers["Retry-After"] = str(math.ceil(wait))
        return page
    try:
        async with throttle.checks:
            viewer = await state.auth.check_key(key)
    except NatsUnreachable as exc:  # the server's outage, not this address's doing
        return render("login.html", request, 503, error=_refusal(exc), next=target)
    except RolloutError as exc:
        throttle.failed(address)
        # The message names the key's user at most, never its secret.
        log.info("ui login refused", error=str(exc).split(":")[0])
        return render("login.html", request, 401, error=_refusal(exc), next=target)
    return _logged_in(request, state.auth.open_session(viewer, key), target)


def _refusal(exc: RolloutError) -> str:
    text = str(exc)
    if "refused" in text:
        return "the server refused this key (mistyped or revoked)"
    return text


async def logout(request: Request) -> Response:
    """End the session, here and in the browser (a post from this viewer's own pages only)."""
    if _cross_site(request):
        # A page on another port of this host is the same site: its <img src=/logout> or
        # form would carry the SameSite=Strict cookie and end the session.
        return render("error.html", request, 403, status=403,
                      detail="a logout posted from another site is refused")  # fmt: skip
    viewer: Viewer | None = request.scope.get("viewer")
    auth = _state(request).auth
    if viewer is not None and auth is not None:
        # Deleting the cookie alone left the session valid for 12 h to any copy of it.
        auth.close_session(viewer)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE)
    return response


# --- pages ------------------------------------------------------------------------------------


async def runs_page(request: Request) -> Response:
    """Runs: status, env and version, model, pass rate with its interval, live progress."""
    state = _state(request)
    filters = {k: _text(request, k) for k in ("env", "model", "status")}
    page = _int(request, "page", 1) or 1
    async with state.pool.acquire() as conn:
        data = await queries.list_runs(conn, page=page, **filters)
    stale = await _stale(state)
    return render("runs.html", request, page=page, filters=filters, stale=stale, **data)


async def run_page(request: Request) -> Response:
    """One run: per-task table, per-primitive pass rates, score histogram; live while running."""
    state = _state(request)
    run_id = _id(request.path_params["run_id"], "run id")
    page = _int(request, "page", 1) or 1
    task = _int(request, "task")
    async with state.pool.acquire() as conn:
        run = await queries.get_run(conn, run_id)
        if run is None:
            raise HTTPException(404, f"no run {run_id!r}")
        tasks = await queries.run_tasks(conn, run_id, page=page)
        prims = await queries.run_primitives(conn, run_id)
        hist = await queries.score_histogram(conn, run_id)
        samples = await queries.task_samples(conn, run_id, task) if task is not None else None
    return render(
        "run.html", request, run=run, page=page, prims=prims, task=task, samples=samples,
        hist=_hist_svg(hist), stale=await _stale(state), **tasks,
    )  # fmt: skip


async def _stale(state: UiState) -> str | None:
    """The banner saying the read models are stalled behind, or None (caught up, advancing,
    or not known: NATS did not say in time)."""
    if state.js is None:
        return None
    return stale_note(await state.read_models.report(state.js))


def _hist_svg(counts: list[int]) -> str:
    return plots.histogram(counts, lo=0.0, hi=1.0, title="score histogram")


async def trajectory_page(request: Request) -> Response:
    """One rollout: every turn, tool calls, verifier breakdown, provenance, token logprobs."""
    state = _state(request)
    rollout_id = _id(request.path_params["rollout_id"], "rollout id")
    async with state.pool.acquire() as conn:
        rollout = await queries.get_rollout(conn, rollout_id)
        trained = await queries.trained_on(conn, rollout_id) if rollout is not None else []
        digests = (
            await queries.policy_weights(conn, rollout["model"], rollout["policy_version"])
            if rollout is not None
            else {}
        )
    if rollout is None:
        raise HTTPException(404, f"no rollout {rollout_id!r}")
    rollout["trajectory"] = await _trajectory(state, rollout)
    signals = await _signals(state, rollout_id, trained[0]) if trained else None
    return render(
        "trajectory.html", request, r=rollout, trained=trained,
        turns=_turns(rollout["trajectory"], signals),
        weights=weights_shown(rollout["trajectory"], rollout["policy_version"], digests),
    )  # fmt: skip


def weights_shown(
    trajectory: dict[str, Any] | None, claimed: int, digests: dict[int, str]
) -> dict[str, Any] | None:
    """What the page says of the weights that generated a rollout (None: nothing to say).

    `ok` is the learner's own rule (weights_proof.proven): True when the rollout's digest is
    its claimed version's or a newer one's, False when not (the learner does not train on
    it), None when the claimed version has no digest to hold it to."""
    digest = (trajectory or {}).get("weights_sha256")
    expected = digests.get(claimed)
    if not digest and not expected:
        return None
    ok = proven(digest, claimed, digests)
    newer = bool(ok) and digest != expected
    return {"digest": digest, "expected": expected, "ok": ok, "newer": newer}


async def _signals(
    state: UiState, rollout_id: str, trained: dict[str, Any]
) -> dict[str, Any] | None:
    """Per turn, what each token of the rollout got in the step that trained on it."""
    if state.store is None:
        return None
    try:
        doc = await get_json(state.store, trained["signals_uri"], sha256=trained["signals_sha256"])
    except (ObjectStoreError, OSError) as exc:
        log.warning("token signals unreadable", rollout_id=rollout_id, error=str(exc))
        return None
    found = (doc.get("rollouts") or {}).get(rollout_id) if isinstance(doc, dict) else None
    return found if isinstance(found, dict) else None


async def _trajectory(state: UiState, rollout: dict[str, Any]) -> dict[str, Any] | None:
    if rollout["trajectory"] is not None or not rollout["trajectory_uri"]:
        return rollout["trajectory"]
    if state.store is None:
        return None
    return await load_trajectory(
        state.store, None, rollout["trajectory_uri"], rollout["trajectory_sha256"]
    )


def _turns(
    trajectory: dict[str, Any] | None, signals: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Messages with each assistant turn's tool calls and token logprobs attached, and, for a
    rollout that was trained on, each token's advantage, ratio, gap and clip (`signals`)."""
    if not trajectory:
        return []
    calls = {c.get("index"): c for c in trajectory.get("tool_calls") or []}
    logprobs = trajectory.get("logprobs") or []
    token_ids = trajectory.get("token_ids") or []
    turns, assistant, call_index = [], 0, 0
    for message in trajectory.get("messages") or []:
        turn = {"message": message, "calls": [], "tokens": None}
        if message.get("role") == "assistant":
            for _ in message.get("tool_calls") or []:
                if call_index in calls:
                    turn["calls"].append(calls[call_index])
                call_index += 1
            if assistant < len(logprobs) and logprobs[assistant]:
                ids = token_ids[assistant] if assistant < len(token_ids) else None
                turn["tokens"] = [
                    {"id": ids[i] if ids and i < len(ids) else None, "logprob": lp}
                    for i, lp in enumerate(logprobs[assistant][:TOKENS_SHOWN])
                ]
                turn["tokens_left"] = max(0, len(logprobs[assistant]) - TOKENS_SHOWN)
            trained = _trained_tokens(
                (signals or {}).get(str(assistant)),
                token_ids[assistant] if assistant < len(token_ids) else None,
            )
            turn["trained"] = trained[:TOKENS_SHOWN] if trained else trained
            turn["trained_left"] = max(0, len(trained or []) - TOKENS_SHOWN)
            assistant += 1
        turns.append(turn)
    # Calls the messages do not mention (a template that records calls only) still show.
    shown = {id(c) for t in turns for c in t["calls"]}
    extra = [c for c in calls.values() if id(c) not in shown]
    if extra:
        turns.append({"message": {"role": "tools"}, "calls": extra, "tokens": None})
    return turns


def _trained_tokens(turn: Any, ids: list[int] | None) -> list[dict[str, Any]] | None:
    """One entry per trained token of a turn: id, advantage, ratio, gap, clipped."""
    if not isinstance(turn, dict):
        return None
    advantage = turn.get("advantage") or []
    n = len(advantage)
    columns = {k: list(turn.get(k) or [None] * n)[:n] for k in ("ratio", "gap", "clipped")}
    return [
        {
            "id": ids[i] if ids and i < len(ids) else None,
            "advantage": advantage[i],
            "ratio": columns["ratio"][i] if i < len(columns["ratio"]) else None,
            "gap": columns["gap"][i] if i < len(columns["gap"]) else None,
            "clipped": bool(columns["clipped"][i]) if i < len(columns["clipped"]) else False,
        }
        for i in range(n)
    ]


async def provenance_part(request: Request) -> Response:
    """The provenance the generated event alone holds (actor, delivery attempt), as a fragment."""
    state = _state(request)
    rollout_id = _id(request.path_params["rollout_id"], "rollout id")
    async with state.pool.acquire() as conn:
        run_id = await conn.fetchval(
            "select run_id from rollouts where rollout_id = $1", rollout_id
        )
    if run_id is None:
        raise HTTPException(404, f"no rollout {rollout_id!r}")
    found = await ev_reads.provenance(state.js, run_id, rollout_id)
    return HTMLResponse(part("provenance", found), headers=SECURITY_HEADERS)


async def compare_page(request: Request) -> Response:
    """Two runs: per-task deltas, flipped tasks, one task's trajectories side by side."""
    state = _state(request)
    a, b = _text(request, "a"), _text(request, "b")
    page = _int(request, "page", 1) or 1
    task = _int(request, "task")
    async with state.pool.acquire() as conn:
        recent = (await queries.list_runs(conn))["runs"]
        if not a or not b:
            return render("compare.html", request, recent=recent, a=a, b=b, ready=False)
        run_a = await queries.get_run(conn, _id(a, "run id"))
        run_b = await queries.get_run(conn, _id(b, "run id"))
        for rid, run in ((a, run_a), (b, run_b)):
            if run is None:
                raise HTTPException(404, f"no run {rid!r}")
        data = await queries.compare_tasks(conn, a, b, page=page)
        side = None
        if task is not None:
            side = [await queries.first_sample(conn, rid, task) for rid in (a, b)]
    warnings = []
    if (run_a["env_slug"], run_a["env_version"]) != (run_b["env_slug"], run_b["env_version"]):
        warnings.append(
            f"different environments: {run_a['env_slug']} v{run_a['env_version']} vs"
            f" {run_b['env_slug']} v{run_b['env_version']}"
        )
    elif run_a["env_hash"] != run_b["env_hash"]:
        warnings.append("same env version but different env hashes")
    for label, run, side_key in (("A", run_a, "a"), ("B", run_b, "b")):
        if run["no_verdict"]:
            # Its verdicts measured nothing: no rates of it to compare, nor flips to see.
            warnings.append(f"run {label}: {run['no_verdict']}")
            _no_rates(data, side_key)
    sets = data["sets"]
    if not (sets["a_tasks"] == sets["b_tasks"] == sets["common"]):
        warnings.append(
            f"task sets differ: {sets['a_tasks']} tasks vs {sets['b_tasks']},"
            f" {sets['common']} in common"
        )
    if side:
        for rollout in side:
            if rollout is not None:
                rollout["trajectory"] = await _trajectory(state, rollout)
                rollout["turns"] = _turns(rollout["trajectory"])
    return render(
        "compare.html", request, recent=recent, a=a, b=b, ready=True, run_a=run_a, run_b=run_b,
        warnings=warnings, page=page, task=task, side=side, stale=await _stale(state), **data,
    )  # fmt: skip


def _no_rates(data: dict[str, Any], side: str) -> None:
    """Drop one side's per-task rates (and so the deltas and flips) from `compare_tasks`."""
    for task in data["tasks"]:
        task.update({f"{side}_rate": None, f"{side}_s": None, "delta": None, "flipped": False})
    data["flipped"] = []


async def jobs_page(request: Request) -> Response:
    """Training jobs."""
    state = _state(request)
    page = _int(request, "page", 1) or 1
    async with state.pool.acquire() as conn:
        data = await queries.list_jobs(conn, page=page)
    return render("jobs.html", request, page=page, **data)


async def env_page(request: Request) -> Response:
    """One env: its newest version and its last audit (which tasks, policies, primitives)."""
    state = _state(request)
    slug = _id(request.path_params["slug"], "environment slug")
    async with state.pool.acquire() as conn:
        env = await queries.get_env(conn, slug)
    if env is None:
        raise HTTPException(404, f"no environment {slug!r}")
    return render("env.html", request, env=env)


async def job_page(request: Request) -> Response:
    """One job: loss, reward, KL, tokens/s per step; checkpoints, policy versions, their runs."""
    state = _state(request)
    job_id = _id(request.path_params["job_id"], "job id")
    async with state.pool.acquire() as conn:
        job = await queries.get_job(conn, job_id)
    if job is None:
        raise HTTPException(404, f"no training job {job_id!r}")
    return render("job.html", request, job=job, plots=await _job_plots(state, job_id))


async def _job_plots(state: UiState, job_id: str) -> dict[str, Any]:
    curves = await ev_reads.job_curves(state.js, job_id)
    titles = {"loss": "loss", "reward": "reward", "kl": "KL", "tokens_per_s": "tokens/s"}
    series = curves["series"]
    # An online job's off-policy signals, plotted only when its steps reported them.
    online = {
        "off_policy.mismatch_kl": "actor-vs-learner KL (mismatch)",
        "off_policy.clip_fraction": "clip fraction",
        "off_policy.dynamic_sampling_dropped": "flat groups dropped",
        "off_policy.staleness": "staleness (versions)",
    }
    if any(series.get(k) for k in online):
        titles |= online
    return {
        "svgs": [plots.line_plot(series.get(k, []), title=t) for k, t in titles.items()],
        "metrics": curves["metrics"],
    }


async def replay_page(request: Request) -> Response:
    """A run's events in order; with `reverify`, what today's verifier changed, as a diff."""
    state = _state(request)
    run_id = _id(request.path_params["run_id"], "run id")
    after = _int(request, "after", 0, hi=SEQ_MAX) or 0
    async with state.pool.acquire() as conn:
        run = await queries.get_run(conn, run_id)
    if run is None:
        raise HTTPException(404, f"no run {run_id!r}")
    page = await ev_reads.run_events(state.js, run_id, after=after)
    diff = None
    if request.query_params.get("reverify"):
        if state.reverifying.locked():
            diff = {"error": "another re-verification is running in this viewer: try again soon"}
        else:
            async with state.reverifying:
                diff = await _reverified(state, run_id)
    return render("replay.html", request, run=run, after=after, diff=diff, **page)


async def _reverified(state: UiState, run_id: str) -> dict[str, Any]:
    try:
        replayed = await replay_run(state.js, run_id)
        version, rows = await reverify(state.js, replayed, store=state.store)
    except RolloutError as exc:
        return {"error": str(exc)}
    changed = [r for r in rows if r["changed"]]
    return {"version": version, "checked": len(rows), "changed": changed}


# --- live -------------------------------------------------------------------------------------

# The event that adds a run to the runs list (the last token of its subject).
NEW_RUN_EVENT = subjects.event_name("run.requested")


def _topics(request: Request) -> set[str]:
    topic = request.query_params.get("topic") or ""
    kind, _, ident = topic.partition(":")
    if kind == "runs" and not ident:
        return {"run"}
    if kind in ("run", "job") and ident:
        return {f"{kind}:{_id(ident, f'{kind} id')}"}
    raise HTTPException(400, "topic must be runs, run:<id> or job:<id>")


async def _fragments(state: UiState, request: Request, changes: list[Change]) -> dict[str, str]:
    """The page fragments these changes touch, rendered from the read models."""
    topic = request.query_params.get("topic") or ""
    out: dict[str, str] = {}
    if topic.startswith("run:"):
        # Read before a connection is taken: a slow NATS must not hold one of the pool's.
        out["read-models-stale"] = part("stale_banner", await _stale(state))
    async with state.pool.acquire() as conn:
        if topic == "runs":
            if any(c.aggregate == "run" and c.name == NEW_RUN_EVENT for c in changes):
                # A new run: the page's whole list (its filters and page) is read again, so it
                # appears in its place without a reload.
                filters = {k: _text(request, k) for k in ("env", "model", "status")}
                page = _int(request, "page", 1) or 1
                data = await queries.list_runs(conn, page=page, **filters)
                out["runs-body"] = part("runs_body", data["runs"], filters)
            else:
                for run_id in dict.fromkeys(
                    c.aggregate_id for c in changes if c.aggregate == "run"
                ):
                    run = await queries.get_run(conn, run_id)
                    if run is not None:
                        out[f"run-{run_id}"] = part("run_cells", run)
        elif topic.startswith("run:"):
            run_id = topic[4:]
            run = await queries.get_run(conn, run_id)
            if run is not None:
                page = _int(request, "page", 1) or 1
                tasks = await queries.run_tasks(conn, run_id, page=page)
                out["run-summary"] = part("run_summary", run)
                out["run-tasks"] = part("task_rows", run, tasks["tasks"])
                out["run-prims"] = part("prim_rows", await queries.run_primitives(conn, run_id))
                out["run-hist"] = _hist_svg(await queries.score_histogram(conn, run_id))
        elif topic.startswith("job:"):
            job = await queries.get_job(conn, topic[4:])
            if job is not None:
                out["job-summary"] = part("job_summary", job)
    if topic.startswith("job:") and out:
        out["job-plots"] = part("job_plots", await _job_plots(state, topic[4:]))
    return out


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def live(request: Request) -> Response:
    """Server-sent events: page fragments re-rendered whenever the events stream moves."""
    state = _state(request)
    topics = _topics(request)
    _int(request, "page", 1)  # read again inside the stream, where a 400 could not be sent
    assert state.hub is not None
    hub = state.hub
    user = request.scope["viewer"].user
    if state.live_open[user] >= LIVE_PER_KEY:
        return Response(
            f"this key already follows {LIVE_PER_KEY} live pages: close some and reload",
            status_code=429,
            headers={"Cache-Control": "no-store"},
        )
    state.live_open[user] += 1
    released = False

    def release() -> None:
        # Once, from whichever runs first: the stream's end, or the response's (a client
        # gone before the stream started never runs the stream's own finally).
        nonlocal released
        if not released:
            released = True
            state.live_open[user] -= 1
            if state.live_open[user] <= 0:
                del state.live_open[user]

    async def stream() -> AsyncIterator[bytes]:
        try:
            with hub.subscribe(topics) as queue:
                yield _sse("ready", {"topics": sorted(topics)})
                while True:
                    try:
                        first = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                    except TimeoutError:
                        yield b": keepalive\n\n"
                        continue
                    if first is None:
                        return
                    changes = await drain(queue, first)
                    if changes is None:
                        return
                    seq = max(c.seq for c in changes)
                    await hub.caught_up(seq)
                    html = await _fragments(state, request, changes)
                    if html:
                        yield _sse("update", {"html": html, "seq": seq})
        finally:
            release()

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers=headers,
        background=BackgroundTask(release),
    )


async def not_found(request: Request, exc: Exception) -> Response:
    """Errors as a page that says what went wrong."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return render("error.html", request, status, status=status, detail=detail)


async def no_read_models(request: Request, exc: Exception) -> Response:
    """The tracker has not created its tables in this database yet."""
    detail = (
        "the tracker's read models are not in this database yet: start the tracker"
        " (`rollout up`, or `rollout serve tracker`) against it, or point ROLLOUT_DATABASE_URL"
        " at the right one"
    )
    return render("error.html", request, 503, status=503, detail=detail)


# --- the app ----------------------------------------------------------------------------------

# How long a shutdown waits on each part it stops (the follower, the database pool): a part
# that does not stop must not keep the viewer (or a test that serves it) from ending.
SHUTDOWN_WAIT_S = 10.0


async def _stop_follower(follower: asyncio.Task[None]) -> None:
    """Cancel the events follower and wait for it to end, at most SHUTDOWN_WAIT_S."""
    follower.cancel()
    done, _ = await asyncio.wait({follower}, timeout=SHUTDOWN_WAIT_S)
    if not done:
        log.warning("the live follower did not stop; shutting down without it")
    elif not follower.cancelled() and follower.exception() is not None:
        log.warning("the live follower failed", error=repr(follower.exception()))


def create_app(
    settings: Settings, *, store: ObjectStore | None = None, signer: SessionSigner | None = None
) -> Starlette:
    """The viewer for `settings` (its NATS and database); start it with any ASGI server."""
    state = UiState(settings=settings, store=store, signer=signer or SessionSigner())
    state.auth = Authenticator(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if not settings.database_url:
            raise RolloutError(
                "the viewer needs the tracker's database",
                problems=["start the stack with `rollout up`, or set ROLLOUT_DATABASE_URL"],
            )
        state.pool = await create_pool(settings.database_url, min_size=1, max_size=8)
        nc = await connect_nats(settings)
        state.js = nc.jetstream()
        state.hub = EventHub(state.js, state.pool)
        follower = asyncio.create_task(state.hub.follow(), name="ui-events")
        try:
            yield
        finally:
            await _stop_follower(follower)
            await nc.close()
            try:
                # Waits for connections still lent out; past the limit they are cut.
                await asyncio.wait_for(state.pool.close(), SHUTDOWN_WAIT_S)
            except TimeoutError:
                state.pool.terminate()

    routes = [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login_submit, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", runs_page),
        Route("/runs/{run_id}", run_page),
        Route("/runs/{run_id}/replay", replay_page),
        Route("/rollouts/{rollout_id}", trajectory_page),
        Route("/rollouts/{rollout_id}/provenance", provenance_part),
        Route("/compare", compare_page),
        Route("/jobs", jobs_page),
        Route("/jobs/{job_id}", job_page),
        Route("/envs/{slug}", env_page),
        Route("/live", live),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            HTTPException: not_found,
            asyncpg.exceptions.UndefinedTableError: no_read_models,
        },
    )
    app.state.ui = state
    app.add_middleware(AuthMiddleware, state=state)
    return app
