"""Who may look: a key is proven by connecting to NATS with it; a signed cookie remembers it.

The viewer keeps each session's key in its own memory and proves it again at most every
RECHECK_S seconds a session is used, so a revoked key's session ends within that time
(`rollout keys revoke` says "at once"; the cookie alone would have lasted SESSION_S).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass, field, replace

from rollout.shared.auth.identity import server_identity
from rollout.shared.auth.keys import ApiKey
from rollout.shared.errors import RolloutError
from rollout.shared.settings import NatsUnreachable, Settings, connect_nats

COOKIE = "rollout_ui"
SESSION_S = 12 * 3600
# How long a proven key stays proven before a request proves it again.
RECHECK_S = 30.0
# Failed logins one address may make in LOGIN_WINDOW_S before it must wait; each login opens
# a NATS connection, so the form must not become a way to hammer the server (or guess keys).
LOGIN_FAILURES_ENV = "ROLLOUT_UI_LOGIN_FAILURES"
DEFAULT_LOGIN_FAILURES = 10
LOGIN_WINDOW_S = 60.0
# The longest one key check may take (connect, identity request, close), all told.
KEY_CHECK_S = 20.0
# Keys checked against NATS at once; more logins wait their turn.
LOGINS_AT_ONCE = 4
# Addresses remembered at most (the oldest are forgotten first).
MAX_ADDRESSES = 10_000
# Sessions one key holds at once (the oldest end first): each login with a valid key is
# remembered for SESSION_S, so logging in over and over must not grow the viewer without end.
SESSIONS_PER_KEY = 64


def login_failures_allowed() -> int:
    """ROLLOUT_UI_LOGIN_FAILURES (default 10; 0: no limit), or a clear error."""
    raw = os.environ.get(LOGIN_FAILURES_ENV, "").strip()
    if not raw:
        return DEFAULT_LOGIN_FAILURES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise RolloutError(f"{LOGIN_FAILURES_ENV}={raw!r}: expected a whole number >= 0")
    return value


@dataclass
class LoginThrottle:
    """Failed logins per client address over a sliding window, and key checks at once."""

    limit: int = DEFAULT_LOGIN_FAILURES
    window_s: float = LOGIN_WINDOW_S
    _failures: dict[str, collections.deque[float]] = field(default_factory=dict)
    checks: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(LOGINS_AT_ONCE))

    def wait_s(self, address: str, now: float | None = None) -> float:
        """Seconds `address` must wait before its next login is checked (0: go ahead)."""
        if self.limit == 0:
            return 0.0
        now = time.monotonic() if now is None else now
        seen = self._failures.get(address)
        if not seen:
            return 0.0
        while seen and seen[0] <= now - self.window_s:
            seen.popleft()
        if len(seen) < self.limit:
            return 0.0
        return seen[0] + self.window_s - now

    def failed(self, address: str, now: float | None = None) -> None:
        """Count one refused key from `address`."""
        if self.limit == 0:
            return
        now = time.monotonic() if now is None else now
        seen = self._failures.pop(address, None) or collections.deque(maxlen=self.limit)
        seen.append(now)
        self._failures[address] = seen  # re-inserted: the dict stays oldest-first
        while len(self._failures) > MAX_ADDRESSES:
            del self._failures[next(iter(self._failures))]


@dataclass(frozen=True)
class Viewer:
    """A logged-in person: the key's NATS user and role."""

    user: str
    role: str
    # The session this viewer logged in with (its key is held by the Authenticator).
    session: str = ""


class SessionSigner:
    """HMAC-signed session values; the secret lives in this process only (a restart logs out)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def _mac(self, body: bytes) -> str:
        digest = hmac.new(self._secret, body, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def sign(self, viewer: Viewer, now: float | None = None) -> str:
        """A cookie value naming `viewer`, valid for SESSION_S."""
        expires = int((now or time.time()) + SESSION_S)
        fields = {"u": viewer.user, "r": viewer.role, "s": viewer.session, "e": expires}
        body = json.dumps(fields).encode()
        encoded = base64.urlsafe_b64encode(body).decode().rstrip("=")
        return f"{encoded}.{self._mac(encoded.encode())}"

    def verify(self, value: str | None, now: float | None = None) -> Viewer | None:
        """The viewer a cookie names, or None when it is missing, forged or expired."""
        if not value or value.count(".") != 1:
            return None
        encoded, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac(encoded.encode())):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        except (ValueError, json.JSONDecodeError):
            return None
        if not isinstance(data, dict) or data.get("e", 0) < (now or time.time()):
            return None
        return Viewer(user=str(data.get("u")), role=str(data.get("r")), session=str(data.get("s")))


@dataclass
class _Held:
    """A session's key, when it was last proven, and when the session ends."""

    key: str
    proven: float
    expires: float


