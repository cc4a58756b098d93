"""`rollout up | down | status | serve`: the embedded stack on one machine."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.errors import RolloutError
from rollout.shared.settings import default_home, load_settings, redact_url
from rollout.shared.stack.files import ensure_home
from rollout.shared.stack.process import read_from, tail
from rollout.shared.stack.services import registry, selected

if TYPE_CHECKING:
    from rollout.shared.stack.health import Beat

DEFAULT_UP_TIMEOUT = 120.0
# How long `up` re-probes a ready stack that reads unhealthy before it says so (exit 1).
UP_SETTLE_S = 20.0
# More trackers than this only add standbys polling the lease.
MAX_TRACKER_REPLICAS = 5


def register(sub: Any) -> None:
    """Add the stack verbs."""
    up = sub.add_parser("up", help="start NATS, Postgres and the services; return when healthy")
    up.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops all")
    up.add_argument(
        "--cluster",
        type=int,
        default=None,
        metavar="N",
        help="run N nats-servers clustered on loopback with R3 streams (3 or 5; default: what"
        " this home ran last, else 1)",
    )
    up.add_argument(
        "--tracker-replicas",
        type=int,
        default=1,
        metavar="N",
        help="run N tracker replicas; one leads (projection, run lifecycle), the others stand"
        f" by and answer requests (1 to {MAX_TRACKER_REPLICAS}; default %(default)s)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get("ROLLOUT_UP_TIMEOUT", DEFAULT_UP_TIMEOUT)),
        help="seconds to wait for every component to be healthy (default %(default)s)",
    )
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop the services, then the servers")
    down.add_argument("--timeout", type=float, default=60.0, help="seconds before SIGKILL")
    down.set_defaults(func=cmd_down)

    status = sub.add_parser("status", help="health of each component (exit 0 only if all healthy)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    serve = sub.add_parser("serve", help="run one service in the foreground")
    serve.add_argument("name", help="service name, e.g. tracker")
    serve.add_argument("--replica-id", default=None, help="heartbeat id (default host-pid)")
    serve.set_defaults(func=cmd_serve)

    health = sub.add_parser(
        "health",
        help="exit 0 while a replica of SERVICE here has had a heartbeat accepted recently"
        " and, for tracker and buffer, its read models are not stalled behind longer than"
        " ROLLOUT_PROJECTION_STALL_S (unless --beat-only; a container probe: reads the beat"
        " files `serve` writes, opens no connection)",
    )
    health.add_argument("name", help="service name, e.g. tracker")
    health.add_argument(
        "--max-age",
        type=float,
        default=None,
        help="seconds a beat counts as fresh (default: three heartbeat intervals)",
    )
    health.add_argument(
        "--beat-only",
        action="store_true",
        help="only the heartbeat, not the read models' lag (liveness and startup probes: a"
        " restart does not cure a projection Postgres refuses to write)",
    )
    health.set_defaults(func=cmd_health)


def _fast_postgres() -> bool:
    # Tests only: ROLLOUT_PG_FSYNC=off trades crash safety for speed.
    return os.environ.get("ROLLOUT_PG_FSYNC", "on").lower() == "off"


def up_args(*argv: str) -> argparse.Namespace:
    """`rollout up`'s arguments as its parser reads `argv` (every option's default included)."""
    parser = argparse.ArgumentParser(prog="rollout")
    register(parser.add_subparsers())
    return parser.parse_args(["up", *argv])


def cmd_up(args: argparse.Namespace) -> int:
    """Start the stack (a background supervisor unless --foreground)."""
    from rollout.shared.stack.supervisor import (
        TOKEN_ENV,
        check_nats_mode,
        cli_command,
        down,
        read_state,
        supervisor_running,
    )

    settings = load_settings()
    services = selected()
    ensure_home(settings.home)
    cluster = _cluster_size(args.cluster, settings)
    trackers = _tracker_replicas(args.tracker_replicas, services)
    if not settings.external_nats and not supervisor_running(settings.home):
        check_nats_mode(settings.home, cluster)  # before a supervisor starts to find it out
    if args.foreground:
        return _run_foreground(settings, services, cluster, trackers)
    if supervisor_running(settings.home):
        _wait_ready(settings.home, None, None, args.timeout)
        return _print_status(as_json=False, settle_s=UP_SETTLE_S)

    token = uuid.uuid4().hex
    log_path = settings.home / "logs" / "supervisor.log"
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            cli_command(
                "up",
                "--foreground",
                "--cluster",
                str(cluster),
                "--tracker-replicas",
                str(trackers),
            ),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, TOKEN_ENV: token, "ROLLOUT_HOME": str(settings.home)},
            # Detached: the stack outlives this command and the terminal.
            start_new_session=True,
        )
    try:
        _wait_ready(settings.home, token, proc, args.timeout)
    except RolloutError:
        # Ours to clean up while it runs, and also once it has exited after recording "failed"
        # (its token): its record still named its pid, so `status` showed a dead supervisor.
        if proc.poll() is None or read_state(settings.home).get("token") == token:
            down(settings.home)
        raise
    return _print_status(as_json=False, settle_s=UP_SETTLE_S)


def _cluster_size(requested: int | None, settings: Any) -> int:
    """The nats-servers to run: as asked, else as this home last ran, else one."""
    from rollout.shared.stack.supervisor import read_state

    if requested is None:
        recorded = (read_state(settings.home).get("nats") or {}).get("cluster")
        return recorded if isinstance(recorded, int) and recorded > 1 else 1
    if requested == 2 or not 1 <= requested <= 5:
        raise RolloutError(
            f"--cluster {requested}: a NATS cluster here is 3 or 5 servers (or 1, no cluster)",
            problems=["two servers have no majority once one is down; three survive one loss"],
        )
    if requested > 1 and settings.external_nats:
        raise RolloutError(
            "--cluster starts nats-servers here, but ROLLOUT_NATS_URL points at another NATS",
            problems=["unset ROLLOUT_NATS_URL, or drop --cluster"],
        )
    return requested


def _tracker_replicas(requested: int, services: list[str]) -> int:
    """How many tracker replicas to run, checked."""
    if not 1 <= requested <= MAX_TRACKER_REPLICAS:
        raise RolloutError(
            f"--tracker-replicas {requested}: must be between 1 and {MAX_TRACKER_REPLICAS}",
            problems=["one leads; a second one is the standby that takes over when it dies"],
        )
    if requested > 1 and "tracker" not in services:
        raise RolloutError(
            f"--tracker-replicas {requested}: the tracker is not among the services to run",
            problems=["add it to ROLLOUT_SERVICES, or drop --tracker-replicas"],
        )
    return requested


def _run_foreground(settings: Any, services: list[str], cluster: int = 1, trackers: int = 1) -> int:
    from rollout.shared.observability import configure_logging
    from rollout.shared.stack.supervisor import TOKEN_ENV, Supervisor

    configure_logging("supervisor")
    supervisor = Supervisor(
        settings=settings,
        services=services,
        env=dict(os.environ),
        token=os.environ.get(TOKEN_ENV),
        fast=_fast_postgres(),
        cluster=cluster,
        replicas={"tracker": trackers},
    )
    asyncio.run(supervisor.run())
    return 0


def _wait_ready(
    home: Path, token: str | None, proc: subprocess.Popen[bytes] | None, timeout: float
) -> None:
    """Wait for the supervisor to report `ready`; fail with its log when it gives up."""
    from rollout.shared.stack.supervisor import read_state

    log_path = home / "logs" / "supervisor.log"
    deadline = time.monotonic() + timeout
    while True:
        state = read_state(home)
        if token is None or state.get("token") == token:
            if state.get("phase") == "ready":
                return
            if state.get("phase") == "failed":
                raise RolloutError(
                    f"rollout up failed: {state.get('error')}",
                    problems=[f"log: {log_path}"],
                )
        if proc is not None and proc.poll() is not None:
            raise RolloutError(
                f"the supervisor exited with code {proc.returncode}",
                problems=[tail(read_from(log_path, 0)), f"log: {log_path}"],
            )
        if token is None or state.get("token") == token:
            _fail_on_a_refusal(state)
        if time.monotonic() > deadline:
            waiting = _unhealthy_summary(home)
            if proc is None:
                # The stack is an earlier `up`'s: this one leaves it as it is.
                raise RolloutError(
                    f"the stack is still starting after {timeout:.0f}s (another `rollout up`"
                    " started it; it goes on)",
                    problems=[
                        *waiting,
                        f"supervisor log: {log_path}",
                        "`rollout status` shows it; `rollout down` stops it",
                    ],
                )
            raise RolloutError(
                f"the stack was not healthy after {timeout:.0f}s; stopped it",
                problems=[*waiting, f"supervisor log: {log_path}"],
            )
        # The supervisor records its phase in the state file; re-read it in short steps.
        time.sleep(0.1)


# A service that exits this many times, each time refusing to start with the same one-line
# error (a setting it cannot use), will not come up however long `up` waits for it.
REFUSALS_TO_FAIL = 3


def _refusal(entry: dict[str, Any]) -> str | None:
    """The one-line error (`error: ...`, a RolloutError) a service's log ends with, if any."""
    log = entry.get("log")
    if not log:
        return None
    lines = read_from(Path(log), 0).strip().splitlines()[-200:]
    last = lines[-1] if lines else ""
    return last if last.startswith("error: ") else None


