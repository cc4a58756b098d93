"""`rollout replay RUN [--reverify]`: rebuild a run from its events; re-score its trajectories."""

from __future__ import annotations

import argparse
import asyncio

from rollout.cli._common import client_settings_or_error, print_json
from rollout.cli.experiments import replay_plan_command
from rollout.errors import RolloutError
from rollout.shared.settings import connect_nats
from rollout.shared.stats import format_interval


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `replay` verb."""
    p = sub.add_parser("replay", help="rebuild a run from its events (--reverify to re-score)")
    p.add_argument("run_id", metavar="RUN", nargs="?")
    p.add_argument("--plan", help="rebuild an experiment plan's stages and outcomes instead")
    p.add_argument(
        "--reverify", action="store_true", help="score the trajectories with today's verifier"
    )
    p.add_argument(
        "--env-version",
        type=int,
        default=None,
        help="verifier of this env version (default: newest)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_dispatch)


def _dispatch(args: argparse.Namespace) -> int:
    if args.plan:
        return replay_plan_command(args)
    if not args.run_id:
        raise RolloutError("rollout replay needs RUN (or --plan PLAN_ID)")
    return asyncio.run(_replay(args))


async def _replay(args: argparse.Namespace) -> int:
    from rollout.shared.replay import replay_run, reverify
    from rollout.shared.store.trajectories import object_store

    settings = client_settings_or_error()
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        run = await replay_run(js, args.run_id)
        version, rows = None, None
        if args.reverify:
            async with object_store(settings) as store:
                version, rows = await reverify(js, run, env_version=args.env_version, store=store)
    finally:
        await nc.close()
    summary = run.summary()
    changed = [r for r in rows or [] if r["changed"]]
    if args.json:
        doc = {"run": summary}
        if rows is not None:
            doc |= {"envVersion": version, "reverified": len(rows), "changed": changed}
        print_json(doc)
        return 0
    # As `rollout show` gives them: with its 95% interval, and none without a verdict.
    interval = summary["passRateInterval"]
    rate = f"{summary['passRate']:.1%} {format_interval(tuple(interval))}" if interval else "-"
    score = f"{summary['meanScore']:.3f}" if interval else "-"
    print(f"run {summary['runId']} from {summary['events']} events: {summary['status']}"
          f"  scored {summary['scored']}/{summary['total']}  pass rate {rate}"
          f"  mean score {score}")  # fmt: skip
    if rows is not None:
        print(f"re-scored {len(rows)} trajectories with the verifier of v{version}:"
              f" {len(changed)} changed")  # fmt: skip
        for r in changed:
            print(f"  {r['rolloutId']}  task {r['taskIndex']} #{r['sampleIndex']}:"
                  f" {r['recordedScore']} -> {r['score']:.3f}  {'; '.join(r['reasons'])}")  # fmt: skip
    return 0
