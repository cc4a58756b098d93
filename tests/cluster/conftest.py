"""Cluster tests: `rollout` against a private home (the stack tests' helpers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from stack.conftest import Cli, stack_env

from rollout.shared.stack.supervisor import down


@pytest.fixture
def cli(stack_home: Path) -> Iterator[Cli]:
    """`rollout` against a fresh home; whatever the test started is stopped afterwards."""
    yield Cli(home=stack_home, env=stack_env(stack_home))
    down(stack_home, timeout=30)
