"""Fuzz environment specs: mutate every example env, validate it as `rollout plan` does.

Usage: python benchmarks/env_fuzz.py [--n 5000] [--seed 1] [--tests] [--cli 300] [--show 20]

Each mutant (tests/envs/env_mutants.py) must be accepted and then start, run its tools and be
scored without a primitive or tool failing, or be refused with problems that each name a field
path; anything else is a finding, counted by kind. `--tests` also scores code-editing mutants
(tests_pass runs the sandbox: slower). `--cli N` also writes N mutants as env files
(Environment(**spec)) and runs `rollout plan FILE --json` on each, in this process.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from envs.env_mutants import ENV_ARGUMENTS, env_file, judge, mutants, plan_faults  # noqa: E402

from rollout.cli import main as cli_main  # noqa: E402


def _kind(fault: str) -> str:
    """A fault without its specifics, to count findings by class."""
    return re.sub(r"'[^']*'|\d+", "_", fault)[:120]


def main() -> int:
    """Run the fuzz; print counts and the first faults of each kind."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tests", action="store_true", help="score code-editing too (sandbox)")
    parser.add_argument("--cli", type=int, default=0, help="mutants run through `rollout plan`")
    parser.add_argument("--show", type=int, default=3, help="examples shown per kind")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    started = time.monotonic()
    accepted = refused = 0
    kinds: Counter[str] = Counter()
    shown: dict[str, list[str]] = {}
    by_mutation: Counter[str] = Counter()
    for label, raw in mutants(args.seed, args.n):
        ok, _, faults = judge(raw, tests=args.tests)
        accepted += ok
        refused += not ok
        for fault in faults:
            kind = _kind(fault)
            kinds[kind] += 1
            by_mutation[label.split(":", 1)[1]] += 1
            if len(shown.setdefault(kind, [])) < args.show:
                shown[kind].append(f"{label}: {fault}")
    seconds = time.monotonic() - started
    print(f"{args.n} mutants (seed {args.seed}) in {seconds:.1f}s: {accepted} accepted, "
          f"{refused} refused, {sum(kinds.values())} faults of {len(kinds)} kinds")  # fmt: skip
    for kind, count in kinds.most_common():
        print(f"\n[{count}] {kind}")
        for line in shown[kind]:
            print(f"    {line[:400]}")
    if by_mutation:
        print("\nfaults by mutation:", dict(by_mutation.most_common(20)))
    cli_faults = _through_cli(args.cli, args.seed) if args.cli else 0
    return 1 if kinds or cli_faults else 0


def _through_cli(n: int, seed: int) -> int:
    """`rollout plan FILE --json` on `n` mutants written as env files; its faults, printed."""
    started = time.monotonic()
    runs = loaded = 0
    faults: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        for i, (label, raw) in enumerate(mutants(seed + 1000, n)):
            if not isinstance(raw, dict) or set(raw) - ENV_ARGUMENTS:
                continue
            file = env_file(Path(folder), f"m{i}", raw)
            if file is None:
                continue
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                code = cli_main(["plan", str(file), "--json"])
            runs += 1
            try:
                doc = json.loads(out.getvalue())
            except ValueError:
                faults.append(f"{label}: exit {code}, not a JSON document: {out.getvalue()[:200]}")
                continue
            loaded += "error" not in doc
            faults += [f"{label}: {f}" for f in plan_faults(doc, file, raw)]
    print(f"\nrollout plan FILE --json on {runs} env files ({loaded} loaded) in "
          f"{time.monotonic() - started:.1f}s: {len(faults)} faults")  # fmt: skip
    for fault in faults[:20]:
        print(f"    {fault[:400]}")
    return len(faults)


if __name__ == "__main__":
    sys.exit(main())
