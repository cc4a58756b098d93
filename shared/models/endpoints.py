"""Which model endpoints the platform may call, and which secret each one gets: the operator's
setting, never the model name's.

A model name picks an endpoint (``openai/<m>``, ``together/<m>``, or a URL ``<base>#<m>``); the
policy says whether that endpoint is allowed and where its key comes from. A name that tries to
choose a credential (``?key_env=``, ``?api_key=``, a password in the URL) or names an endpoint
nobody allowed is refused, with the reason, at run creation (tracker), in ``rollout test`` and
again by the actor before it sends anything.

The policy is built from, in order (a later one wins for the same endpoint name):

1. Built-in defaults:
   - ``openai``: https://api.openai.com/v1 with ``OPENAI_API_KEY``; ``OPENAI_BASE_URL``
     replaces the URL only when the operator set it in the process environment.
   - ``together``: https://api.together.xyz/v1 with ``TOGETHER_API_KEY`` (``TOGETHER_BASE_URL``
     likewise).
   - loopback (``localhost``, ``127.0.0.0/8``, ``::1``, any port): allowed with no key, for a
     local ``vllm serve``. ``allow_loopback = false`` turns it off.
2. The operator's file: ``ROLLOUT_MODEL_ENDPOINTS`` (a path to a ``.toml`` or ``.json`` file, or
   inline JSON starting with ``{``); without it, ``ROLLOUT_HOME/model_endpoints.toml`` when it
   exists. Shape::

       allow_loopback = true

       [endpoints.gateway]
       url = "https://gateway.example.com/v1"   # scheme, host, port and path prefix
       key_env = "GATEWAY_API_KEY"              # or key_file = "/run/secrets/gateway"; or neither

An endpoint URL in a model name matches an entry when scheme, host and port are equal and the
entry's path is a prefix of the URL's path (whole segments). The first matching entry with the
longest path wins; explicit entries win over loopback.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rollout.shared.errors import RolloutError
from rollout.shared.settings import MODEL_ENDPOINTS_FILE, default_home

SETTING = "ROLLOUT_MODEL_ENDPOINTS"
OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"
TOGETHER_DEFAULT_BASE = "https://api.together.xyz/v1"
# Endpoint options a model name may carry (tuning only; none of them touches credentials).
NAME_OPTIONS = frozenset({"timeout", "retries", "concurrency", "logprobs", "token_ids"})
# Option names that would let a model name pick a secret: refused with their own reason.
_CREDENTIAL_WORDS = ("key", "token", "secret", "auth", "password", "bearer", "credential")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class EndpointEntry(BaseModel):
    """One allowed endpoint in the operator's file."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Base URL: scheme, host, optional port and path prefix.")
    key_env: str | None = Field(
        default=None, description="Environment variable holding this endpoint's API key."
    )
    key_file: str | None = Field(
        default=None, description="File holding this endpoint's API key (e.g. a compose secret)."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        problem = url_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("key_env")
    @classmethod
    def _variable_name(cls, value: str | None) -> str | None:
        if value is not None and not (value.replace("_", "a").isalnum() and value[:1].isalpha()):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> EndpointEntry:
        if self.key_env and self.key_file:
            raise ValueError("give key_env or key_file, not both")
        return self


class EndpointsFile(BaseModel):
    """The operator's endpoint file."""

    model_config = ConfigDict(extra="forbid")

    allow_loopback: bool = True
    endpoints: dict[str, EndpointEntry] = Field(default_factory=dict)


@dataclass(frozen=True)
class Endpoint:
    """An allowed endpoint and where its key comes from (None: it gets no key)."""

    name: str
    scheme: str
    host: str
    port: int
    path: str
    key_env: str | None = None
    key_file: str | None = None
    # Where this entry came from, named in errors ("built-in default", the file path...).
    source: str = "built-in default"

    @property
    def base_url(self) -> str:
        """The entry's URL, normalised."""
        default = _DEFAULT_PORTS.get(self.scheme)
        host = f"[{self.host}]" if ":" in self.host else self.host
        netloc = host if self.port == default else f"{host}:{self.port}"
        return f"{self.scheme}://{netloc}{self.path}"

    def key_source(self) -> str:
        """Where the key is read from, for messages (never the key itself)."""
        if self.key_env:
            return self.key_env
        if self.key_file:
            return f"key_file {self.key_file}"
        return "no key"

    def api_key(self) -> str | None:
        """The endpoint's key, read now from the operator's variable or file; None when unset."""
        if self.key_env:
            return os.environ.get(self.key_env, "").strip() or None
        if self.key_file:
            try:
                return Path(self.key_file).read_text().strip() or None
            except OSError as exc:
                raise RolloutError(
                    f"endpoint {self.name!r}: cannot read its key_file {self.key_file}: "
                    f"{exc.strerror} (set in {self.source})"
                ) from None
        return None

    def matches(self, parts: SplitResult) -> bool:
        """True when a URL lies under this endpoint (same origin, path under its prefix)."""
        scheme, host, port, path = _origin(parts)
        if (scheme, host, port) != (self.scheme, self.host, self.port):
            return False
        prefix = self.path.rstrip("/")
        return path.rstrip("/") == prefix or path.startswith(prefix + "/")


@dataclass(frozen=True)
class EndpointPolicy:
    """The allowed endpoints; built by `load_policy`."""

    endpoints: tuple[Endpoint, ...]
    allow_loopback: bool = True
    source: str = "built-in defaults"

    def named(self, name: str) -> Endpoint:
        """The endpoint called `name` (`openai`, `together`, or one from the file)."""
        for endpoint in self.endpoints:
            if endpoint.name == name:
                return endpoint
        raise RolloutError(f"no model endpoint named {name!r} in {self.source}")

    def for_url(self, url: str, where: str) -> Endpoint:
        """The endpoint a base URL from a model name may use, or a RolloutError saying why not."""
        problem = url_problem(url)
        if problem:
            raise RolloutError(f"{where}: {problem}")
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            raise RolloutError(
                f"{where}: a model name cannot carry credentials (user or password in the URL); "
                f"{self.hint()}"
            )
        found = [e for e in self.endpoints if e.matches(parts)]
        if found:
            return max(found, key=lambda e: len(e.path))
        scheme, host, port, path = _origin(parts)
        if self.allow_loopback and is_loopback(host):
            return Endpoint("loopback", scheme, host, port, path or "/", source="allow_loopback")
        allowed = ", ".join(e.base_url for e in self.endpoints) or "none"
        loop = " and loopback" if self.allow_loopback else ""
        raise RolloutError(
            f"{where}: endpoint {scheme}://{parts.netloc}{parts.path} is not allowed "
            f"(allowed: {allowed}{loop}); {self.hint()}"
        )

    def hint(self) -> str:
        """Where an operator allows an endpoint and sets its key."""
        return (
            f"the operator allows endpoints and sets each one's key in {SETTING} "
            f"(or ROLLOUT_HOME/{MODEL_ENDPOINTS_FILE}); now: {self.source}"
        )


def url_problem(url: str) -> str | None:
    """Why a string is not an http(s) base URL, or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        return f"{url!r} is not an http(s) base URL ({exc})"
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return f"'{url}' is not an http(s) base URL (e.g. http://localhost:8000/v1)"
    if any(ord(c) < 33 for c in url):
        return f"{url!r} is not an http(s) base URL (control characters or spaces)"
    return None


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (no DNS lookup: a name is what it says)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def credential_options(query: str) -> list[str]:
    """Query options that would choose a credential (`key_env`, `api_key`, `token`...)."""
    names = [k for k, _ in parse_qsl(query, keep_blank_values=True)]
    return sorted(
        {
            n
            for n in names
            if n not in NAME_OPTIONS and any(w in n.lower() for w in _CREDENTIAL_WORDS)
        }
    )


def credential_refusal(spec: str, options: list[str], policy: EndpointPolicy) -> str:
    """The reason a name naming credential options is refused."""
    return (
        f"model '{spec}': option(s) {', '.join(options)} would choose a credential; a model "
        f"name cannot pick which secret is sent where: {policy.hint()}"
    )


def load_policy(env: Mapping[str, str] | None = None) -> EndpointPolicy:
    """The endpoint policy from the built-in defaults and the operator's setting."""
    env = os.environ if env is None else env
    endpoints = {
        "openai": _provider(
            "openai", env, "OPENAI_BASE_URL", OPENAI_DEFAULT_BASE, "OPENAI_API_KEY"
        ),
        "together": _provider(
            "together", env, "TOGETHER_BASE_URL", TOGETHER_DEFAULT_BASE, "TOGETHER_API_KEY"
        ),
    }
    raw, source = _read_setting(env)
    if raw is None:
        return EndpointPolicy(tuple(endpoints.values()))
    try:
        parsed = EndpointsFile.model_validate(raw)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: "
            + str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors()
        ]
        raise RolloutError(f"invalid model endpoint setting {source}", problems=problems) from None
    for name, entry in parsed.endpoints.items():
        endpoints[name] = _endpoint(name, entry.url, entry.key_env, entry.key_file, source)
    return EndpointPolicy(tuple(endpoints.values()), parsed.allow_loopback, source)


