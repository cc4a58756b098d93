"""`rollout login | logout | whoami | keys`: API keys and the credentials the CLI uses."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys
from dataclasses import replace
from typing import Any

from rollout.cli import key_limits
from rollout.cli._common import print_json
from rollout.errors import RolloutError
from rollout.shared.settings import connect_nats, load_settings, read_json_file


def register(sub: Any) -> None:
    """Add the auth verbs."""
    login = sub.add_parser("login", help="save an API key for an endpoint (verified first)")
    login.add_argument("--endpoint", help="NATS URL of the platform (default: the local stack)")
    login.add_argument("--key", help="the API key (default: prompt, or read stdin when piped)")
    login.set_defaults(func=cmd_login)

    logout = sub.add_parser("logout", help="forget the saved credentials")
    logout.set_defaults(func=cmd_logout)

    whoami = sub.add_parser("whoami", help="the endpoint, key and role this CLI uses")
    whoami.add_argument("--json", action="store_true", help="machine-readable output")
    whoami.set_defaults(func=cmd_whoami)

    keys = sub.add_parser("keys", help="create, list and revoke API keys (on the server)")
    verbs = keys.add_subparsers(dest="keys_command", metavar="VERB", required=True)
    create = verbs.add_parser("create", help="mint a key; it is printed once")
    create.add_argument("--role", required=True, choices=["runner", "viewer"])
    create.add_argument("--name", default=None, help="what the key is for")
    key_limits.add_limit_flags(create)
    create.add_argument("--json", action="store_true", help="machine-readable output")
    create.set_defaults(func=cmd_keys_create)
    limit = verbs.add_parser("limit", help="set or lift a key's budgets a UTC day")
    limit.add_argument("id", help="key id (from `rollout keys list`)")
    key_limits.add_limit_flags(limit)
    limit.add_argument("--json", action="store_true", help="machine-readable output")
    limit.set_defaults(func=cmd_keys_limit)
    listing = verbs.add_parser(
        "list", help="every live key (never the secrets), its limits and use today"
    )
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=cmd_keys_list)
    revoke = verbs.add_parser("revoke", help="revoke a key; the server refuses it at once")
    revoke.add_argument("id", help="key id (from `rollout keys list`)")
    revoke.add_argument("--json", action="store_true", help="machine-readable output")
    revoke.set_defaults(func=cmd_keys_revoke)


# --- login / logout / whoami -----------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> int:
    """Verify a key against the endpoint with a query, then save both (0600)."""
    from rollout.shared.auth.credentials import ENDPOINT_ENV, check_endpoint, save_credentials
    from rollout.shared.auth.keys import ApiKey

    settings = load_settings()
    endpoint, source = args.endpoint, "--endpoint"
    if not endpoint and os.environ.get(ENDPOINT_ENV):
        endpoint, source = os.environ[ENDPOINT_ENV], ENDPOINT_ENV
    if not endpoint and (settings.external_nats or read_json_file(settings.home / "state.json")):
        endpoint, source = settings.nats_url, "the local stack"
    if not endpoint:
        raise RolloutError(
            "no endpoint to log in to",
            problems=["pass --endpoint nats://host:4222 (or start a local stack: `rollout up`)"],
        )
    endpoint = check_endpoint(endpoint, source)
    key = ApiKey.parse(args.key if args.key else _read_key(), source="the key")
    identity = asyncio.run(_verify(settings, endpoint, key.text))
    save_credentials(endpoint, key.text)
    print(f"✓ saved credentials for {endpoint} (key {identity['keyId']}, {identity['role']})")
    return 0


def _read_key() -> str:
    """The key from a hidden prompt, or from stdin when it is not a terminal."""
    if not sys.stdin.isatty():
        text = sys.stdin.readline().strip()
    else:
        print("Create an API key on the server: rollout keys create --role runner", file=sys.stderr)
        text = getpass.getpass("Paste API key (rk_…): ").strip()
    if not text:
        raise RolloutError("no API key given", problems=["paste the key, or pass --key"])
    return text


async def _verify(settings: Any, endpoint: str, key_text: str) -> dict[str, Any]:
    """Connect with the key and make a query; a clear error (nothing saved) if either fails."""
    from rollout.shared.auth.credentials import with_credentials

    checked = replace(
        with_credentials(settings, endpoint, key_text),
        endpoint_source="rollout login",
        credential_source="the key being logged in",
    )
    return await _identify(checked, query=True)


async def _identify(settings: Any, *, query: bool) -> dict[str, Any]:
    """Who the server says we are; with `query`, also prove the key can read the registry."""
    from rollout.shared.auth.denials import PermissionWatch
    from rollout.shared.auth.identity import server_identity

    watch = PermissionWatch(settings.nats_user)
    nc = await connect_nats(settings, name="rollout-auth", error_cb=watch.error_cb)
    try:
        identity = await server_identity(nc)
        if query:
            # Only `login` asks: the request machinery loads faststream, which whoami needs not.
            from rollout.shared.bus.requests import call, service_subject
            from rollout.shared.contracts.requests import ListEnvironments

            # Under the key's own name: the only subject its permissions let it ask on.
            subject = service_subject(nc, "registry", "list")
            try:
                await watch.guard(subject, call(nc, subject, ListEnvironments(), timeout_s=15))
            except RolloutError as exc:
                raise RolloutError(
                    f"could not verify the key with a query: {exc.message}",
                    problems=[*exc.problems, "nothing was saved"],
                ) from None
        return identity
    finally:
        await nc.close()


def cmd_logout(args: argparse.Namespace) -> int:
    """Delete the saved credentials file."""
    from rollout.shared.auth.credentials import credentials_path, read_credentials

    saved = read_credentials()
    if saved is None:
        print("not logged in")
        return 0
    credentials_path().unlink()
    print(f"removed credentials for {saved['endpoint']}")
    return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    """Print the endpoint, key id and role in use (the role as the server reports it)."""
    from rollout.shared.auth.credentials import client_settings, describe

    settings = client_settings()
    identity = asyncio.run(_identify(settings, query=False))
    where = describe(settings)
    doc = {
        "endpoint": where["endpoint"],
        "keyId": identity["keyId"],
        "role": identity["role"],
        "user": identity["user"],
        "endpointSource": where["endpointSource"],
        "credentialSource": where["credentialSource"] or "the stack's service credentials",
    }
    if args.json:
        print_json(doc)
        return 0
    print(f"endpoint  {doc['endpoint']}  (from {doc['endpointSource']})")
    print(f"key       {doc['keyId'] or '-'}  (from {doc['credentialSource']})")
    print(f"role      {doc['role']}")
    return 0


# --- keys ------------------------------------------------------------------------------------


def _home_with_embedded_nats() -> Any:
    """ROLLOUT_HOME, if its NATS is the embedded one (keys become users of that server)."""
    from rollout.shared.auth.credentials import API_KEY_ENV, ENDPOINT_ENV, read_credentials

    # `keys` acts as the operator of ROLLOUT_HOME's stack, through its files, not through a
    # key: a shell that names another endpoint or a key holder's key would be told it made
    # or revoked keys that the server it talks to never hears of.
    given = [name for name in (ENDPOINT_ENV, API_KEY_ENV) if os.environ.get(name)]
    if given:
        raise RolloutError(
            f"rollout keys manages the keys of the stack in ROLLOUT_HOME, as its operator, but "
            f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} set: this shell acts as "
            "a key holder",
            problems=[
                f"unset {' and '.join(given)} to manage the keys of the stack in ROLLOUT_HOME",
                "or run `rollout keys` on the machine (and ROLLOUT_HOME) where `rollout up` runs",
            ],
        )
    settings = load_settings()
    saved = read_credentials()
    if saved is not None and saved.get("endpoint") != settings.nats_url:
        raise RolloutError(
            f"rollout keys manages the keys of the stack in ROLLOUT_HOME, but this shell is "
            f"logged in to {saved.get('endpoint')} (rollout login)",
            problems=[
                "run `rollout keys` on the machine where that stack's `rollout up` runs",
                "or `rollout logout` to manage the keys of the stack in ROLLOUT_HOME",
            ],
        )
    if settings.external_nats:
        raise RolloutError(
            "API keys are users of the embedded nats-server, but ROLLOUT_NATS_URL points "
            "at an external one",
            problems=["run `rollout keys` where `rollout up` runs the platform's NATS"],
        )
    return settings.home


def _apply(home: Any) -> bool:
    """Reload the running server's users; False (with a note) when the stack is down."""
    from rollout.shared.stack.nats import reload_nats

    applied = reload_nats(home)
    if not applied:
        print("note: the stack is not running; the change applies at `rollout up`", file=sys.stderr)
    return applied