@dataclass
class Authenticator:
    """Checks keys against the NATS server, hands out one-time login tokens and proves each
    session's key again while it is used."""

    settings: Settings
    throttle: LoginThrottle = field(default_factory=lambda: LoginThrottle(login_failures_allowed()))
    _tokens: dict[str, tuple[Viewer, str]] = field(default_factory=dict)
    _sessions: dict[str, _Held] = field(default_factory=dict)
    _proving: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def check_key(self, text: str) -> Viewer:
        """Connect to NATS with the key; a Viewer when the server accepts it, else RolloutError
        (NatsUnreachable when the server could not be asked)."""
        key = ApiKey.parse(text, source="the key")
        keyed = replace(
            self.settings,
            nats_user=key.user,
            nats_password=key.secret,
            nats_token=None,
            credential_source="the login form",
        )
        try:
            # Each step has its own limit, but not the close; a check holds a login slot or
            # the lock every session's recheck waits on, so the whole of it has one too.
            async with asyncio.timeout(KEY_CHECK_S):
                nc = await connect_nats(keyed, connect_timeout=5)
                try:
                    who = await server_identity(nc)
                finally:
                    await nc.close()
        except TimeoutError:
            raise NatsUnreachable(
                f"NATS did not finish checking the key within {KEY_CHECK_S:.0f} s"
            ) from None
        return Viewer(user=str(who["user"]), role=str(who["role"]))

    def open_session(self, viewer: Viewer, key: str, now: float | None = None) -> Viewer:
        """`viewer` with a new session that holds `key` (proven just now) for SESSION_S."""
        now = time.time() if now is None else now
        for sid in [s for s, held in self._sessions.items() if held.expires < now]:
            del self._sessions[sid]
        same = [s for s, held in self._sessions.items() if held.key == key]
        for sid in same[: max(0, len(same) - SESSIONS_PER_KEY + 1)]:
            del self._sessions[sid]  # the dict is oldest-first
        sid = secrets.token_urlsafe(16)
        self._sessions[sid] = _Held(key=key, proven=time.monotonic(), expires=now + SESSION_S)
        return replace(viewer, session=sid)

    def close_session(self, viewer: Viewer) -> None:
        """End `viewer`'s session: its cookie is refused from now on, wherever a copy is."""
        self._sessions.pop(viewer.session, None)

    async def still_valid(self, viewer: Viewer) -> bool:
        """Whether the session's key is still accepted: proven again after RECHECK_S. A server
        that cannot be reached keeps the session (an outage is no revocation)."""
        held = self._sessions.get(viewer.session)
        if held is None:
            return False
        if time.monotonic() - held.proven < RECHECK_S:
            return True
        async with self._proving:
            if time.monotonic() - held.proven < RECHECK_S:  # proven while this one waited
                return True
            try:
                await self.check_key(held.key)
            except NatsUnreachable:
                pass  # asked again after RECHECK_S, not on every request meanwhile
            except RolloutError:
                self._sessions.pop(viewer.session, None)
                return False
            held.proven = time.monotonic()
            return True

    def one_time_token(self, viewer: Viewer, key: str) -> str:
        """A token that logs `viewer` (holding `key`) in once (printed in the URL, like
        Jupyter's)."""
        token = secrets.token_urlsafe(24)
        self._tokens[token] = (viewer, key)
        return token

    def redeem(self, token: str) -> Viewer:
        """The viewer of an unused token, with a session of its own; the token is spent."""
        for known in list(self._tokens):
            if hmac.compare_digest(known, token):
                viewer, key = self._tokens.pop(known)
                return self.open_session(viewer, key)
        raise RolloutError("this login link was already used or never issued; log in with a key")