def _provider(
    name: str, env: Mapping[str, str], base_env: str, default: str, key_env: str
) -> Endpoint:
    base = (env.get(base_env) or "").strip()
    if base:
        problem = url_problem(base)
        if problem:
            raise RolloutError(f"{base_env}: {problem}")
        return _endpoint(name, base, key_env, None, base_env)
    return _endpoint(name, default, key_env, None, "built-in default")


def _endpoint(
    name: str, url: str, key_env: str | None, key_file: str | None, source: str
) -> Endpoint:
    scheme, host, port, path = _origin(urlsplit(url))
    return Endpoint(name, scheme, host, port, path.rstrip("/") or "/", key_env, key_file, source)


def _origin(parts: SplitResult) -> tuple[str, str, int, str]:
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower().rstrip(".")
    port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    return scheme, host, port, parts.path or "/"


def _read_setting(env: Mapping[str, str]) -> tuple[dict[str, Any] | None, str]:
    value = (env.get(SETTING) or "").strip()
    if value.startswith("{"):
        source = f"{SETTING} (inline JSON)"
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RolloutError(f"{source} is not valid JSON: {exc}") from None
        return _object(data, source), source
    if value:
        path = Path(value).expanduser()
        source = f"{SETTING}={path}"
        if not path.is_file():
            what = "is a folder, not" if path.is_dir() else "no such file"
            raise RolloutError(f"{source}: {what} (a .toml or .json endpoint list)")
    else:
        home = Path(env["ROLLOUT_HOME"]).expanduser() if env.get("ROLLOUT_HOME") else None
        path = (home or default_home(env)) / MODEL_ENDPOINTS_FILE
        source = str(path)
        if not path.is_file():
            return None, "built-in defaults"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RolloutError(f"{source}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise RolloutError(
            f"{source}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
        ) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise RolloutError(f"{source} is not valid {kind}: {exc}") from None
    return _object(data, source), source


def _object(data: Any, source: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise RolloutError(f"{source} must hold an object with 'endpoints' (and 'allow_loopback')")
    return data


__all__ = [
    "NAME_OPTIONS",
    "SETTING",
    "Endpoint",
    "EndpointPolicy",
    "EndpointsFile",
    "credential_options",
    "is_loopback",
    "load_policy",
    "url_problem",
]