def cmd_keys_create(args: argparse.Namespace) -> int:
    """Mint a key and print it once (stdout holds only the key, for scripts)."""
    from rollout.shared.auth.keys import KeyStore

    home = _home_with_embedded_nats()
    changes = key_limits.limit_changes(args)
    if changes:
        key_limits.require_running(home, "rollout keys create --max-...")
    store = KeyStore(home)
    record, key = store.create(args.role, args.name)
    limits = None
    if changes:
        # On the log before the server knows the key: it is never usable without its limits.
        try:
            limits = key_limits.set_limits(record.id, changes)
        except BaseException:
            store.revoke(record.id)
            raise
    applied = _apply(home)
    if args.json:
        extra = {"limits": limits.model_dump(exclude={"key_id"})} if limits else {}
        print_json(record.public() | {"apiKey": key.text, "applied": applied} | extra)
        return 0
    print(f"created {record.role.value} key {record.id} ({record.name})", file=sys.stderr)
    if limits is not None:
        print(f"limits: {key_limits.describe_limits(limits)}", file=sys.stderr)
    print(key.text)
    print("store it now: it is shown only once", file=sys.stderr)
    return 0


def cmd_keys_limit(args: argparse.Namespace) -> int:
    """Set or lift a key's daily budgets; the services apply them to its next request."""
    from rollout.shared.auth.keys import KeyStore, read_local_key

    home = _home_with_embedded_nats()
    record = KeyStore(home).find(args.id)
    changes = key_limits.limit_changes(args)
    if not changes:
        raise RolloutError(
            "rollout keys limit: nothing to set",
            problems=["pass --max-rollouts-per-day N and/or --max-jobs-per-day N (`none` lifts)"],
        )
    local = read_local_key(home)
    if local is not None and local.key_id == record.id:
        # The operator's own: `rollout up` makes it, the CLI on this machine acts with it.
        raise RolloutError(
            f"key {record.id} is this machine's local key, the operator's own: it stays unlimited",
            problems=["limit the keys you give others (`rollout keys list` shows which)"],
        )
    key_limits.require_running(home, "rollout keys limit")
    limits = key_limits.set_limits(record.id, changes)
    if args.json:
        print_json({"id": record.id, "limits": limits.model_dump(exclude={"key_id"})})
        return 0
    print(f"key {record.id} ({record.name}): {key_limits.describe_limits(limits)}")
    return 0


