"""One key flooding queries, export pages and audits: how long another key's same request waits
behind it, and how long an honest export takes, with no read or costly budget and with the
defaults.

The registry, the tracker and the buffer run as their own processes (`rollout serve`, as a
deployment runs them) on a real nats-server (with keys) and Postgres. Alice's key imports
`--rollouts` scored rollouts (4 imported runs), then exports them all page by page as
`rollout export --buffer` does, and as `rollout export --run` does (each run's rollouts with
trajectories). Then a hostile key sends `--flood` requests at once on its own subject, for
`tracker list_runs`, for one `buffer rollouts` page and (`--audits` of them) for
`registry audit`; a moment later Alice sends the same request through the SDK. Both modes run
in this process, one after the other, each on fresh servers: the same machine load
(shared/service/throttle.py; docs/scaling.md, "A key's reads and costly requests").

    python benchmarks/queries.py [--rollouts 4000] [--flood 2000] [--audits 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline import embedded_servers, env_spec, service_process, stop_processes, wait_answering

from rollout.client import AsyncClient
from rollout.shared import subjects
from rollout.shared.auth.credentials import with_credentials
from rollout.shared.auth.keys import KeyStore
from rollout.shared.auth.roles import Role
from rollout.shared.bus import requests as bus_requests
from rollout.shared.contracts import requests as rq
from rollout.shared.contracts.buffer import RolloutsQuery
from rollout.shared.service.throttle import COSTLY, RATE_LIMITED, READS
from rollout.shared.settings import connect_nats
from rollout.snapshots import export_buffer_rows, export_rows

SLUG = "bench-refunds"
RUNS = 4
# Exports timed per mode (the median is reported): each a few seconds on a shared machine.
REPEAT = 3
# Keys' budgets off: what every query and export page had before they were attributed.
OFF = {READS.env: "0", COSTLY.env: "0"}


class CountingRandom:
    """`random` for the SDK's client that counts the refusals it waits out (the only use of
    `uniform` there): Alice's requests refused for her budget, then resent."""

    def __init__(self) -> None:
        self.refusals = 0

    def uniform(self, low: float, high: float) -> float:
        """random.uniform, counted."""
        self.refusals += 1
        return random.uniform(low, high)


def imported(run: int, count: int, tasks: int) -> rq.ImportRun:
    """`count` scored rollouts spread over the env's tasks, distinct per `run`."""
    return rq.ImportRun(
        env_slug=SLUG,
        name=f"bench import {run}",
        rollouts=[
            rq.ImportedRollout(
                task_index=i % tasks,
                sample_index=i // tasks,
                trajectory={
                    "messages": [
                        {"role": "user", "content": f"Refund order O-{i % tasks} in full"},
                        {"role": "assistant", "content": f"refunded ({run}/{i})"},
                    ],
                    "final_output": f"refunded ({run}/{i})",
                },
                score=float(i % 2),
                passed=bool(i % 2),
            )
            for i in range(count)
        ],
    )


async def flooded(
    nc: Any, subject: str, body: bytes, flood: int, alice: Callable[[], Awaitable[Any]]
) -> dict[str, float]:
    """Send `flood` copies of `body` at once, then time `alice()` while they are answered."""
    started = time.perf_counter()
    sent = asyncio.gather(*(nc.request(subject, body, timeout=600) for _ in range(flood)))
    await asyncio.sleep(0)  # each request is published ...
    await nc.flush()  # ... and at the server before alice asks
    asked = time.perf_counter()
    await alice()
    alice_s = time.perf_counter() - asked
    replies = [json.loads(m.data) for m in await sent]
    return {
        "alice_s": alice_s,
        "flood_s": time.perf_counter() - started,
        "handled": sum(r["error"] != RATE_LIMITED for r in replies),
    }


