"""Reading one run's history from the events stream: ms per read, one filter and six.

A stream of 200 runs (4 small lifecycle events and 5 larger generated batches each); each
round reads runs' histories one after the other with `shared/bus/reader.py`, by the run's
wildcard and by the six state filters `load_run` reads (merged in stream order). Run it on
two versions of the reader to compare them (docs/scaling.md, "Reads hold no consumer").

    python benchmarks/reads.py [--reads 500] [--runs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import nats

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.stack.nats import start_nats

STATE = ["run_requested", "run_started", "run_work_released", "rollout_scored"]
ENDINGS = ["run_completed", "run_failed"]


async def main(reads: int, runs: int) -> None:
    home = Path(tempfile.mkdtemp(prefix="bench-reads-"))
    server = start_nats(home, port=0, monitor_port=0, attached=True)
    try:
        nc = await nats.connect(server.url, user=server.user, password=server.password)
        js = nc.jetstream()
        await ensure_streams(js)
        for run in range(runs):
            for name in STATE:
                await js.publish(subjects.event("run", f"r{run}", name), b"x" * 200)
            for _ in range(5):
                await js.publish(subjects.event("run", f"r{run}", "rollout_generated"), b"x" * 2000)
        shapes = {
            "one filter": lambda run: subjects.run_events(f"r{run}"),
            "six filters": lambda run: [
                subjects.event("run", f"r{run}", name) for name in STATE + ENDINGS
            ],
        }
        for label, filters in shapes.items():
            started, count = time.perf_counter(), 0
            for i in range(reads):
                count += len([m async for m in read_events(js, filters(i % runs))])
            took = (time.perf_counter() - started) / reads * 1000
            print(f"{label}: {took:.2f} ms per read ({count} messages)")
        consumers = (await js.stream_info(subjects.EVENTS_STREAM)).state.consumer_count
        print(f"consumers left on the stream: {consumers}")
        await nc.close()
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=500)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.reads, args.runs))
