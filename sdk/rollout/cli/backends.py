"""`rollout backends list` and `rollout env serve`: the rollout backends and OpenEnv serving."""

from __future__ import annotations

import argparse

from rollout.cli._common import print_json


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
    serve.add_argument("--port", type=int, default=8000)
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


def _list(args: argparse.Namespace) -> int:
    from rollout.shared.interop.backends import describe

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
    from rollout.shared.interop.specs import resolve_spec

    spec = resolve_spec(args.env, args.slug)  # before importing openenv: a bad name fails fast
    from rollout.shared.interop.openenv_server import serve

    serve(spec, host=args.host, port=args.port)
    return 0


def _export_verifiers(args: argparse.Namespace) -> int:
    from rollout.shared.interop.specs import resolve_spec
    from rollout.shared.interop.verifiers_env import export_module

    path = export_module(resolve_spec(args.env, args.slug), args.out, args.name)
    print(path)
    return 0