def _fail_on_a_refusal(state: dict[str, Any]) -> None:
    """Fail `up` at once when a service keeps refusing to start with the same error."""
    for name, entry in (state.get("services") or {}).items():
        if int(entry.get("restarts") or 0) < REFUSALS_TO_FAIL or entry.get("last_exit") == 0:
            continue
        refusal = _refusal(entry)
        if refusal is None:
            continue
        lines = read_from(Path(entry["log"]), 0).splitlines()
        if lines.count(refusal) >= REFUSALS_TO_FAIL:
            raise RolloutError(
                f"{name} cannot start: {refusal.removeprefix('error: ')}",
                problems=[f"it refused {lines.count(refusal)} times; log: {entry['log']}"],
            )


def _unhealthy_summary(home: Path) -> list[str]:
    from rollout.shared.stack.supervisor import read_state

    state = read_state(home)
    lines = []
    for name, entry in (state.get("services") or {}).items():
        line = (
            f"{name}: restarts={entry.get('restarts', 0)} last_exit={entry.get('last_exit')} "
            f"log: {entry.get('log')}"
        )
        if entry.get("last_exit") not in (None, 0) and (refusal := _refusal(entry)):
            line += f" ({refusal})"
        lines.append(line)
    return lines or [f"phase: {state.get('phase', 'unknown')}"]


