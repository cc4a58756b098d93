"""No key, no data: the login page for a missing, wrong or forged credential; a key logs in."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from ui_kit import serve
from waiting import wait_until

from rollout.services.ui.auth import COOKIE
from rollout.services.ui.server import PROXY_ENV
from rollout.shared.auth.keys import ApiKey
from rollout.shared.settings import Settings
from rollout.shared.stack.nats import NatsServer
from rollout.shared.store.db import create_pool, migrate

SECRET_NAME = "run-nobody-may-see"


@pytest.fixture
async def seeded(settings: Settings) -> AsyncIterator[str]:
    """The read models with one run in them (rows written as the tracker would)."""
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        now = datetime.now(UTC)
        await pool.execute(
            "insert into runs(run_id, name, env_slug, env_version, env_hash, model, n, sampling,"
            " max_tool_calls, policy_version, status, total, scored, passed, created_at)"
            " values ('r1', $1, 'refunds', 1, 'h', 'm', 1, '{}', 4, 0, 'completed', 2, 2, 1, $2)",
            SECRET_NAME,
            now,
        )
        yield "r1"
    finally:
        await pool.close()


async def test_missing_wrong_or_forged_credentials_get_the_login_page(
    settings: Settings, seeded: str, browser: Any, viewer_key: ApiKey, shoot: Any
) -> None:
    async with serve(settings) as ui:
        context = await browser.new_context()
        page = await context.new_page()

        # No cookie: any page sends the browser to the login form, with no data on it.
        await page.goto(f"{ui.url}/runs/{seeded}")
        assert page.url.startswith(f"{ui.url}/login")
        assert SECRET_NAME not in await page.content()
        await shoot(page, "login")

        # A key of the right shape the server does not know is refused by NATS itself.
        forged = ApiKey(role=viewer_key.role, key_id=viewer_key.key_id, secret="0" * 48)
        for bad, says in ((forged.text, "refused"), ("hello", "not a rollout API key")):
            await page.fill("#key", bad)
            await page.click("button[type=submit]")
            assert says in await page.inner_text("#login-error")
            assert SECRET_NAME not in await page.content()
            assert not [c for c in await context.cookies() if c["name"] == COOKIE]

        # A forged session cookie is no session.
        await context.add_cookies([{"name": COOKIE, "value": "e30.AAAA", "url": ui.url}])
        await page.goto(f"{ui.url}/")
        assert page.url.startswith(f"{ui.url}/login") and SECRET_NAME not in await page.content()

        # The live stream answers 401 without a session, before any data.
        async with httpx.AsyncClient(base_url=ui.url) as http:
            live = await http.get("/live", params={"topic": "runs"})
            assert live.status_code == 401 and SECRET_NAME not in live.text

        # The viewer key logs in; the cookie is HttpOnly and SameSite=Strict.
        await page.goto(f"{ui.url}/login?next=/runs/{seeded}")
        await page.fill("#key", viewer_key.text)
        await page.click("button[type=submit]")
        await page.wait_for_selector("#run-summary")
        assert SECRET_NAME in await page.inner_text("h1")
        cookie = next(c for c in await context.cookies() if c["name"] == COOKIE)
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        # The header's log-out button (a form post from this page) ends the session.
        await page.click("#logout")
        await page.wait_for_selector("#key")
        assert not [c for c in await context.cookies() if c["name"] == COOKIE]
        await page.goto(f"{ui.url}/runs/{seeded}")
        assert page.url.startswith(f"{ui.url}/login") and SECRET_NAME not in await page.content()

        # A one-time login link works once.
        link = await ui.login_link(viewer_key)
        fresh = await (await browser.new_context()).new_page()
        await fresh.goto(link)
        await fresh.wait_for_selector("table#runs")
        assert SECRET_NAME in await fresh.inner_text("#runs")
        again = await (await browser.new_context()).new_page()
        await again.goto(link)
        assert "already used" in await again.inner_text("#login-error")
        assert SECRET_NAME not in await again.content()


def _up_home_env(settings: Settings, nats_server: NatsServer, tmp_path: Path) -> dict[str, str]:
    """The environment of a shell on a home as `rollout up` leaves it: state.json, the service
    credentials, the local key."""
    home = tmp_path / "stack-home"
    home.mkdir()
    for name in ("credentials.json", "local_key.json"):
        shutil.copy(nats_server.home / name, home / name)
    state = {"nats": {"url": nats_server.url}, "postgres": {"url": settings.database_url}}
    (home / "state.json").write_text(json.dumps(state))
    return {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")} | {
        "ROLLOUT_HOME": str(home),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }


async def test_rollout_ui_prints_a_one_time_link_for_the_local_key(
    settings: Settings, seeded: str, nats_server: NatsServer, tmp_path: Path
) -> None:
    env = _up_home_env(settings, nats_server, tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rollout.cli", "ui", "--port", "0",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith("rollout ui: open http://127.0.0.1:"), line
        link = line.split("open ", 1)[1].strip()
        assert "/login?token=" in link
        async with httpx.AsyncClient() as http:
            first = await http.get(link)
            assert first.status_code == 200 and COOKIE in http.cookies
            runs = await http.get(link.split("/login")[0] + "/")
            assert runs.status_code == 200 and SECRET_NAME in runs.text
        async with httpx.AsyncClient() as other:
            second = await other.get(link)
            assert second.status_code == 401 and SECRET_NAME not in second.text
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


async def test_rollout_ui_behind_proxy_believes_the_named_proxy(
    settings: Settings, seeded: str, nats_server: NatsServer, tmp_path: Path
) -> None:
    env = _up_home_env(settings, nats_server, tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rollout.cli", "ui", "--port", "0", "--behind-proxy", "127.0.0.1",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        link = line.split("open ", 1)[1].strip()
        async with httpx.AsyncClient() as http:
            # The proxy (loopback here) says the browser came over https: a Secure cookie.
            tls = await http.get(link, headers={"x-forwarded-proto": "https"})
            assert tls.status_code == 200
            assert "secure" in tls.headers["set-cookie"].lower().split("; ")
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


async def test_a_taken_port_is_a_clear_error(settings: Settings, tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    env = {
        "ROLLOUT_HOME": str(tmp_path / "home"),
        "ROLLOUT_DATABASE_URL": settings.database_url,
        "ROLLOUT_NATS_URL": settings.nats_url,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PATH": "/usr/bin:/bin",
    }
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rollout.cli", "ui", "--port", str(port),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        holder.close()
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err.decode() and "Traceback" not in err.decode()


async def test_read_models_missing_is_a_page_that_says_so(
    settings: Settings, viewer_key: ApiKey
) -> None:
    # A database the tracker never migrated: the viewer says what is missing.
    async with serve(settings) as ui:
        cookie = await ui.session_cookie(viewer_key)
        async with httpx.AsyncClient(base_url=ui.url, cookies={COOKIE: cookie}) as http:
            page = await http.get("/")
    assert page.status_code == 503
    assert "read models" in page.text and "tracker" in page.text


def origin_of(http: httpx.AsyncClient) -> str:
    return f"{http.base_url.scheme}://{http.base_url.netloc.decode()}"


async def _log_in(http: httpx.AsyncClient, key: ApiKey, next_: str = "/") -> httpx.Response:
    """Post the login form as a browser on the viewer's own page does (its own Origin)."""
    return await http.post(
        "/login", data={"key": key.text, "next": next_}, headers={"origin": origin_of(http)}
    )


