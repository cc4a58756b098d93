"""`rollout status`: each component's address, health and pid, probed live, and how far each
read-model projector is behind the events stream."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg
from nats.errors import Error as NatsError

from rollout.shared.errors import RolloutError
from rollout.shared.service import durables
from rollout.shared.settings import Settings, connect_nats, redact_url
from rollout.shared.stack.health import read_beats
from rollout.shared.stack.nats import health_problem, jetstream_report
from rollout.shared.stack.process import LOOPBACK, ProcessRef
from rollout.shared.stack.projections import Lag, last_failure, projection_lag, stall_limit_s
from rollout.shared.stack.services import selected
from rollout.shared.stack.supervisor import read_state

PROBE_TIMEOUT = 3.0


@dataclass
class Component:
    """One line of `rollout status`."""

    name: str
    kind: str
    address: str
    healthy: bool
    pid: int | None = None
    detail: str = ""
    external: bool = False
    replicas: list[dict[str, Any]] = field(default_factory=list)
    # What to do about it, when unhealthy (a line under the table).
    hint: str = ""


async def collect_status(settings: Settings, *, stall_s: float | None = None) -> list[Component]:
    """Probe NATS (connect + JetStream), Postgres (a query), every service's heartbeats and
    each read-model projector's lag (unhealthy once stalled `stall_s`; default from the env)."""
    stall_s = stall_limit_s() if stall_s is None else stall_s
    state = read_state(settings.home)
    running = state.get("phase") in ("starting", "ready")
    components: list[Component] = []

    nodes = [] if settings.external_nats else (state.get("nats") or {}).get("nodes") or []
    nc = None
    if nodes:
        # A cluster: one line per node, each asked directly (its health, the meta leader).
        components += await asyncio.to_thread(_cluster_components, nodes)
        if any(c.pid is not None for c in components):
            try:
                nc = await connect_nats(
                    settings, connect_timeout=PROBE_TIMEOUT, name="rollout-status"
                )
            except RolloutError:
                nc = None  # no node answers: the node lines say so; beats are unknown
    else:
        nats_pid = _live_pid(state.get("nats"))
        nats = Component(
            "nats",
            "server",
            redact_url(settings.nats_url),
            False,
            nats_pid,
            "",
            settings.external_nats,
        )
        components.append(nats)
        if settings.external_nats or nats_pid is not None:
            try:
                nc = await connect_nats(
                    settings, connect_timeout=PROBE_TIMEOUT, name="rollout-status"
                )
                info = await nc.jetstream().account_info()
                nats.healthy = True
                nats.detail = f"jetstream: {info.streams} streams"
                monitor_port = (state.get("nats") or {}).get("monitor_port")
                if not settings.external_nats and monitor_port:
                    monitor = f"http://{LOOPBACK}:{monitor_port}"
                    problem = await asyncio.to_thread(
                        health_problem, monitor, PROBE_TIMEOUT, unreachable=False
                    )
                    if problem:
                        nats.healthy = False
                        nats.detail += f"; nats-server says: {problem}"
            except (RolloutError, Exception) as exc:  # any failure is just "unhealthy" here
                nats.detail = str(exc).splitlines()[0]
        else:
            nats.detail = "stopped (run `rollout up`)"

    pg_pid = _live_pid(state.get("postgres"))
    url = settings.database_url
    pg = Component(
        "postgres",
        "server",
        redact_url(url) if url else "-",
        False,
        pg_pid,
        "",
        settings.external_database,
    )
    components.append(pg)
    if url and (settings.external_database or pg_pid is not None):
        pg.healthy, pg.detail = await _probe_postgres(url)
    else:
        pg.detail = "stopped (run `rollout up`)"

    recorded = state.get("services") or {}
    names = list(recorded) or selected()
    served = {(recorded.get(name) or {}).get("service", name) for name in names}
    beats = []
    lags: dict[str, Lag | None | str] = {}
    if nc is not None:
        try:
            beats = await read_beats(nc.jetstream())
            js = nc.jetstream(timeout=PROBE_TIMEOUT)
            wanted = [s for s in durables.PROJECTIONS if s in served]
            # Side by side: a server slow to answer costs `status` one probe timeout, not one
            # per projection.
            found = await asyncio.gather(
                *(projection_lag(js, durables.PROJECTIONS[s], PROBE_TIMEOUT) for s in wanted),
                return_exceptions=True,
            )
            for service, lag in zip(wanted, found, strict=True):
                if isinstance(lag, NatsError | TimeoutError):
                    lags[service] = str(lag) or type(lag).__name__
                elif isinstance(lag, BaseException):
                    raise lag
                else:
                    lags[service] = lag
        finally:
            await nc.close()
    for name in names:
        entry = recorded.get(name) or {}
        of = entry.get("service", name)
        # A second replica the supervisor runs (`tracker-2`) is its own line: its own beat.
        # The service's own line takes any other beat of it (a replica served elsewhere), but
        # never another supervised replica's: that one would hide this one being down.
        others = {
            other.get("replica_id")
            for key, other in recorded.items()
            if key != name and other.get("service", key) == of
        }
        mine = [
            b
            for b in beats
            if b.service == of
            and (
                b.replica_id == entry.get("replica_id")
                or (of == name and b.replica_id not in others)
            )
        ]
        live = [b for b in mine if b.live]
        service = Component(
            name,
            "service",
            "-",
            bool(live),
            _live_pid(entry),
            replicas=[b.to_dict() for b in mine],
        )
        if live:
            newest = min(b.age for b in live)
            service.detail = f"{len(live)} live replica(s), last beat {newest:.1f}s ago"
            if starting := sum(1 for b in live if not b.ready):
                # Alive but its brokers not started: it answers nothing yet.
                service.healthy = starting < len(live)
                service.detail += f", {starting} still starting"
        elif not running and not settings.external_nats:
            service.detail = "stopped"
        else:
            service.detail = "no live heartbeat"
            if entry.get("restarts"):
                service.detail += f" (restarted {entry['restarts']}x; log: {entry.get('log')})"
        components.append(service)
    for service, lag in lags.items():
        log = next(
            (e.get("log") for key, e in recorded.items() if e.get("service", key) == service),
            None,
        )
        components.append(_projection_line(service, lag, beats, stall_s, log))
    return components


