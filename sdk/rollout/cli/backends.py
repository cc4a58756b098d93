"""`rollout backends list`, `rollout env serve|export-verifiers`, `rollout art export|import`."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollout.cli._common import client_settings_or_error, port_number, print_json
from rollout.cli.env_specs import resolve_spec
from rollout.shared.interop.backends import describe
from rollout.shared.service.sockets import bind


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `backends` and `env` verbs."""
    backends = sub.add_parser("backends", help="multi-turn rollout backends (ART, OpenEnv, ...)")
    verbs = backends.add_subparsers(dest="backends_command", metavar="VERB", required=True)
    listing = verbs.add_parser("list", help="the closed allow-list, what each needs, installed?")
    listing.add_argument("--json", action="store_true", help="print one JSON document")
    listing.set_defaults(func=_list)

    env = sub.add_parser("env", help="expose an environment to other ecosystems")
    env_verbs = env.add_subparsers(dest="env_command", metavar="VERB", required=True)
    serve = env_verbs.add_parser(
        "serve",
        help="serve an env as an OpenEnv server (HTTP + WebSocket)",
        description="Serve SLUG (a registered env) or FILE (a .py defining Environment(s)) with "
        "OpenEnv's HTTP routes (/health /metadata /schema /reset /step /state) and /ws sessions.",
    )
    serve.add_argument("env", metavar="SLUG|FILE")
    serve.add_argument("--slug", help="which environment of FILE (when it defines several)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=port_number, default=8000)
    serve.add_argument(
        "--protocol",
        choices=("openenv", "nemo-gym"),
        default="openenv",
        help="openenv (default): OpenEnv's HTTP + /ws; nemo-gym: a NeMo Gym resources server "
        "(/seed_session, a POST per tool, /verify)",
    )
    serve.set_defaults(func=_serve)

    export = env_verbs.add_parser(
        "export-verifiers",
        help="write an env as a verifiers (v1) taskset module",
        description="Write DIR/<slug>.py: a verifiers taskset whose tasks are the env's tasks "
        "and whose reward is rollout's verifier (load it with verifiers' own loader).",
    )
    export.add_argument("env", metavar="SLUG|FILE")
    export.add_argument("--slug", help="which environment of FILE (when it defines several)")
    export.add_argument("-o", "--out", required=True, metavar="DIR")
    export.add_argument("--name", help="module name (default: the slug with _ for -)")
    export.set_defaults(func=_export_verifiers)

    art_cmd = sub.add_parser("art", help="OpenPipe ART: trajectory groups out and in")
    art_verbs = art_cmd.add_subparsers(dest="art_command", metavar="VERB", required=True)
    art_export = art_verbs.add_parser(
        "export", help="a run's rollouts as ART TrajectoryGroups (JSONL, one group per task)"
    )
    art_export.add_argument("run", metavar="RUN")
    art_export.add_argument("-o", "--out", required=True, metavar="FILE")
    art_export.set_defaults(func=_art_export)
    art_import = art_verbs.add_parser(
        "import",
        help="ART TrajectoryGroups (JSONL) into the buffer as an imported run (--env), or as "
        "scored rollouts and their SFT/DPO/GRPO sets in a folder (-o)",
        description="Read FILE (one ART TrajectoryGroup per line) and check every group and "
        "trajectory (a bad one is named by file, line, group, trajectory and field, and "
        "nothing is recorded). With --env SLUG: record them as a completed run of that "
        "environment (group i is task i unless its metadata names task_index), shown by "
        "`rollout runs` and `rollout compare`, its rollouts in the buffer for `rollout "
        "improve --run RUN`; importing the same file again names the same run and records "
        "nothing twice. With -o DIR: write DIR/rollouts.jsonl (one scored rollout per line: "
        "trajectory, tools, score, passed) and DIR/sft.jsonl, DIR/dpo.jsonl, DIR/grpo.jsonl.",
    )
    art_import.add_argument("file", metavar="FILE")
    where = art_import.add_mutually_exclusive_group(required=True)
    where.add_argument("--env", metavar="SLUG", help="record an imported run of this env")
    where.add_argument("-o", "--out", metavar="DIR", help="write training sets to DIR")
    art_import.add_argument("--env-version", type=int, help="that version of --env")
    art_import.add_argument(
        "--model", default="imported/art", help="the run's model label (default imported/art)"
    )
    art_import.add_argument("--name", help="the imported run's name")
    art_import.add_argument("--json", action="store_true", help="print the result as JSON")
    art_import.add_argument(
        "--pass-at", type=float, default=1.0, help="reward that passes (when no passed metric)"
    )
    art_import.add_argument("--min-margin", type=float, default=0.0, help="DPO pair score gap")
    art_import.set_defaults(func=_art_import)


def _list(args: argparse.Namespace) -> int:
    rows = describe()
    if args.json:
        print_json({"backends": rows})
        return 0
    for row in rows:
        needs = (
            ", ".join(
                f"{r['pip']} ({'installed' if r['installed'] else 'missing'})"
                for r in row["requires"]  # type: ignore[attr-defined]
            )
            or "nothing extra"
        )
        mark = "✓" if row["installed"] and row["wired"] else "✗"
        print(f"{mark} {row['name']}: {row['description']}")
        if not row["wired"]:
            print(f"    {row['provides']}")
        print(f"    needs: {needs}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from rollout.shared.interop.nemo_gym import serve as serve_gym

    spec = resolve_spec(args.env, args.slug)  # before importing openenv: a bad name fails fast
    # Bound here, not by uvicorn (which reports an address it cannot listen on as a log line
    # and exit status 3): a bad --host or a taken --port is an error naming them.
    sock = bind(args.host, args.port)

    def listening(url: str) -> None:
        print(f"serving {spec.slug} ({args.protocol}) on {url}  (Ctrl-C stops it)", flush=True)

    try:
        if args.protocol == "nemo-gym":
            serve_gym(spec, sock, listening)
            return 0
        from rollout.shared.interop.openenv_server import serve

        serve(spec, sock, listening)
    finally:
        sock.close()
    return 0


def _export_verifiers(args: argparse.Namespace) -> int:
    from rollout.shared.interop.verifiers_env import export_module

    path = export_module(resolve_spec(args.env, args.slug), args.out, args.name)
    print(path)
    return 0


def _art_export(args: argparse.Namespace) -> int:
    import asyncio

    from rollout.client import AsyncClient
    from rollout.shared.interop.art import export_run, write_groups

    check_groups_out(Path(args.out))  # before anything is asked of the platform

    async def run() -> list:
        client = AsyncClient(settings=client_settings_or_error())
        try:
            return await export_run(client, args.run)
        finally:
            await client.close()

    groups = asyncio.run(run())
    path = write_groups(groups, args.out)
    print(
        f"{len(groups)} trajectory group(s), {sum(len(g) for g in groups)} trajectories -> {path}"
    )
    return 0


def check_groups_out(out: Path) -> None:
    """Refuse an `art export -o` that is a folder, a link or a file of the user's own."""
    from rollout.shared.interop.art import is_earlier_groups
    from rollout.snapshots import check_out_file

    what = "art export writes one JSONL file"
    check_out_file(out, "-o", "art export", is_earlier_groups, what=what)


def _art_import(args: argparse.Namespace) -> int:
    from rollout.snapshots import check_out_folder, holds_exactly, replace_folder

    if args.env:
        return _art_import_run(args)

    from rollout.shared.interop.art import (
        ART_IMPORT_FILES,
        from_trajectory_groups,
        read_groups,
        training_sets,
    )

    out, source = Path(args.out), Path(args.file)
    earlier = holds_exactly(ART_IMPORT_FILES)  # what an earlier `art import -o` wrote
    check_out_folder(out, "-o", "art import", earlier, inputs=[source], new="sets")
    rollouts = from_trajectory_groups(read_groups(args.file), args.pass_at)
    sets = training_sets(rollouts, args.min_margin)
    replace_folder(out, {"rollouts": rollouts, **sets}, "art import", earlier, inputs=[source])
    counts = ", ".join(f"{len(rows)} {name}" for name, rows in sets.items())
    print(f"{len(rollouts)} rollouts imported -> {out} ({counts})")
    return 0


def _art_import_run(args: argparse.Namespace) -> int:
    import asyncio

    from rollout.client import AsyncClient
    from rollout.shared.interop.art import import_run

    async def run() -> dict:
        client = AsyncClient(settings=client_settings_or_error())
        try:
            return await import_run(
                client,
                args.file,
                args.env,
                env_version=args.env_version,
                model=args.model,
                name=args.name,
                pass_at=args.pass_at,
            )
        finally:
            await client.close()

    result = asyncio.run(run())
    if args.json:
        print_json(result)
    else:
        again = " (already imported: nothing recorded twice)" if result["duplicate"] else ""
        print(
            f"run {result['runId']}: {result['rollouts']} rollouts of {result['envSlug']} "
            f"v{result['envVersion']} imported{again}"
        )
        print(f"  train on it: rollout improve --run {result['runId']} --model MODEL")
    return 0
