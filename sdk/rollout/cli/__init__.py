"""The `rollout` command: one verb per module, each exposing `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rollout import printable
from rollout.cli._common import VerbParser
from rollout.errors import RolloutError

# Each module registers its own verbs; the order is the order in `rollout --help`.
COMMAND_MODULES = [
    "rollout.cli.stack",
    "rollout.cli.auth",
    "rollout.cli.envtools",
    "rollout.cli.localtest",
    "rollout.cli.audit",
    "rollout.cli.platform",
    "rollout.cli.training",
    "rollout.cli.datasets",
    "rollout.cli.models",
    "rollout.cli.serve_model",
    "rollout.cli.demo",
    "rollout.cli.events",
    "rollout.cli.replay",
    "rollout.cli.ui",
    "rollout.cli.admin",
    "rollout.cli.schemas",
    "rollout.cli.backends",
]


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every registered verb."""
    parser = VerbParser(
        prog="rollout",
        description="Agent environments, rollouts, verifiers and post-training on one event log.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # A verb module still being written must not break the others.
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rollout` console script."""
    # Every verb logs to stderr, warnings and up, so stdout stays clean for --json;
    # `serve` and `up --foreground` reconfigure for a long-running service.
    printable.install()  # first: the loggers take the wrapped stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # Only now, so that `--help` and a mistyped verb do not import structlog (and rich).
    from rollout.shared.observability import configure_logging

    configure_logging("cli", level=os.environ.get("ROLLOUT_LOG_LEVEL") or "WARNING")
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, so a reader that went away is caught below
    except RolloutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`rollout runs --json | head`): stop quietly, and point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
