"""Who may look: a key is proven by connecting to NATS with it; a signed cookie remembers it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field, replace

from rollout.shared.auth.identity import server_identity
from rollout.shared.auth.keys import ApiKey
from rollout.shared.errors import RolloutError
from rollout.shared.settings import Settings, connect_nats

COOKIE = "rollout_ui"
SESSION_S = 12 * 3600


@dataclass(frozen=True)
class Viewer:
    """A logged-in person: the key's NATS user and role."""

    user: str
    role: str


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
        body = json.dumps({"u": viewer.user, "r": viewer.role, "e": expires}).encode()
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
        return Viewer(user=str(data.get("u")), role=str(data.get("r")))


@dataclass
class Authenticator:
    """Checks keys against the NATS server and hands out one-time login tokens."""

    settings: Settings
    _tokens: dict[str, Viewer] = field(default_factory=dict)

    async def check_key(self, text: str) -> Viewer:
        """Connect to NATS with the key; a Viewer when the server accepts it, else RolloutError."""
        key = ApiKey.parse(text, source="the key")
        keyed = replace(
            self.settings,
            nats_user=key.user,
            nats_password=key.secret,
            nats_token=None,
            credential_source="the login form",
        )
        nc = await connect_nats(keyed, connect_timeout=5)
        try:
            who = await server_identity(nc)
        finally:
            await nc.close()
        return Viewer(user=str(who["user"]), role=str(who["role"]))

    def one_time_token(self, viewer: Viewer) -> str:
        """A token that logs `viewer` in once (printed in the URL, like Jupyter's)."""
        token = secrets.token_urlsafe(24)
        self._tokens[token] = viewer
        return token

    def redeem(self, token: str) -> Viewer:
        """The viewer of an unused token; the token is spent either way."""
        for known in list(self._tokens):
            if hmac.compare_digest(known, token):
                return self._tokens.pop(known)
        raise RolloutError("this login link was already used or never issued; log in with a key")