def cmd_down(args: argparse.Namespace) -> int:
    """Stop everything `up` started for this ROLLOUT_HOME."""
    from rollout.shared.stack.supervisor import down

    settings = load_settings()
    stopped = down(settings.home, timeout=args.timeout)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print each component's health; exit 0 only when all are healthy."""
    return _print_status(as_json=args.json)


def _print_status(*, as_json: bool, settle_s: float = 0.0) -> int:
    from rollout.shared.envs.sandbox_check import check_sandbox_sync
    from rollout.shared.stack.status import as_json as to_json
    from rollout.shared.stack.status import as_table, endpoint_projections

    settings = load_settings()
    components = asyncio.run(_settled_status(settings, settle_s))
    # Not a stack component (the stack runs without it), but code-editing envs need it here:
    # its absence is said in one line, with the fix, instead of failing every such task.
    sandbox = check_sandbox_sync()
    elsewhere = _verbs_endpoint_elsewhere(settings)
    # A key holder's shell: what its key may see of the endpoint its verbs use, how far
    # behind the read models `show`, `runs` and `export` read there are.
    remote = asyncio.run(endpoint_projections(elsewhere[2])) if elsewhere else []
    if as_json:
        doc = to_json(components) | {"home": str(settings.home)}
        doc["sandbox"] = {"ok": sandbox.ok, "bwrap": sandbox.bwrap, "problem": sandbox.problem}
        if elsewhere:
            doc["endpoint"] = {"url": elsewhere[0], "source": elsewhere[1]}
            doc["endpoint"] |= to_json(remote)
        print(json.dumps(doc, indent=2))
    else:
        print(as_table(components))
        print(sandbox.line())
        if elsewhere:
            print(f"\nthe endpoint the other verbs use, {elsewhere[0]}: its read models")
            print(as_table(remote))
    if elsewhere:
        print(
            f"note: the other verbs of this CLI use {elsewhere[0]} (from {elsewhere[1]}), not"
            f" this stack (ROLLOUT_HOME={settings.home}); `rollout whoami` checks that endpoint"
            " and key; the lines under it are its read models' lag, and its operator's"
            " `rollout status` shows the rest of its health",
            file=sys.stderr,
        )
    healthy = all(c.healthy for c in components)
    return 0 if healthy else 1


