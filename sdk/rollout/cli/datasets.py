"""Dataset verbs: `generate` (batch inference), `export` and `import` (scored-rollout snapshots)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.cli._common import (
    env_ref,
    note_if_stale,
    note_judges_nothing,
    print_json,
    said_when_stopped,
)
from rollout.errors import RolloutError

if TYPE_CHECKING:
    from rollout.generate import GenerateRequest, Progress


def register(sub: argparse._SubParsersAction) -> None:
    """Add the dataset verbs."""
    p = sub.add_parser(
        "generate",
        help="batch inference: a model over an env's tasks or a prompts file, rows to a file",
        description="Run MODEL over an environment's tasks (--env, optionally one --split) or "
        'over FILE.jsonl (--prompts: one {"prompt": str} or {"messages": [chat turns ending '
        'with the user turn to answer]} per line, optional "id" and "answer") through the actor pool, as a run, and write '
        "one row per rollout to --out (FILE.jsonl or FILE.parquet; opens with "
        "datasets.load_dataset). Re-running the same command after a kill resumes it: rows "
        "already written are kept and none is written twice (state in OUT.generate.json); a "
        "second generate on an --out that one is writing is refused (lock: OUT.generate.lock).",
    )
    p.add_argument("--model", required=True, help="e.g. local/tiny-agent, http://host/v1#NAME")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--env", metavar="SLUG[@VERSION]", help="a registered environment (@VERSION: --env-version)"
    )
    source.add_argument("--prompts", type=Path, metavar="FILE.jsonl", help="a prompts file")
    p.add_argument("--split", help="only the env's tasks of this split")
    p.add_argument("--env-version", type=int, help="that version of --env (default: newest)")
    p.add_argument("--out", required=True, type=Path, metavar="FILE.jsonl|FILE.parquet")
    p.add_argument("-n", "--n", type=int, default=1, help="samples per task or prompt")
    p.add_argument(
        "--score", action="store_true", help="also write the verifier's verdict (score, passed)"
    )
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--max-tool-calls", type=int, default=16)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=16, help="rollouts per work item")
    p.add_argument("--deadline", type=float, default=3600.0, help="seconds before the run fails")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=lambda a: asyncio.run(_generate(a)))

    p = sub.add_parser(
        "export",
        help="scored rollouts of runs or of the buffer as a dataset with lineage (hf, parquet, jsonl)",
        description="Write every scored rollout of --run RUN (repeatable), of every completed "
        "run of --env SLUG, or of the buffer (--buffer, selected by --env, --env-version, "
        "--verdict, --policy-version, --since) as one row: trajectory, tools, score, passed, "
        "outcome, primitives and lineage (run id, model, policy version, env slug/version/hash, "
        "seed). --format hf writes a datasets.save_to_disk folder (a new or empty one, or an "
        "earlier hf export, which it replaces); parquet and jsonl one file (a new or empty one, "
        "or an earlier export of that format); without --format, --out's suffix (.jsonl, "
        ".parquet) names it. "
        "`rollout import` reads them back; `rollout improve --dataset` trains on them.",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--run", dest="runs", action="append", metavar="RUN", help="a run id")
    what.add_argument(
        "--buffer", action="store_true", help="select from every scored rollout the buffer holds"
    )
    p.add_argument(
        "--env", help="every completed run of this env (with --buffer: only its rollouts)"
    )
    p.add_argument("--env-version", type=int, help="with --buffer: only this version of --env")
    p.add_argument(
        "--verdict", choices=("passed", "failed"), help="with --buffer: only these verdicts"
    )
    p.add_argument(
        "--policy-version", dest="policy_versions", type=int, action="append", metavar="V",
        help="with --buffer: only rollouts of this policy version (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--since", metavar="TIME",
        help="with --buffer: only rollouts scored since TIME (ISO 8601, or 30m, 2h, 7d ago)",
    )  # fmt: skip
    p.add_argument(
        "--format", choices=("hf", "parquet", "jsonl"), default=None,
        help="default: from --out's suffix (FILE.jsonl or FILE.parquet)",
    )  # fmt: skip
    p.add_argument("--out", required=True, type=Path, metavar="PATH")
    p.add_argument("--include-errored", action="store_true", help="keep errored rollouts too")
    p.add_argument(
        "--include-imported", action="store_true",
        help="with --buffer: also imported runs' rollouts (rewards recorded elsewhere, e.g. ART,"
        " not verified here; their rows carry source 'art')",
    )  # fmt: skip
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: asyncio.run(_export(a)))

    p = sub.add_parser(
        "import",
        help="an exported dataset back as scored rollouts and its SFT/DPO/KTO/GRPO sets",
        description="Read PATH (an export: .jsonl, .parquet or a save_to_disk folder), check "
        "every row (a bad one is named by file, row and field, and nothing is written), and "
        "write DIR/rollouts.jsonl plus DIR/sft.jsonl, dpo.jsonl, kto.jsonl and grpo.jsonl, "
        "built exactly as the buffer builds them for training. DIR must be new, empty or an "
        "earlier import's folder (replaced whole); a folder holding other files is refused.",
    )
    p.add_argument("path", type=Path, metavar="PATH")
    p.add_argument("-o", "--out", required=True, type=Path, metavar="DIR")
    p.add_argument("--min-margin", type=float, default=0.0, help="DPO pair score gap")
    p.add_argument(
        "--include-held-out",
        action="store_true",
        help="build the sets from rollouts of held-out tasks too (left out by default)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_import)


async def _generate(args: argparse.Namespace) -> int:
    from rollout.generate import GenerateRequest, Progress

    env, version = args.env, args.env_version
    if env is not None:
        env, version = env_ref(env, version, "--env")
    req = GenerateRequest(
        model=args.model,
        out=args.out,
        env=env,
        prompts=args.prompts,
        split=args.split,
        env_version=version,
        n=args.n,
        score=args.score,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        max_tool_calls=args.max_tool_calls,
        seed=args.seed,
        batch_size=args.batch_size,
        deadline_s=args.deadline,
    )
    req.format  # noqa: B018  (a bad suffix is refused before anything connects)
    progress = Progress(req, quiet=args.json)
    # Ctrl-C or SIGTERM: said how far it got and how to resume (the rows written are durable).
    return await said_when_stopped(_generate_rows(args, req, progress), progress.stopped_line)


async def _generate_rows(args: argparse.Namespace, req: GenerateRequest, progress: Progress) -> int:
    from rollout.client import AsyncClient
    from rollout.generate import generate

    client = AsyncClient()
    try:
        result = await generate(client, req, progress=progress)
    finally:
        await client.close()
    if result.missing:
        # Rows whose trajectories neither the object store nor the read models gave: not
        # written (an empty conversation read as a real one), said by prompt; a re-run resumes.
        error = result.missing_error()
        if not args.json:
            raise error
        print_json(result.to_json() | {"error": error.message, "problems": error.problems})
        return 1
    if args.json:
        print_json(result.to_json())
    else:
        sys.stderr.write("\n")
        how = f"{result.written_now} new, resumed" if result.resumed else "all new"
        print(f"run {result.run_id} {result.status}: {result.rows} rows ({how}) -> {result.out}")
        if result.reason:
            print(f"  reason: {result.reason}")
        if result.no_verdict:
            # The run's verdicts pass every reply: said here, and no pass rate is shown for it.
            print(f"  {result.no_verdict}; give every line an 'answer' to score them")
    return 0 if result.status == "completed" else 1


def _since(text: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone) or a span back from now: 30m, 2h, 7d."""
    spans = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value = text.strip()
    if value[-1:].lower() in spans and value[:-1].isdigit():
        try:
            return datetime.now(UTC) - timedelta(seconds=int(value[:-1]) * spans[value[-1].lower()])
        except OverflowError:
            raise RolloutError(
                f"--since {text!r}: reaches back before the year 1",
                problems=["leave --since out to select rollouts of any time"],
            ) from None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise RolloutError(
            f"--since {text!r}: not a time",
            problems=["give an ISO 8601 time (2026-12-01T14:00) or a span: 30m, 2h, 7d"],
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _buffer_query(args: argparse.Namespace) -> Any:
    """The buffer selection --buffer asks for; filters without --buffer are refused."""
    from pydantic import ValidationError

    from rollout.shared.aggregates.run_options import MAX_VERSION
    from rollout.shared.contracts.buffer import RolloutsQuery

    filters = {
        "--env-version": args.env_version,
        "--verdict": args.verdict,
        "--policy-version": args.policy_versions,
        "--since": args.since,
        "--include-imported": args.include_imported or None,
    }
    if not args.buffer:
        given = [name for name, value in filters.items() if value is not None]
        if given:
            raise RolloutError(f"{', '.join(given)}: select from the buffer; add --buffer")
        if bool(args.runs) == bool(args.env):
            raise RolloutError("give one of --run RUN, --env SLUG or --buffer (with its filters)")
        return None
    if args.env_version is not None and not args.env:
        raise RolloutError("--env-version: needs --env SLUG (the env it is a version of)")
    # Versions are kept in int columns: past 32 bits one failed in the buffer as "exceeded
    # maximum size"; below the first (env 1, policy 0) one matches nothing.
    if args.env_version is not None and not 1 <= args.env_version <= MAX_VERSION:
        raise RolloutError(
            f"--env-version {args.env_version}: no environment has that version",
            problems=[f"versions are whole numbers from 1 to {MAX_VERSION}"],
        )
    for version in args.policy_versions or []:
        if not 0 <= version <= MAX_VERSION:
            raise RolloutError(
                f"--policy-version {version}: no policy has that version",
                problems=[f"versions are whole numbers from 0 to {MAX_VERSION}"],
            )
    try:
        return RolloutsQuery(
            env_slug=args.env,
            env_version=args.env_version,
            verdict=args.verdict,
            include_errored=args.include_errored,
            policy_versions=args.policy_versions,
            since=_since(args.since) if args.since is not None else None,
            include_imported=args.include_imported,
        )
    except ValidationError as exc:
        names = {"env_version": "--env-version", "verdict": "--verdict"}
        problems = [
            f"{names.get(str(e['loc'][0]) if e['loc'] else '', '--buffer')}: {e['msg']}"
            for e in exc.errors()
        ]
        raise RolloutError("bad --buffer selection", problems=problems) from None


async def _export(args: argparse.Namespace) -> int:
    from rollout.client import AsyncClient
    from rollout.snapshots import (
        check_export_out,
        export_buffer_rows,
        export_format,
        export_rows,
        lineage,
        write_snapshot,
    )

    query = _buffer_query(args)
    # Before the export's work (and before connecting), not after it.
    fmt = export_format(args.out, args.format)
    check_export_out(args.out, fmt)
    skipped = 0
    unjudged: set[str] = set()
    client = AsyncClient()
    try:
        if query is not None:
            rows, skipped = await export_buffer_rows(client, query, unjudged=unjudged)
        else:
            rows = await export_rows(
                client,
                run_ids=args.runs,
                env_slug=args.env,
                include_errored=args.include_errored,
                unjudged=unjudged,
            )
    finally:
        await client.close()
    # The runs' rollouts came from the read models: a stalled projector leaves some out.
    note_if_stale(client.read_models)
    # Their "passed" (what --verdict passed selects) measured nothing: said, not hidden.
    note_judges_nothing("the exported rollouts", unjudged)
    path = write_snapshot(rows, args.out, fmt)
    summary: dict[str, Any] = {
        "out": str(path),
        "format": fmt,
        "runs": sorted({r["run_id"] for r in rows}),
        "lineage": lineage(rows),
        "skipped": skipped,
        "rows": len(rows),
        "readModels": client.read_models,
        # The envs (slug@version) of exported rollouts whose verdicts measured nothing.
        "judgesNothing": sorted(unjudged),
    }
    if args.json:
        print_json(summary)
    else:
        print(f"{len(rows)} rollouts of {len(summary['runs'])} run(s) -> {path} ({fmt})")
        if skipped:
            print(f"  {skipped} selected rollout(s) had no trajectory and were left out")
    return 0


def _import(args: argparse.Namespace) -> int:
    from rollout.snapshots import import_snapshot

    counts = import_snapshot(
        args.path, args.out, min_margin=args.min_margin, include_held_out=args.include_held_out
    )
    if args.json:
        print_json({"out": str(args.out), **counts})
    else:
        sets = ", ".join(
            f"{n} {name}" for name, n in counts.items() if name not in ("rollouts", "heldOut")
        )
        print(f"{counts['rollouts']} rollouts imported -> {args.out} ({sets})")
        if counts["heldOut"]:
            # As `rollout improve` says: the sets are for training, and held-out tasks are not.
            print(f"  left out {counts['heldOut']} rollouts of held-out tasks from the sets"
                  " (--include-held-out to train on them)")  # fmt: skip
    return 0
