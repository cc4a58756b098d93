"""Logging on a full disk: a line that cannot be written is lost, never raised."""

from __future__ import annotations

import contextlib
import sys

import pytest

from rollout.shared.observability import _StderrLogger


def test_a_log_line_a_full_disk_refuses_is_lost_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    # A service logs to a file under ROLLOUT_HOME/logs. On a full disk that write fails, and the
    # code that logged (a retry loop, the supervisor restarting a service) must go on, as it
    # does with the standard library's handlers. /dev/full refuses every write as such a disk.
    full = open("/dev/full", "w")  # noqa: SIM115 (closed below, where its flush fails too)
    try:
        monkeypatch.setattr(sys, "stderr", full)
        _StderrLogger().warning("projection failed; retrying")
    finally:
        with contextlib.suppress(OSError):
            full.close()