def _used_of(found: dict[str, Any] | None, kind: str, limit_field: str) -> str:
    """`4/6`: used today of the limit (`-`: none); `?` when the stack is down."""
    if found is None:
        return "?"
    limit = found["limits"][limit_field]
    return f"{found['used'][kind]}/{'-' if limit is None else limit}"


def cmd_keys_list(args: argparse.Namespace) -> int:
    """List the keys: id, role, name, created; their limits and use today (UTC)."""
    from rollout.shared.auth.keys import KeyStore, read_local_key

    home = _home_with_embedded_nats()
    records = KeyStore(home).records()
    local = read_local_key(home)
    running = key_limits.stack_running(home)
    usage = key_limits.usage([r.id for r in records]) if running and records else {}
    rows = [
        r.public() | {"local": bool(local and local.key_id == r.id)} | usage.get(r.id, {})
        for r in records
    ]
    if args.json:
        print_json({"keys": rows, "stackRunning": running})
        return 0
    if not rows:
        print("no API keys (create one: rollout keys create --role runner)")
        return 0
    print(f"{'ID':<14}{'ROLE':<8}{'CREATED':<27}{'ROLLOUTS':<12}{'JOBS':<8}NAME")
    for row in rows:
        found = usage.get(row["id"])
        rollouts = _used_of(found, "rollouts", "maxRolloutsPerDay")
        jobs = _used_of(found, "jobs", "maxJobsPerDay")
        print(
            f"{row['id']:<14}{row['role']:<8}{row['created']:<27}{rollouts:<12}{jobs:<8}"
            f"{row['name']}"
        )
    if running:
        print("ROLLOUTS, JOBS: used today (UTC) / limit a day (- no limit)")
    else:
        print("ROLLOUTS, JOBS: the stack is not running; its log keeps the limits and use")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    """Revoke a key; the running server refuses it (and drops its connections) at once."""
    from rollout.shared.auth.keys import KeyStore, ensure_local_key, read_local_key

    home = _home_with_embedded_nats()
    local = read_local_key(home)
    record = KeyStore(home).revoke(args.id)
    # The CLI on this machine runs on the local key: revoking it rotates it (a leaked local
    # key is the usual reason), rather than locking this machine out of its own stack.
    fresh = ensure_local_key(home) if local is not None and local.key_id == record.id else None
    applied = _apply(home)
    rotated = {"newLocalKeyId": fresh.key_id} if fresh is not None else {}
    if args.json:
        print_json({"revoked": record.public(), "applied": applied} | rotated)
        return 0
    print(f"revoked {record.role.value} key {record.id} ({record.name})")
    if fresh is not None:
        print(f"it was this machine's local key: the CLI now uses a new one, {fresh.key_id}")
    return 0