async def _settled_status(settings: Any, settle_s: float) -> list[Any]:
    """The stack's status, probed again for up to `settle_s` while a component reads unhealthy.

    Each probe has a short timeout: on a loaded machine one can miss right after the
    supervisor said ready, and `up` should not fail a stack that answers a moment later.
    """
    from rollout.shared.stack.status import collect_status

    deadline = time.monotonic() + settle_s
    while True:
        components = await collect_status(settings)
        if all(c.healthy for c in components) or time.monotonic() >= deadline:
            return components
        await asyncio.sleep(0.5)  # between probes, each with its own timeout


def _verbs_endpoint_elsewhere(settings: Any) -> tuple[str, str, Any] | None:
    """(endpoint, where it comes from, the verbs' settings) when the CLI's other verbs talk to
    another NATS than the stack `status` shows: a key holder's shell (ROLLOUT_ENDPOINT, or
    `rollout login`)."""
    from rollout.shared.auth.credentials import client_settings, same_endpoint

    try:
        used = client_settings()
    except RolloutError:
        return None  # no usable key for it: the verbs themselves say so
    if same_endpoint(used.nats_url, settings.nats_url):
        return None
    return redact_url(used.nats_url), used.endpoint_source or "the CLI's settings", used


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when this home's newest beat of the service is fresh, 1 (saying why) otherwise."""
    from rollout.shared.stack.health import BEATS_DIR, LIVE_INTERVALS, local_beats
    from rollout.shared.stack.projections import stall_limit_s

    known = registry()
    if args.name not in known:
        raise RolloutError(
            f"unknown service {args.name!r}", problems=[f"known: {', '.join(sorted(known))}"]
        )
    if args.max_age is not None and args.max_age <= 0:
        raise RolloutError(f"--max-age {args.max_age}: expected a positive number of seconds")
    # Read first: a bad ROLLOUT_PROJECTION_STALL_S is named whatever the beats say.
    stall_s = stall_limit_s()
    raw_home = os.environ.get("ROLLOUT_HOME")
    home = Path(raw_home).expanduser() if raw_home else default_home()
    beats = local_beats(home / BEATS_DIR, args.name)
    if not beats:
        print(f"{args.name}: unhealthy: no heartbeat accepted yet (in {home / BEATS_DIR})")
        return 1
    newest = min(beats, key=lambda b: b.age)
    limit = args.max_age if args.max_age is not None else newest.interval * LIVE_INTERVALS
    if newest.age > limit:
        print(
            f"{args.name}: unhealthy: last heartbeat accepted {newest.age:.1f}s ago"
            f" (limit {limit:g}s; replica {newest.replica_id})"
        )
        return 1
    if not newest.ready:
        # A probe's answer: a replica whose brokers have not started answers no request yet.
        print(f"{args.name}: unhealthy: still starting (replica {newest.replica_id})")
        return 1
    stalled = None if args.beat_only else _stalled_projection(newest, stall_s)
    if stalled is not None:
        # Its reads come from read models that stopped advancing: route them elsewhere.
        print(f"{args.name}: unhealthy: {stalled} (replica {newest.replica_id})")
        return 1
    print(f"{args.name}: healthy: heartbeat {newest.age:.1f}s ago (replica {newest.replica_id})")
    return 0


def _stalled_projection(beat: Beat, limit: float) -> str | None:
    """Why the beat's read models read as stalled (behind, nothing applied for longer than
    `limit` seconds), or None (caught up, advancing, or no projection)."""
    from rollout.shared.stack.projections import STALL_ENV

    lag = beat.projection
    if lag is None or lag["behind"] <= 0 or lag["stalledS"] <= limit:
        return None
    return (
        f"its read models are {lag['behind']:.0f} event(s) behind and applied nothing for"
        f" {lag['stalledS']:.0f}s (limit {STALL_ENV}={limit:g}s; `rollout status` says why)"
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Run one service until SIGTERM."""
    # Trained names (`BASE:SUFFIX`, job ids) resolve in every service, whatever it imports.
    import rollout.shared.models.trained  # noqa: F401
    from rollout.shared.stack.serve import serve_main

    return serve_main(args.name, args.replica_id)
