"""API keys: `rk_<role>_<id>_<secret>`, kept as bcrypt hashes in ROLLOUT_HOME/keys.json.

The NATS user of a key is `rk_<role>_<id>` and its password is the secret. The role is part of
the user name, so whoever authenticates with the key provably holds that role (a key with an
edited role names a user that does not exist), and `whoami` can tell the role of a remote key
from the server's answer alone. The secret itself is never stored: the server config and
keys.json hold only its bcrypt hash.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import re
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import bcrypt
from pydantic import BaseModel, ValidationError

from rollout.shared.auth.roles import KEY_ROLES, Role
from rollout.shared.errors import RolloutError
from rollout.shared.settings import read_json_file
from rollout.shared.stack.files import write_json

KEY_PREFIX = "rk_"
KEYS_FILE = "keys.json"
LOCAL_KEY_FILE = "local_key.json"
# The secret is 192 random bits, so bcrypt's cost buys little; it is kept moderate because
# nats-server checks the hash on every connect (cost 10: tens of milliseconds).
BCRYPT_ROUNDS = 10
_ID = re.compile(r"^[0-9a-f]{12}$")
_SECRET = re.compile(r"^[0-9a-f]{32,128}$")
KEY_SHAPE = "rk_<role>_<id>_<secret>"


@dataclass(frozen=True)
class ApiKey:
    """A parsed API key. `repr` never shows the secret."""

    role: Role
    key_id: str
    secret: str

    @property
    def user(self) -> str:
        """The NATS user name: `rk_<role>_<id>`."""
        return f"{KEY_PREFIX}{self.role.value}_{self.key_id}"

    @property
    def text(self) -> str:
        """The full key, as the user pastes it."""
        return f"{self.user}_{self.secret}"

    def __repr__(self) -> str:
        return f"ApiKey(user={self.user!r})"

    @classmethod
    def generate(cls, role: Role) -> ApiKey:
        """A new random key."""
        return cls(role=role, key_id=secrets.token_hex(6), secret=secrets.token_hex(24))

    @classmethod
    def parse(cls, text: str, *, source: str = "the API key") -> ApiKey:
        """Parse a key; a clear error (never echoing the secret) when it is malformed."""
        text = text.strip()
        if not text.startswith(KEY_PREFIX):
            raise RolloutError(
                f"{source} is not a rollout API key: API keys start with {KEY_PREFIX!r}",
                problems=["create one with `rollout keys create --role runner` on the server"],
            )
        parts = text.split("_")
        roles = ", ".join(role.value for role in KEY_ROLES)
        if len(parts) != 4 or not _ID.match(parts[2]) or not _SECRET.match(parts[3]):
            raise RolloutError(
                f"{source} is malformed: expected {KEY_SHAPE}",
                problems=["copy the whole key as `rollout keys create` printed it"],
            )
        if parts[1] not in roles.split(", "):
            raise RolloutError(f"{source} has unknown role {parts[1]!r} (known: {roles})")
        return cls(role=Role(parts[1]), key_id=parts[2], secret=parts[3])


def role_of_user(user: str | None) -> Role | None:
    """The role a NATS user name encodes (`rk_<role>_<id>`); None for other users."""
    if not user or not user.startswith(KEY_PREFIX):
        return None
    parts = user.split("_")
    if len(parts) == 3 and parts[1] in {role.value for role in KEY_ROLES}:
        return Role(parts[1])
    return None


def key_id_of_user(user: str | None) -> str | None:
    """The key id inside a key's NATS user name; None for other users."""
    return user.split("_")[2] if role_of_user(user) else None


def hash_secret(secret: str) -> str:
    """A bcrypt hash nats-server accepts as a password (`$2a$` prefix)."""
    salt = bcrypt.gensalt(rounds=BCRYPT_ROUNDS, prefix=b"2a")
    return bcrypt.hashpw(secret.encode(), salt).decode()


class KeyRecord(BaseModel):
    """One key as the server keeps it: no secret, only its hash."""

    id: str
    name: str
    role: Role
    created: str
    password_hash: str

    @property
    def user(self) -> str:
        """The key's NATS user name."""
        return f"{KEY_PREFIX}{self.role.value}_{self.id}"

    def public(self) -> dict[str, str]:
        """The record without its hash (for listings)."""
        return {"id": self.id, "name": self.name, "role": self.role.value, "created": self.created}


class KeyStore:
    """The keys of one ROLLOUT_HOME, in keys.json (0600), changed under a file lock."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = home / KEYS_FILE

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock: one writer at a time (e.g. two `keys create` at once)."""
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        with (self.home / f".{KEYS_FILE}.lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def records(self) -> list[KeyRecord]:
        """Every live key, oldest first."""
        raw = read_json_file(self.path).get("keys", [])
        try:
            return [KeyRecord.model_validate(item) for item in raw]
        except ValidationError as exc:
            raise RolloutError(
                f"{self.path} is damaged: {exc.errors()[0]['msg']}",
                problems=["restore it from a backup, or delete it and create keys again"],
            ) from None

    def _save(self, records: list[KeyRecord]) -> None:
        write_json(self.path, {"keys": [r.model_dump(mode="json") for r in records]}, private=True)

    def create(self, role: Role | str, name: str | None = None) -> tuple[KeyRecord, ApiKey]:
        """Mint a key; the returned ApiKey is the only time its secret exists in clear."""
        try:
            role = Role(role)
        except ValueError:
            role = None  # type: ignore[assignment]
        if role not in KEY_ROLES:
            known = ", ".join(r.value for r in KEY_ROLES)
            raise RolloutError(f"--role must be one of {known}")
        key = ApiKey.generate(role)
        record = KeyRecord(
            id=key.key_id,
            name=(name or "").strip() or f"{role.value} key",
            role=role,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            password_hash=hash_secret(key.secret),
        )
        with self.locked():
            self._save([*self.records(), record])
        return record, key

    def find(self, ref: str) -> KeyRecord:
        """A key by id, by NATS user (`rk_<role>_<id>`) or by the full key."""
        wanted = ref.strip()
        if wanted.startswith(KEY_PREFIX):
            wanted = wanted.split("_")[2] if wanted.count("_") >= 2 else wanted
        for record in self.records():
            if record.id == wanted:
                return record
        raise RolloutError(
            f"no API key {ref.strip()[:40]!r} in {self.path}",
            problems=["see the ids with `rollout keys list`"],
        )

    def revoke(self, ref: str) -> KeyRecord:
        """Remove a key; the server refuses it after the next reload."""
        with self.locked():
            record = self.find(ref)
            self._save([r for r in self.records() if r.id != record.id])
        return record


def local_key_path(home: Path) -> Path:
    """Where `rollout up` keeps this machine's own runner key (0600)."""
    return home / LOCAL_KEY_FILE


def read_local_key(home: Path) -> ApiKey | None:
    """This machine's runner key for the embedded stack, if `rollout up` made one."""
    path = local_key_path(home)
    text = read_json_file(path).get("api_key")
    return ApiKey.parse(text, source=str(path)) if isinstance(text, str) else None


def ensure_local_key(home: Path) -> ApiKey:
    """The local runner key, created (and recorded in keys.json) when missing or revoked."""
    store = KeyStore(home)
    existing = read_local_key(home)
    if existing is not None and any(r.id == existing.key_id for r in store.records()):
        return existing
    _, key = store.create(Role.RUNNER, f"{getpass.getuser()}@{socket.gethostname()} (local)")
    write_json(local_key_path(home), {"id": key.key_id, "api_key": key.text}, private=True)
    return key
