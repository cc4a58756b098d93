"""Tests wait on conditions through one helper (tests/waiting.py), never a hand-written poll loop."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# Loops that sleep on purpose, not to wait for something: what they do, and why.
NOT_WAITING = {
    # A ticker measuring that the event loop stays free (a plugin host's work; others use
    # waiting.ticks_during).
    "plugin_host/test_plugin_host_lifecycle.py",
    # A sampler counting the sandbox's processes while it runs.
    "sandbox/test_sandbox_limits.py",
}


def _sleeps(node: ast.AST) -> bool:
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            owner = call.func.value
            if call.func.attr == "sleep" and isinstance(owner, ast.Name):
                if owner.id in ("asyncio", "time"):
                    return True
    return False


def poll_loops(folder: Path = TESTS) -> list[str]:
    """`file:line` of every while loop that sleeps between two looks, outside waiting.py."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).as_posix()
        if rel == "waiting.py" or rel in NOT_WAITING:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.While) and _sleeps(node):
                found.append(f"{rel}:{node.lineno}")
    return found


def test_no_hand_written_poll_loops() -> None:
    assert poll_loops() == [], "wait with waiting.wait_until / wait_until_sync instead"


def test_the_check_finds_a_poll_loop(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import asyncio\n\nasync def f(done):\n    while not done():\n        await asyncio.sleep(0.1)\n"
    )
    assert poll_loops(tmp_path) == ["test_x.py:4"]
