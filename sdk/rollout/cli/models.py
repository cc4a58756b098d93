"""`rollout models list` and `rollout models pull NAME`: the local models and their weights."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from rollout.cli._common import print_json
from rollout.errors import RolloutError
from rollout.printable import raw_stderr, shown


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `models` verb."""
    p = sub.add_parser("models", help="local models: list them, prepare (pull) their weights")
    verbs = p.add_subparsers(dest="models_command", metavar="SUBCOMMAND")

    q = verbs.add_parser("list", help="local models and whether they are prepared")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_list)

    q = verbs.add_parser("pull", help="prepare a local model's weights (downloads when needed)")
    q.add_argument("name", metavar="NAME", help="e.g. local/smollm2-135m")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_pull)

    p.set_defaults(func=lambda a: _help(p))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _rows() -> list[dict[str, Any]]:
    from rollout.shared.models.catalog import folder_size, local_models

    rows = []
    for model in local_models():
        directory = model.directory()
        prepared = model.prepared()
        rows.append(
            {
                "name": model.name,
                "prepared": prepared,
                "path": str(directory),
                "size_bytes": folder_size(directory) if prepared else 0,
                "description": model.description,
            }
        )
    return rows


def _list(args: argparse.Namespace) -> int:
    rows = _rows()
    if args.json:
        print_json(rows)
        return 0
    width = max(len(r["name"]) for r in rows)
    for row in rows:
        state = f"prepared  {_size(row['size_bytes']):>8}  {row['path']}"
        if not row["prepared"]:
            state = f"not prepared (rollout models pull {row['name']})"
        print(f"{row['name']:<{width}}  {state}")
        print(f"{'':<{width}}  {row['description']}")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class _Bar:
    """A one-line stage progress bar on stderr (plain lines when not a terminal)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()

    def __call__(self, stage: str, done: int, total: int) -> None:
        total = max(total, 1)
        filled = int(24 * done / total)
        elapsed = time.monotonic() - self.started
        line = f"{self.name} [{'#' * filled}{'.' * (24 - filled)}] {done}/{total} {stage} "
        line += f"({elapsed:.0f}s)"
        if self.tty:
            err = raw_stderr()  # our own line control; the stage name is ours too
            err.write("\r\033[K" + shown(line) + ("\n" if done >= total else ""))
            err.flush()
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


def _pull(args: argparse.Namespace) -> int:
    from rollout.shared.models.catalog import folder_size, local_model, local_model_names

    model = local_model(args.name)
    if model is None:
        raise RolloutError(
            f"unknown local model {args.name!r}",
            problems=[f"local models: {', '.join(local_model_names())}"],
        )
    was = model.prepared()
    started = time.monotonic()
    directory = model.prepare(None if was or args.json else _Bar(model.name))
    result = {
        "name": model.name,
        "path": str(directory),
        "size_bytes": folder_size(directory),
        "already_prepared": was,
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.json:
        print_json(result)
    elif was:
        print(f"{model.name} is prepared at {directory}")
    else:
        print(f"{model.name} ready at {directory} ({_size(result['size_bytes'])}, "
              f"{result['seconds']}s)")  # fmt: skip
    return 0
