"""How long `rollout` takes to start: wall time of typical verbs, against a bare interpreter.

Each invocation runs N times as a subprocess (median wall time); its ratio is against
`python -c pass` measured in the same run, so numbers from a busy machine still compare. The
verbs need no stack: help, local validation of an example env, and verbs that fail fast
because nothing is running (a fresh ROLLOUT_HOME and config folder, no endpoint or key).

    python benchmarks/cli_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "refund_agent.py"

VERBS: list[list[str]] = [
    ["--help"],
    ["runs", "--help"],
    ["improve", "--help"],
    ["audit", "--help"],
    ["serve-model", "--help"],
    ["plan", str(EXAMPLE)],
    ["whoami"],
    ["status"],
]


def rollout_command() -> list[str]:
    """The console script next to this interpreter, else `python -m rollout.cli`."""
    script = Path(sys.executable).parent / "rollout"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rollout.cli"]


def median_s(command: list[str], env: dict[str, str], runs: int) -> float:
    """Median wall time of `command` over `runs` runs (its output thrown away)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    """Print each invocation's median wall time and its ratio to a bare interpreter start."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each invocation (7)")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    # No stack, no saved login, no endpoint: the server verbs fail fast, as on a fresh machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
    env.update(
        ROLLOUT_HOME=str(home / "rollout"),
        XDG_CONFIG_HOME=str(home / "config"),
        ROLLOUT_SMOLLM2_WHEEL=os.environ.get("ROLLOUT_SMOLLM2_WHEEL", ""),
    )
    try:
        bare = median_s([sys.executable, "-c", "pass"], env, args.runs)
        print(f"{'python -c pass':40} {bare * 1000:7.0f} ms   1.0x")
        rollout = rollout_command()
        for verb in VERBS:
            took = median_s([*rollout, *verb], env, args.runs)
            shown = " ".join(["rollout", *(Path(v).name if "/" in v else v for v in verb)])
            print(f"{shown:40} {took * 1000:7.0f} ms {took / bare:6.1f}x")
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
