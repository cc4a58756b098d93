"""Fuzz environment specs: mutate every example env, validate it as `rollout plan` does.

Usage: python benchmarks/env_fuzz.py [--n 5000] [--seed 1] [--tests] [--show 20]

Each mutant (tests/envs/env_mutants.py) must be accepted and then start, run its tools and be
scored without a primitive or tool failing, or be refused with problems that each name a field
path; anything else is a finding, counted by kind. `--tests` also scores code-editing mutants
(tests_pass runs the sandbox: slower).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from envs.env_mutants import judge, mutants  # noqa: E402


def _kind(fault: str) -> str:
    """A fault without its specifics, to count findings by class."""
    return re.sub(r"'[^']*'|\d+", "_", fault)[:120]


def main() -> int:
    """Run the fuzz; print counts and the first faults of each kind."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tests", action="store_true", help="score code-editing too (sandbox)")
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
    return 1 if kinds else 0


if __name__ == "__main__":
    sys.exit(main())
