"""Dataset verbs: `generate` (batch inference), `export` and `import` (scored-rollout snapshots)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

# Trained names (`BASE:SUFFIX`, job ids) resolve for --model like everywhere else.
import rollout.shared.models.trained  # noqa: F401
from rollout.cli._common import print_json
from rollout.client import AsyncClient


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
        "already written are kept and none is written twice (state in OUT.generate.json).",
    )
    p.add_argument("--model", required=True, help="e.g. local/tiny-agent, http://host/v1#NAME")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--env", help="a registered environment's slug")
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
        help="scored rollouts of runs as a dataset with lineage (hf, parquet or jsonl)",
        description="Write every scored rollout of --run RUN (repeatable) or of every run of "
        "--env SLUG as one row: trajectory, tools, score, passed, outcome, primitives and "
        "lineage (run id, model, policy version, env slug/version/hash, seed). --format hf "
        "writes a datasets.save_to_disk folder; parquet and jsonl one file. `rollout import` "
        "reads them back.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", dest="runs", action="append", metavar="RUN", help="a run id")
    what.add_argument("--env", help="every completed run of this environment")
    p.add_argument("--format", choices=("hf", "parquet", "jsonl"), default="jsonl")
    p.add_argument("--out", required=True, type=Path, metavar="PATH")
    p.add_argument("--include-errored", action="store_true", help="keep errored rollouts too")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: asyncio.run(_export(a)))

    p = sub.add_parser(
        "import",
        help="an exported dataset back as scored rollouts and its SFT/DPO/KTO/GRPO sets",
        description="Read PATH (an export: .jsonl, .parquet or a save_to_disk folder), check "
        "every row (a bad one is named by file, row and field, and nothing is written), and "
        "write DIR/rollouts.jsonl plus DIR/sft.jsonl, dpo.jsonl, kto.jsonl and grpo.jsonl, "
        "built exactly as the buffer builds them for training.",
    )
    p.add_argument("path", type=Path, metavar="PATH")
    p.add_argument("-o", "--out", required=True, type=Path, metavar="DIR")
    p.add_argument("--min-margin", type=float, default=0.0, help="DPO pair score gap")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_import)


async def _generate(args: argparse.Namespace) -> int:
    from rollout.generate import GenerateRequest, generate, progress_bar

    req = GenerateRequest(
        model=args.model,
        out=args.out,
        env=args.env,
        prompts=args.prompts,
        split=args.split,
        env_version=args.env_version,
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
    client = AsyncClient()
    try:
        result = await generate(client, req, progress=None if args.json else progress_bar)
    finally:
        await client.close()
    if args.json:
        print_json(result.to_json())
    else:
        sys.stderr.write("\n")
        how = f"{result.written_now} new, resumed" if result.resumed else "all new"
        print(f"run {result.run_id} {result.status}: {result.rows} rows ({how}) -> {result.out}")
        if result.reason:
            print(f"  reason: {result.reason}")
    return 0 if result.status == "completed" else 1


async def _export(args: argparse.Namespace) -> int:
    from rollout.snapshots import export_rows, write_snapshot

    client = AsyncClient()
    try:
        rows = await export_rows(
            client, run_ids=args.runs, env_slug=args.env, include_errored=args.include_errored
        )
    finally:
        await client.close()
    path = write_snapshot(rows, args.out, args.format)
    summary: dict[str, Any] = {
        "out": str(path),
        "format": args.format,
        "rows": len(rows),
        "runs": sorted({r["run_id"] for r in rows}),
    }
    if args.json:
        print_json(summary)
    else:
        print(f"{len(rows)} rollouts of {len(summary['runs'])} run(s) -> {path} ({args.format})")
    return 0


def _import(args: argparse.Namespace) -> int:
    from rollout.snapshots import import_snapshot

    counts = import_snapshot(args.path, args.out, min_margin=args.min_margin)
    if args.json:
        print_json({"out": str(args.out), **counts})
    else:
        sets = ", ".join(f"{n} {name}" for name, n in counts.items() if name != "rollouts")
        print(f"{counts['rollouts']} rollouts imported -> {args.out} ({sets})")
    return 0