async def endpoint_projections(
    settings: Settings, *, stall_s: float | None = None
) -> list[Component]:
    """Each read-model projector's lag at the endpoint `settings` name (a key holder's: its key
    may read those consumers' info, nothing else of the stack), as `collect_status` lines.

    A key reads no heartbeats: a stalled projector's last error is its operator's to see.
    One line naming the endpoint instead when it cannot be reached.
    """
    stall_s = stall_limit_s() if stall_s is None else stall_s
    address = redact_url(settings.nats_url)
    try:
        nc = await connect_nats(settings, connect_timeout=PROBE_TIMEOUT, name="rollout-status")
    except RolloutError as exc:
        return [Component("endpoint", "server", address, False, detail=str(exc).splitlines()[0])]
    try:
        js = nc.jetstream(timeout=PROBE_TIMEOUT)
        wanted = list(durables.PROJECTIONS)
        found = await asyncio.gather(
            *(projection_lag(js, durables.PROJECTIONS[s], PROBE_TIMEOUT) for s in wanted),
            return_exceptions=True,
        )
    finally:
        await nc.close()
    lines = []
    for service, lag in zip(wanted, found, strict=True):
        if isinstance(lag, NatsError | TimeoutError):
            lag = str(lag) or type(lag).__name__
        elif isinstance(lag, BaseException):
            raise lag
        lines.append(_projection_line(service, lag, [], stall_s, None))
    return lines


