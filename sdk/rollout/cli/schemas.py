"""`rollout schemas export`: regenerate schemas/ and docs/asyncapi.json from the models."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollout.errors import RolloutError


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


def _check_paths(folder: Path, asyncapi: Path) -> None:
    """Refuse a --dir that is not a folder or an --asyncapi that is one, before writing."""
    if folder.exists() and not folder.is_dir():
        raise RolloutError(f"--dir {folder}: is a file, not a folder (the schemas go under it)")
    if asyncapi.is_dir():
        raise RolloutError(f"--asyncapi {asyncapi}: is a folder; name the JSON file to write")


def _export(args: argparse.Namespace) -> int:
    from rollout.services.catalog import asyncapi_document
    from rollout.shared.contracts.export import stale_schemas, write_schemas

    _check_paths(args.dir, args.asyncapi)
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
    try:
        written = write_schemas(args.dir)
        args.asyncapi.parent.mkdir(parents=True, exist_ok=True)
        args.asyncapi.write_text(asyncapi_document())
    except OSError as exc:
        # e.g. a file where a parent folder should be, or no permission to write there.
        raise RolloutError(f"cannot write {exc.filename}: {exc.strerror or exc}") from None
    print(f"wrote {len(written)} schemas to {args.dir}/ and {args.asyncapi}")
    return 0
