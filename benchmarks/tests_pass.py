"""tests_pass cost: the isolated hidden-test run against the old exit-code run of pytest.

Both run the same fixed code and the same tests in the bubblewrap sandbox, in this process:
the baseline is `python -m pytest` in the work dir with the tests laid over the model's files
(what tests_pass did before); the hidden run is `run_hidden_tests` (private tests, pinned
config, no plugin autoload, JUnit report and completion probe). Prints seconds per run and the
ratio.

    python benchmarks/tests_pass.py [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from rollout.shared.envs.templates.code_editing import run_hidden_tests, run_tests_in_sandbox
from rollout.shared.observability import configure_logging

FIXED = "def add(a, b):\n    return a + b\n"
TESTS = {
    "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "test_hidden.py": (
        "import pytest\n\nfrom calc import add\n\n\n"
        '@pytest.mark.parametrize("a,b", [(1, 2), (3, 4)])\n'
        "def test_param(a, b):\n    assert add(a, b) == a + b\n"
    ),
}


async def main(runs: int) -> None:
    """Time both ways `runs` times each and print the means and their ratio."""
    await run_hidden_tests({"calc.py": FIXED}, TESTS)  # warm the sandbox probe
    started = time.monotonic()
    for _ in range(runs):
        old = await run_tests_in_sandbox({"calc.py": FIXED, **TESTS}, None)
        assert old["passed"], old
    baseline = (time.monotonic() - started) / runs
    started = time.monotonic()
    for _ in range(runs):
        new = await run_hidden_tests({"calc.py": FIXED}, TESTS)
        assert new.passed, new.reason
    hidden = (time.monotonic() - started) / runs
    print(f"exit-code pytest run (baseline): {baseline:.3f} s/run")
    print(f"isolated hidden-test run:        {hidden:.3f} s/run")
    print(f"ratio hidden/baseline:           {hidden / baseline:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    configure_logging("benchmark", level="warning")
    asyncio.run(main(parser.parse_args().runs))
