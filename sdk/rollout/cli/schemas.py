"""`rollout schemas export`: regenerate schemas/ and docs/asyncapi.json from the models."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollout.errors import RolloutError
from rollout.services.catalog import asyncapi_document
from rollout.shared.contracts.export import stale_schemas, write_schemas


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `schemas` verbs."""
    schemas = sub.add_parser(
        "schemas", help="JSON Schema and AsyncAPI generated from the contracts"
    )
    verbs = schemas.add_subparsers(dest="schemas_command", metavar="SCHEMAS_COMMAND")
    export = verbs.add_parser("export", help="write schemas/ and docs/asyncapi.json")
    export.add_argument("--dir", type=Path, default=Path("schemas"), help="schemas folder")
    export.add_argument("--asyncapi", type=Path, default=Path("docs/asyncapi.json"))
    export.add_argument("--check", action="store_true", help="fail if the files are stale")
    export.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    if args.check:
        problems = stale_schemas(args.dir)
        if args.asyncapi.exists() and args.asyncapi.read_text() != asyncapi_document():
            problems.append(f"{args.asyncapi}: differs from the services' handlers")
        if problems:
            raise RolloutError(
                "generated files are stale; run `rollout schemas export`", problems=problems
            )
        print("schemas are up to date")
        return 0
    written = write_schemas(args.dir)
    args.asyncapi.parent.mkdir(parents=True, exist_ok=True)
    args.asyncapi.write_text(asyncapi_document())
    print(f"wrote {len(written)} schemas to {args.dir}/ and {args.asyncapi}")
    return 0
