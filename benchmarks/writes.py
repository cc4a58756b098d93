"""One key flooding the tracker with run requests: what it gets recorded, and how long another
key's run request waits behind it, with no write budget and with the default one.

The registry and the tracker run as their own processes (`rollout serve`, as a deployment runs
them) on a real nats-server (with keys) and Postgres. A hostile runner key sends `--flood`
create-run requests at once on its own subject, as a script can; a moment later another
runner key creates one run through the SDK. Each mode gets fresh servers; both run in this
process, the same machine load (shared/service/throttle.py, docs/scaling.md "A key's writes").

    python benchmarks/writes.py [--flood 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import time

from pipeline import embedded_servers, env_spec, service_process, stop_processes, wait_answering

from rollout.client import AsyncClient
from rollout.shared import subjects
from rollout.shared.auth.credentials import with_credentials
from rollout.shared.auth.keys import KeyStore
from rollout.shared.auth.roles import Role
from rollout.shared.contracts import requests as rq
from rollout.shared.service.throttle import RATE_LIMITED, WRITES_PER_KEY_ENV
from rollout.shared.settings import connect_nats

# The tracker accepts the name without asking an actor (none runs here); nothing generates.
MODEL = "bench-scripted:instant"


async def one_mode(budget: str, flood: int) -> dict[str, float]:
    """Measures of one flood with `budget` as ROLLOUT_WRITES_PER_KEY ("": the default)."""
    os.environ[WRITES_PER_KEY_ENV] = budget
    settings, nats_server, pg = embedded_servers("rollout-bench-writes-")
    procs = [service_process(settings, "env-registry"), service_process(settings, "bench-tracker")]
    try:
        store = KeyStore(nats_server.home)
        hostile_key, alice_key = (store.create(Role.RUNNER, n)[1] for n in ("hostile", "alice"))
        nats_server.reload()
        alice = AsyncClient(settings, api_key=alice_key.text, timeout_s=120)
        await wait_answering(alice)
        await alice.push_environment(env_spec())
        nc = await connect_nats(with_credentials(settings, None, hostile_key.text))
        subject = subjects.request("tracker", "create_run", hostile_key.user)
        bodies = [
            rq.CreateRun(env_slug="bench-refunds", model=MODEL, n=1, client_request_id=f"h{i}")
            .model_dump_json()
            .encode()
            for i in range(flood)
        ]
        started = time.perf_counter()
        sent = asyncio.gather(*(nc.request(subject, body, timeout=300) for body in bodies))
        await asyncio.sleep(0)  # each request is published ...
        await nc.flush()  # ... and at the server before alice asks
        asked = time.perf_counter()
        await alice.create_run("bench-refunds", MODEL, n=1)
        alice_s = time.perf_counter() - asked
        replies = [json.loads(m.data) for m in await sent]
        flood_s = time.perf_counter() - started
        await nc.close()
        await alice.close()
        return {
            "alice_s": alice_s,
            "flood_s": flood_s,
            "recorded": sum(r["ok"] for r in replies),
            "limited": sum(r["error"] == RATE_LIMITED for r in replies),
        }
    finally:
        stop_processes(procs)
        nats_server.stop()
        pg.stop()
        shutil.rmtree(settings.home, ignore_errors=True)


async def main(flood: int) -> None:
    results = {}
    for label, budget in (("no budget", "0"), ("budget (default)", "")):
        results[label] = r = await one_mode(budget, flood)
        print(
            f"{label}: another key's run request {r['alice_s']:.2f} s; flood answered in "
            f"{r['flood_s']:.2f} s; runs recorded {r['recorded']:.0f}/{flood}, "
            f"refused for rate {r['limited']:.0f}"
        )
    base, new = results["no budget"], results["budget (default)"]
    print(
        f"another key's wait: {base['alice_s'] / new['alice_s']:.1f}x shorter with the budget; "
        f"runs the flood recorded: {base['recorded'] / max(new['recorded'], 1):.1f}x fewer"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=2000, help="create-run requests at once")
    asyncio.run(main(parser.parse_args().flood))