async def test_a_revoked_keys_session_ends_at_its_next_check(
    settings: Settings, seeded: str, nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout.services.ui import auth as ui_auth
    from rollout.shared.auth.keys import KeyStore, Role

    _, key = KeyStore(nats_server.home).create(Role.VIEWER, "soon revoked")
    nats_server.reload()
    async with serve(settings) as ui, httpx.AsyncClient(base_url=ui.url) as http:
        assert (await _log_in(http, key)).status_code == 200 and COOKIE in http.cookies
        monkeypatch.setattr(ui_auth, "RECHECK_S", 0.0)  # prove the key on every request
        assert SECRET_NAME in (await http.get(f"/runs/{seeded}")).text  # still accepted
        KeyStore(nats_server.home).revoke(key.key_id)
        nats_server.reload()
        page = await http.get(f"/runs/{seeded}")
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
        # The session is gone, not only this request: the cookie stays refused.
        assert (await http.get("/")).status_code == 303


async def test_a_logged_out_session_stays_logged_out(
    settings: Settings, seeded: str, viewer_key: ApiKey
) -> None:
    # The cookie was only deleted in the browser: a copy of it (a shared machine's profile,
    # a proxy log) still read every run for the rest of its 12 hours.
    async with serve(settings) as ui, httpx.AsyncClient(base_url=ui.url) as http:
        assert (await _log_in(http, viewer_key)).status_code == 200
        copy = http.cookies[COOKIE]
        assert SECRET_NAME in (await http.get(f"/runs/{seeded}")).text
        # Only a post from the viewer's own page logs out: a GET (an <img src=/logout> on
        # another port of this host, which is the same site and gets the cookie) or a post
        # from elsewhere leaves the session.
        assert (await http.get("/logout")).status_code == 405
        for headers in ({"origin": "http://127.0.0.1:1"}, {"sec-fetch-site": "same-site"}):
            refused = await http.post("/logout", headers=headers)
            assert refused.status_code == 403 and "another site" in refused.text
        assert SECRET_NAME in (await http.get(f"/runs/{seeded}")).text
        out = await http.post("/logout", headers={"origin": origin_of(http)})
        assert out.status_code == 303 and COOKIE not in http.cookies
        async with httpx.AsyncClient(base_url=ui.url, cookies={COOKIE: copy}) as replay:
            page = await replay.get(f"/runs/{seeded}")
            assert page.status_code == 303 and page.headers["location"].startswith("/login")


async def test_behind_https_the_session_cookie_is_secure(
    settings: Settings, viewer_key: ApiKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A TLS proxy on this host says https (X-Forwarded-Proto, believed from the proxy the
    # operator named): the cookie must not travel over plain http to the same host.
    monkeypatch.setenv(PROXY_ENV, "127.0.0.1")
    async with serve(settings) as ui, httpx.AsyncClient(base_url=ui.url) as http:
        host = http.base_url.netloc.decode()
        tls = await http.post(
            "/login", data={"key": viewer_key.text, "next": "/"},
            headers={"origin": f"https://{host}", "x-forwarded-proto": "https"},
        )  # fmt: skip
        assert tls.status_code == 200
        assert "secure" in tls.headers["set-cookie"].lower().split("; ")
        plain = await _log_in(http, viewer_key)  # loopback http: a Secure cookie would be lost
        assert plain.status_code == 200
        assert "secure" not in plain.headers["set-cookie"].lower().split("; ")


async def test_forwarded_headers_count_only_from_the_proxy_the_operator_named(
    settings: Settings, viewer_key: ApiKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    # uvicorn believed X-Forwarded-For from any loopback peer: a local process rotating it
    # was a new address at each try, and the login throttle never held it.
    monkeypatch.setenv("ROLLOUT_UI_LOGIN_FAILURES", "3")
    forged = ApiKey(role=viewer_key.role, key_id=viewer_key.key_id, secret="0" * 48)
    for proxy in (None, "10.9.9.9"):  # no proxy named; one named, elsewhere than this peer
        if proxy is None:
            monkeypatch.delenv(PROXY_ENV, raising=False)
        else:
            monkeypatch.setenv(PROXY_ENV, proxy)
        async with serve(settings) as ui, httpx.AsyncClient(base_url=ui.url) as http:
            codes = []
            for i in range(5):
                page = await http.post(
                    "/login", data={"key": forged.text, "next": "/"},
                    headers={"x-forwarded-for": f"203.0.113.{i + 1}"},
                )  # fmt: skip
                codes.append(page.status_code)
            assert codes == [401, 401, 401, 429, 429], (proxy, codes)
            assert list(ui.app.state.ui.auth.throttle._failures) == ["127.0.0.1"]
            # Nor is its word on the scheme believed: no Secure cookie, and an https page's
            # post that arrives as http is refused, saying what to set.
            host = http.base_url.netloc.decode()
            tls = await http.post(
                "/login", data={"key": viewer_key.text, "next": "/"},
                headers={"origin": f"https://{host}", "x-forwarded-proto": "https"},
            )  # fmt: skip
            assert tls.status_code == 403 and "--behind-proxy" in tls.text, tls.text
    # The proxy named: the address it forwards is the one throttled (each its own).
    monkeypatch.setenv(PROXY_ENV, "127.0.0.1")
    async with serve(settings) as ui, httpx.AsyncClient(base_url=ui.url) as http:
        for i in range(5):
            page = await http.post(
                "/login", data={"key": forged.text, "next": "/"},
                headers={"x-forwarded-for": f"203.0.113.{i + 1}"},
            )  # fmt: skip
            assert page.status_code == 401
        assert "127.0.0.1" not in ui.app.state.ui.auth.throttle._failures


async def test_one_key_follows_a_bounded_number_of_live_pages(
    settings: Settings, viewer_key: ApiKey, nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each stream holds a queue of up to 10,000 changes while its client does not read: one
    # key opening them without end grew the viewer's memory without end.
    from rollout.services.ui import app as ui_app
    from rollout.shared.auth.keys import KeyStore, Role

    monkeypatch.setattr(ui_app, "LIVE_PER_KEY", 3)
    _, other = KeyStore(nats_server.home).create(Role.VIEWER, "another viewer")
    nats_server.reload()
    async with serve(settings) as ui, contextlib.AsyncExitStack() as open_:
        cookie = await ui.session_cookie(viewer_key)
        http = await open_.enter_async_context(
            httpx.AsyncClient(base_url=ui.url, cookies={COOKIE: cookie}, timeout=30)
        )
        streams = []
        for _ in range(3):
            stream = await open_.enter_async_context(http.stream("GET", "/live?topic=runs"))
            assert stream.status_code == 200
            streams.append(stream)
        refused = await http.get("/live?topic=runs")
        assert refused.status_code == 429 and "already follows 3 live pages" in refused.text
        # Another key is not held to this one's count.
        cookies = {COOKIE: await ui.session_cookie(other)}
        async with httpx.AsyncClient(base_url=ui.url, cookies=cookies, timeout=30) as theirs:
            async with theirs.stream("GET", "/live?topic=runs") as stream:
                assert stream.status_code == 200
        # A closed page frees its place.
        await streams.pop().aclose()
        live_open = ui.app.state.ui.live_open
        await wait_until(lambda: live_open[viewer_key.user] == 2, "a closed stream's release")
        async with http.stream("GET", "/live?topic=runs") as stream:
            assert stream.status_code == 200


async def test_no_page_a_key_reads_is_kept_by_a_cache(
    settings: Settings, seeded: str, viewer_key: ApiKey
) -> None:
    # Without it, the back button after a logout (or a shared proxy) showed the run again.
    async with serve(settings) as ui, httpx.AsyncClient(base_url=ui.url) as http:
        hop = await _log_in(http, viewer_key)
        assert hop.headers["cache-control"] == "no-store"  # it sets the session cookie
        for path in ("/", f"/runs/{seeded}", "/runs/nope", "/rollouts/nope/provenance"):
            page = await http.get(path)
            assert page.headers["cache-control"] == "no-store", (path, page.status_code)
            assert "default-src 'self'" in page.headers["content-security-policy"]


async def test_a_session_survives_a_nats_it_cannot_reach(settings: Settings) -> None:
    # An outage is no revocation: the session stays (its key is proven once NATS is back).
    from dataclasses import replace

    from rollout.services.ui import auth as ui_auth
    from rollout.shared.auth.keys import Role

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    try:
        dead = replace(settings, nats_url=f"nats://127.0.0.1:{holder.getsockname()[1]}")
        auth = ui_auth.Authenticator(dead)
        key = ApiKey.generate(Role.VIEWER)
        viewer = auth.open_session(ui_auth.Viewer(key.user, "viewer"), key.text)
        auth._sessions[viewer.session].proven -= ui_auth.RECHECK_S + 1
        assert await auth.still_valid(viewer)
        assert not await auth.still_valid(ui_auth.Viewer("rk_viewer_x", "viewer", "forged"))
    finally:
        holder.close()


async def test_a_key_check_nats_never_finishes_ends_at_its_deadline(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server that takes the connection and never says a word: the check ends, as an outage.
    from dataclasses import replace

    from rollout.services.ui import auth as ui_auth
    from rollout.shared.auth.keys import Role
    from rollout.shared.settings import NatsUnreachable

    monkeypatch.setattr(ui_auth, "KEY_CHECK_S", 0.5)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # connections complete in the backlog; nothing is ever sent
    try:
        mute = replace(settings, nats_url=f"nats://127.0.0.1:{silent.getsockname()[1]}")
        auth = ui_auth.Authenticator(mute)
        # Its own deadline ends it, before the connect's 5 s limit ("cannot reach NATS").
        with pytest.raises(NatsUnreachable, match="did not finish checking the key"):
            await auth.check_key(ApiKey.generate(Role.VIEWER).text)
    finally:
        silent.close()


@pytest.mark.parametrize(
    "target",
    ["/\\evil.test/phish", "/\t/evil.test/phish", "//evil.test/phish", "https://evil.test/",
     "/\n/evil.test", "/\\/evil.test"],
)  # fmt: skip
async def test_login_next_never_leaves_the_site(
    settings: Settings, viewer_key: ApiKey, target: str
) -> None:
    async with serve(settings) as ui, httpx.AsyncClient(base_url=ui.url) as http:
        form = await http.get("/login", params={"next": target})
        assert 'name="next" value="/"' in form.text, form.text
        hop = await _log_in(http, viewer_key, target)
        assert hop.status_code == 200 and "evil.test" not in hop.text
        # A local path is kept.
        form = await http.get("/login", params={"next": "/runs/r1?after=3"})
        assert 'value="/runs/r1?after=3"' in form.text


async def test_a_login_posted_from_another_site_is_refused(
    settings: Settings, viewer_key: ApiKey
) -> None:
    # Login CSRF: a page elsewhere posts the attacker's own key to plant their session.
    async with serve(settings) as ui, httpx.AsyncClient(base_url=ui.url) as http:
        for headers in (
            {"origin": "http://localhost:8556"},
            {"origin": "null", "sec-fetch-site": "cross-site"},
            {"origin": "null", "sec-fetch-site": "same-site"},  # another port on this host
        ):
            page = await http.post(
                "/login", data={"key": viewer_key.text, "next": "/"}, headers=headers
            )
            assert page.status_code == 403 and "another site" in page.text
            assert COOKIE not in http.cookies


async def test_an_address_that_keeps_sending_refused_keys_must_wait(
    settings: Settings, viewer_key: ApiKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each login is a NATS connection: past the limit, refused keys are not even tried.
    monkeypatch.setenv("ROLLOUT_UI_LOGIN_FAILURES", "3")
    forged = ApiKey(role=viewer_key.role, key_id=viewer_key.key_id, secret="0" * 48)
    async with serve(settings) as ui, httpx.AsyncClient(base_url=ui.url) as http:
        for _ in range(3):
            page = await http.post("/login", data={"key": forged.text, "next": "/"})
            assert page.status_code == 401 and "refused" in page.text
        page = await http.post("/login", data={"key": forged.text, "next": "/"})
        assert page.status_code == 429 and "too many refused keys" in page.text
        assert 55 <= int(page.headers["retry-after"]) <= 60
        # Even the right key waits: the address, not the key, is throttled.
        page = await http.post("/login", data={"key": viewer_key.text, "next": "/"})
        assert page.status_code == 429 and COOKIE not in http.cookies
        # The window passes (moved here, rather than waited out): the right key logs in.
        throttle = ui.app.state.ui.auth.throttle
        for seen in throttle._failures.values():
            for i in range(len(seen)):
                seen[i] -= 61
        page = await http.post("/login", data={"key": viewer_key.text, "next": "/"})
        assert page.status_code == 200 and COOKIE in http.cookies
