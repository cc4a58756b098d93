"""tests_pass cost: the hidden-test runs against the old exit-code run of pytest.

All run the same fixed code and the same tests in the bubblewrap sandbox, in this process:
the baseline is `python -m pytest` in the work dir with the tests laid over the model's files
(what tests_pass did first); `in-process` is `run_hidden_tests(isolate=False)` (private tests,
pinned config, no plugin autoload, JUnit report and completion probe, the model's code imported
into the tests' process); `process` (the default) also runs the model's code in a second sandbox
reached through proxies. A second pair times a test that makes 2,000 calls into the model's
code, so the cost per proxied call shows. Prints seconds per run and the ratios.

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
CALLS = 2_000
CHATTY = {
    "test_many.py": (
        "from calc import add\n\n\ndef test_many():\n"
        f"    assert sum(add(i, 1) for i in range({CALLS})) == {sum(i + 1 for i in range(CALLS))}\n"
    )
}


async def _time(runs: int, fn: object) -> float:
    started = time.monotonic()
    for _ in range(runs):
        await fn()  # type: ignore[operator]
    return (time.monotonic() - started) / runs


async def _hidden(tests: dict[str, str], isolate: bool) -> None:
    run = await run_hidden_tests({"calc.py": FIXED}, tests, isolate=isolate)
    assert run.passed, run.reason


async def _exit_code() -> None:
    old = await run_tests_in_sandbox({"calc.py": FIXED, **TESTS}, None)
    assert old["passed"], old


async def main(runs: int) -> None:
    """Time each way `runs` times and print the means and their ratios."""
    await run_hidden_tests({"calc.py": FIXED}, TESTS)  # warm the sandbox probe
    baseline = await _time(runs, _exit_code)
    in_process = await _time(runs, lambda: _hidden(TESTS, False))
    isolated = await _time(runs, lambda: _hidden(TESTS, True))
    print(f"exit-code pytest run (baseline):  {baseline:.3f} s/run")
    print(f"hidden run, in-process:           {in_process:.3f} s/run")
    print(f"hidden run, process (default):    {isolated:.3f} s/run")
    print(f"ratio in-process/baseline:        {in_process / baseline:.2f}")
    print(f"ratio process/baseline:           {isolated / baseline:.2f}")
    print(f"ratio process/in-process:         {isolated / in_process:.2f}")
    chatty_in = await _time(runs, lambda: _hidden(CHATTY, False))
    chatty_iso = await _time(runs, lambda: _hidden(CHATTY, True))
    per_call = (chatty_iso - chatty_in) / CALLS * 1e6
    print(f"{CALLS} calls, in-process:          {chatty_in:.3f} s/run")
    print(f"{CALLS} calls, process:             {chatty_iso:.3f} s/run")
    print(f"ratio process/in-process:         {chatty_iso / chatty_in:.2f}")
    print(f"cost per proxied call:            {per_call:.0f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    configure_logging("benchmark", level="warning")
    asyncio.run(main(parser.parse_args().runs))