async def one_mode(env: dict[str, str], rollouts: int, flood: int, audits: int) -> dict[str, Any]:
    """Every measure with `env` as the budgets' settings ({}: the defaults)."""
    saved = {name: os.environ.pop(name, None) for name in OFF}
    os.environ.update(env)
    settings, nats_server, pg = embedded_servers("rollout-bench-queries-")
    names = ("env-registry", "bench-tracker", "buffer")
    procs = [service_process(settings, name) for name in names]
    out: dict[str, Any] = {}
    counting = CountingRandom()
    bus_requests.random = counting  # type: ignore[assignment]
    try:
        store = KeyStore(nats_server.home)
        hostile_key, alice_key = (store.create(Role.RUNNER, n)[1] for n in ("hostile", "alice"))
        nats_server.reload()
        alice = AsyncClient(settings, api_key=alice_key.text, timeout_s=300)
        await wait_answering(alice)
        spec = env_spec()
        await alice.push_environment(spec)
        tasks = len(spec["tasks"])
        run_ids = [
            (await alice.import_run(imported(r, rollouts // RUNS, tasks)))["runId"]
            for r in range(RUNS)
        ]
        query = RolloutsQuery(env_slug=SLUG, include_imported=True)
        # The first export waits for the buffer to apply the imports; the next are timed.
        await export_buffer_rows(alice, query)
        times = []
        for _ in range(REPEAT):
            started = time.perf_counter()
            rows, _ = await export_buffer_rows(alice, query)
            times.append(time.perf_counter() - started)
        out["export_buffer_s"] = statistics.median(times)
        out["exported"] = len(rows)
        times = []
        for _ in range(REPEAT):
            started = time.perf_counter()
            rows = await export_rows(alice, run_ids=run_ids)
            times.append(time.perf_counter() - started)
        out["export_runs_s"] = statistics.median(times)
        assert len(rows) == out["exported"], (len(rows), out["exported"])
        out["exports_refused"] = counting.refusals

        nc = await connect_nats(with_credentials(settings, None, hostile_key.text))
        try:
            who = hostile_key.user
            out["list_runs"] = await flooded(
                nc,
                subjects.request("tracker", "list_runs", who),
                rq.ListRuns(limit=20).model_dump_json().encode(),
                flood,
                lambda: alice.list_runs(),
            )
            page = RolloutsQuery(env_slug=SLUG, include_imported=True, page_size=64)
            out["buffer_page"] = await flooded(
                nc,
                subjects.request("buffer", "rollouts", who),
                page.model_dump_json().encode(),
                flood,
                lambda: alice.request("buffer", "rollouts", page),
            )
            audit = rq.AuditEnvironment(slug=SLUG)
            out["audit"] = await flooded(
                nc,
                subjects.request("registry", "audit", who),
                audit.model_dump_json().encode(),
                audits,
                lambda: alice.audit_environment(SLUG),
            )
        finally:
            await nc.close()
        await alice.close()
        out["alice_refused"] = counting.refusals - out["exports_refused"]
        return out
    finally:
        bus_requests.random = random  # type: ignore[assignment]
        stop_processes(procs)
        nats_server.stop()
        pg.stop()
        shutil.rmtree(settings.home, ignore_errors=True)
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


async def main(rollouts: int, flood: int, audits: int) -> None:
    results = {}
    for label, env in (("no read/costly budget", OFF), ("budgets (default)", {})):
        results[label] = r = await one_mode(env, rollouts, flood, audits)
        print(f"{label}:")
        print(
            f"  export of {r['exported']} rollouts (median of {REPEAT}): "
            f"--buffer {r['export_buffer_s']:.2f} s, --run x{RUNS} {r['export_runs_s']:.2f} s; "
            f"Alice's requests refused for rate {r['exports_refused']} (exports), "
            f"{r['alice_refused']} (behind the floods)"
        )
        for what, n in (("list_runs", flood), ("buffer_page", flood), ("audit", audits)):
            m = r[what]
            print(
                f"  {what}: another key's {m['alice_s']:.2f} s behind {n} at once "
                f"(flood answered in {m['flood_s']:.2f} s, {m['handled']:.0f}/{n} handled)"
            )
    base, new = results["no read/costly budget"], results["budgets (default)"]
    for what in ("list_runs", "buffer_page", "audit"):
        print(
            f"{what}: another key's wait {base[what]['alice_s'] / new[what]['alice_s']:.1f}x "
            f"shorter with the budget"
        )
    for what in ("export_buffer_s", "export_runs_s"):
        print(f"{what}: {new[what] / base[what]:.2f}x the time without a budget")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=4000, help="rollouts to import, export")
    parser.add_argument("--flood", type=int, default=2000, help="queries sent at once")
    parser.add_argument("--audits", type=int, default=200, help="audit requests sent at once")
    args = parser.parse_args()
    asyncio.run(main(args.rollouts, args.flood, args.audits))