def _projection_line(
    service: str, lag: Lag | None | str, beats: list[Any], stall_s: float, log: str | None
) -> Component:
    """One read-model projector: healthy unless behind and not advancing for `stall_s`."""
    consumer = durables.PROJECTIONS[service]
    line = Component(consumer.title, "projection", consumer.name, True)
    if lag is None:
        line.detail = f"no consumer yet (created when {service} starts)"
        return line
    if isinstance(lag, str):
        line.healthy = False
        line.detail = f"cannot read its consumer: {lag}"
        return line
    if lag.behind == 0:
        line.detail = f"caught up (applied through event {lag.applied})"
        return line
    stalled = lag.stalled_s > stall_s
    line.detail = f"{lag.behind} event(s) behind, no progress for {lag.stalled_s:.1f}s"
    if stalled:
        line.healthy = False
        line.detail = f"STALLED: {line.detail} (limit {stall_s:g}s)"
    failure = last_failure([b for b in beats if b.service == service], consumer)
    if failure is not None:
        line.detail += f"; last error ({failure[1]:.0f}s ago): {failure[0]}"
    if stalled:
        where = f" ({log})" if log else ""
        line.hint = (
            f"what it writes to Postgres is {lag.behind} event(s) stale (`rollout show`, the"
            f" viewer and exports read it): see {service}'s log{where} and Postgres (free disk,"
            " the service user's table privileges, triggers, constraints); it applies the"
            " backlog by itself once it can write"
        )
    return line


def _cluster_components(nodes: list[dict[str, Any]]) -> list[Component]:
    """One component per cluster node: healthy when its JetStream is current with the
    cluster; the detail names its role and the meta leader it follows."""
    components = []
    for entry in nodes:
        name = f"nats-{entry.get('node')}"
        pid = _live_pid(entry)
        node = Component(name, "server", str(entry.get("url") or "-"), False, pid)
        components.append(node)
        if pid is None:
            node.detail = "stopped"
            continue
        monitor = f"http://{LOOPBACK}:{entry.get('monitor_port')}"
        problem = health_problem(monitor, PROBE_TIMEOUT)
        node.healthy = problem is None
        report = jetstream_report(monitor, PROBE_TIMEOUT) or {}
        leader = (report.get("meta_cluster") or {}).get("leader")
        role = "meta leader" if leader and leader == entry.get("name") else "follower"
        node.detail = (
            f"{entry.get('name')}: {role} (leader {leader}), {report.get('streams', 0)} streams"
            if leader
            else f"{entry.get('name')}: no JetStream leader in reach"
        )
        if problem:
            node.detail += f"; nats-server says: {problem}"
    return components


async def _probe_postgres(url: str) -> tuple[bool, str]:
    try:
        conn = await asyncpg.connect(url, timeout=PROBE_TIMEOUT)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return False, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    try:
        version = await asyncio.wait_for(conn.fetchval("show server_version"), PROBE_TIMEOUT)
    finally:
        await conn.close()
    return True, f"postgres {version}"


def _live_pid(entry: dict[str, Any] | None) -> int | None:
    ref = ProcessRef.from_dict(entry)
    return ref.pid if ref is not None and ref.alive() else None


def as_json(components: list[Component]) -> dict[str, Any]:
    """The `status --json` document."""
    return {
        "healthy": all(c.healthy for c in components),
        "components": [asdict(c) for c in components],
    }


def as_table(components: list[Component]) -> str:
    """A plain-text table for people."""
    rows = [("COMPONENT", "HEALTH", "ADDRESS", "PID", "DETAIL")]
    for c in components:
        health = "healthy" if c.healthy else "UNHEALTHY"
        address = c.address + (" (external)" if c.external else "")
        rows.append((c.name, health, address, str(c.pid or "-"), c.detail))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True))
        + "  "
        + row[4]
        for row in rows
    ]
    lines += [f"{c.name}: {c.hint}" for c in components if c.hint and not c.healthy]
    return "\n".join(lines)
